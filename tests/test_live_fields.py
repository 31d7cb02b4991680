"""Live servers that are not vLLM: one that refuses everything, one that refuses the client's optional fields,
one that coalesces its frames and sends usage only at the end (as ``transformers serve`` does).

Each is a small aiohttp app on 127.0.0.1 (a free port), so these run in the kit's default test run.
"""

from __future__ import annotations

import json
from typing import Any, Callable, Iterator

import pytest

web = pytest.importorskip("aiohttp.web", reason="the live tests need the live extra: pip install 'pytest-cbatch[live]'")

from pytest_cbatch.contract import CLAIMS, check_report  # noqa: E402
from pytest_cbatch.impls import resolve_impl  # noqa: E402
from pytest_cbatch.live.server import ServerThread  # noqa: E402
from pytest_cbatch.runner import ALL_CLAUSES, Judge  # noqa: E402
from pytest_cbatch.workloads import BASE_CONFIG  # noqa: E402

MODEL = "fake-model"
OPTIONAL = ("ignore_eos", "return_token_ids")


class App:
    """An OpenAI-like app: ``handler(body) -> web response`` answers POST /v1/completions; ``bodies`` keeps
    every request body it received."""

    def __init__(self, handler: Callable[[dict[str, Any]], Any]) -> None:
        self.handler = handler
        self.bodies: list[dict[str, Any]] = []

    def app(self) -> Any:
        async def models(request: Any) -> Any:
            return web.json_response({"object": "list", "data": [{"id": MODEL, "object": "model"}]})

        async def completions(request: Any) -> Any:
            body = await request.json()
            self.bodies.append(body)
            return await self.handler(request, body)

        app = web.Application()
        app.router.add_get("/v1/models", models)
        app.router.add_post("/v1/completions", completions)
        return app


@pytest.fixture
def serve() -> Iterator[Callable[[App], str]]:
    running: list[ServerThread] = []

    def start(app: App) -> str:
        thread = ServerThread(app)   # any object with app() will do
        running.append(thread)
        return thread.__enter__()

    yield start
    for thread in running:
        thread.__exit__(None, None, None)


def _unexpected_fields(body: dict[str, Any]) -> Any:
    """transformers serve's answer to fields it does not know (HTTP 422), or None."""
    extra = [k for k in OPTIONAL if k in body] + \
        ["stream_options.continuous_usage_stats" for o in [body.get("stream_options") or {}]
         if "continuous_usage_stats" in o]
    if extra:
        return web.json_response({"detail": f"Unexpected fields in the request: {', '.join(extra)}"}, status=422)
    return None


async def _coalesced(request: Any, body: dict[str, Any], *, per_frame: int, stop_after: int | None = None) -> Any:
    """A text-only stream: ``per_frame`` tokens a frame, usage only in the last frame, no [DONE]; a prompt
    of two words asking for five tokens ends at an end-of-sequence token after ``stop_after`` tokens."""
    refused = _unexpected_fields(body)
    if refused is not None:
        return refused
    n = body["max_tokens"]
    reason = "length"
    if stop_after is not None and (len(str(body["prompt"]).split()), n) == (2, 5):
        n, reason = min(n, stop_after), "stop"
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    sent = 0
    while sent < n:
        k = min(per_frame, n - sent)
        sent += k
        choice: dict[str, Any] = {"index": 0, "text": " w" * k, "finish_reason": reason if sent == n else None}
        doc: dict[str, Any] = {"object": "text_completion", "choices": [choice]}
        if sent == n:
            doc["usage"] = {"prompt_tokens": 3, "completion_tokens": n, "total_tokens": 3 + n}
        await resp.write(f"data: {json.dumps(doc)}\n\n".encode())
    await resp.write_eof()
    return resp


TRACE = [{"time": 0, "event": "arrival", "id": "a", "prompt_tokens": 3, "output_tokens": 5},
         {"time": 2, "event": "arrival", "id": "b", "prompt_tokens": 4, "output_tokens": 1},
         {"time": 4, "event": "arrival", "id": "c", "prompt_tokens": 2, "output_tokens": 6}]


def _judge(url: str, trace: list[dict[str, Any]]) -> dict[str, Any]:
    judge = Judge(resolve_impl(url, tick_seconds=0.05, timeout=10))
    return {cid: judge.judge(cid, trace, BASE_CONFIG) for cid in ALL_CLAUSES if cid != "invalid_input_refused"}


def test_a_server_refusing_every_request_fails_completes_with_its_words(serve: Any) -> None:
    async def refuse(request: Any, body: dict[str, Any]) -> Any:
        return web.json_response({"detail": "Unexpected fields in the request: whatever"}, status=422)

    url = serve(App(refuse))
    results = _judge(url, TRACE)
    completes = results["completes"]
    assert completes.status == "fail", completes
    message = str(completes.violations[0])
    assert f"{url}/v1/completions" in message and "HTTP 422" in message and "Unexpected fields" in message
    assert "refused every request" in message
    assert not [cid for cid, r in results.items() if r.status == "pass"]


def test_one_refused_request_stays_rejected_with_its_reason(serve: Any) -> None:
    async def refuse_one(request: Any, body: dict[str, Any]) -> Any:
        if body["max_tokens"] == 1:
            return web.json_response({"error": {"message": "no room for b"}}, status=400)
        return await _coalesced(request, body, per_frame=1)

    report = resolve_impl(serve(App(refuse_one)), tick_seconds=0.05, timeout=10).run(TRACE, BASE_CONFIG).report
    row = report["requests"]["b"]
    assert row["status"] == "rejected" and row["http_status"] == 400 and "no room for b" in row["error"]
    assert report["requests"]["a"]["status"] == "finished"


def test_refused_optional_fields_are_dropped_once_and_remembered(serve: Any) -> None:
    app = App(lambda request, body: _coalesced(request, body, per_frame=1, stop_after=2))
    url = serve(app)
    trace = TRACE + [{"time": 6, "event": "arrival", "id": "eos", "prompt_tokens": 2, "output_tokens": 5}]
    results = _judge(url, trace)
    report = results["completes"].report
    assert report is not None
    with_optional = [b for b in app.bodies if any(k in b for k in OPTIONAL)]
    assert len(with_optional) == 1 and len(app.bodies) == len(trace) + 1   # one refusal, then never again
    assert report["server"]["ignore_eos"] is False
    assert any("ignore_eos" in note and "Unexpected fields" in note for note in report["server"]["notes"])
    # one token per frame, confirmed by the final usage: per-token events stay observable
    assert "token" in report["observed"] and report["requests"]["a"]["output_tokens"] == 5
    # 'eos' ended at an end-of-sequence token after 2 of 5: legitimate when ignore_eos could not be sent
    assert report["requests"]["eos"]["finish_reason"] == "stop" and report["requests"]["eos"]["output_tokens"] == 2
    assert results["finished_outputs_complete"].status == "pass"
    failed = {cid: r.violations for cid, r in results.items() if r.status == "fail"}
    assert not failed, failed
    # the same early end where ignore_eos was sent is a truncation
    forced = {**report, "server": {**report["server"], "ignore_eos": True}}
    found = check_report(forced, trace, BASE_CONFIG, honoured=CLAIMS)
    assert [v.clause for v in found] == ["finished_outputs_complete"]


def test_coalesced_frames_with_usage_only_at_the_end_count_from_usage(serve: Any) -> None:
    url = serve(App(lambda request, body: _coalesced(request, body, per_frame=3)))
    results = _judge(url, TRACE)
    report = results["completes"].report
    assert report is not None and "token" not in report["observed"]
    assert not [e for e in report["events"] if e["event"] == "token"]
    assert any("final usage" in note for note in report["server"]["notes"])
    a, b, c = (report["requests"][k] for k in "abc")
    assert (a["output_tokens"], b["output_tokens"], c["output_tokens"]) == (5, 1, 6)
    assert a["status"] == b["status"] == c["status"] == "finished"
    assert len(a["frame_times"]) == 2 and len(a["itl_ticks"]) == 1 and a["token_times"] == []
    assert a["ttft_ticks"] is not None and a["ttft_ticks"] > 0
    assert b["itl_ticks"] == [] and len(c["itl_ticks"]) == 1
    for cid in ("ttft_matches_tokens", "finished_outputs_complete", "usage_agrees", "no_duplicate_emission"):
        assert results[cid].status == "skip" and results[cid].unobservable, (cid, results[cid])
    for cid in ("completes", "schema_valid", "terminal_exactly_once", "arrival_matches_trace", "time_monotonic"):
        assert results[cid].status == "pass", (cid, results[cid])
    assert not [cid for cid, r in results.items() if r.status == "fail"]


def test_a_token_without_text_is_counted_from_usage(serve: Any) -> None:
    """A one-token stream whose token decodes to no text yet (a partial character): an empty finish frame
    with usage 1.  Nothing in the stream counts it, so per-token events are not observable."""
    async def silent(request: Any, body: dict[str, Any]) -> Any:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        doc = {"choices": [{"index": 0, "text": "", "finish_reason": "length"}],
               "usage": {"prompt_tokens": 1, "completion_tokens": body["max_tokens"], "total_tokens": 2}}
        await resp.write(f"data: {json.dumps(doc)}\n\n".encode())
        return resp

    trace = [{"time": 0, "event": "arrival", "id": "b", "prompt_tokens": 1, "output_tokens": 1}]
    results = _judge(serve(App(silent)), trace)
    report = results["completes"].report
    assert "token" not in report["observed"] and report["requests"]["b"]["output_tokens"] == 1
    assert not [cid for cid, r in results.items() if r.status == "fail"]
