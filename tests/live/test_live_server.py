"""The http:// implementation, the embedded server, broken servers, and error messages."""

from __future__ import annotations

import asyncio
import json
import socket
import time
import urllib.request
from typing import Any

import pytest
from aiohttp import web

from pytest_cbatch.impls import resolve_impl
from pytest_cbatch.live.server import OpenAIServer
from pytest_cbatch.reference.scheduler_sim import demo_trace
from pytest_cbatch.runner import ALL_CLAUSES, Judge
from pytest_cbatch.workloads import BASE_CONFIG

from .conftest import SLOW

CLIENT_CLAUSES = ("completes", "schema_valid", "config_recorded", "arrival_matches_trace", "time_monotonic",
                  "terminal_exactly_once", "no_event_after_terminal", "ttft_matches_tokens", "ttft_null_on_cancel",
                  "itl_empty_for_one_token", "itl_matches_tokens", "token_record_consistent",
                  "finished_outputs_complete", "no_duplicate_emission", "usage_agrees", "input_not_mutated")


def judge_all(url: str, trace: list[dict[str, Any]]) -> dict[str, Any]:
    judge = Judge(resolve_impl(url, tick_seconds=0.05, timeout=20))
    return {cid: judge.judge(cid, trace, BASE_CONFIG) for cid in ALL_CLAUSES if cid != "invalid_input_refused"}


def test_http_impl_passes_client_clauses_on_the_demo_trace(slow_url: str) -> None:
    results = judge_all(slow_url, demo_trace())
    ran = {cid for cid, r in results.items() if r.status != "skip"}
    assert set(CLIENT_CLAUSES) <= ran, sorted(set(CLIENT_CLAUSES) - ran)
    failed = {cid: [str(v) for v in r.violations] for cid, r in results.items() if r.status == "fail"}
    assert not failed
    report = results["completes"].report
    assert report["time_unit"] == "seconds" and report["config"]["tick_seconds"] == 0.05
    cancel = next(e for e in report["events"] if e["event"].startswith("cancel"))
    assert cancel["id"] == "cancel-me" and cancel["time"] >= 0.10     # never before its moment, tick 2
    long = report["requests"]["long"]
    assert long["output_tokens"] == long["usage_completion_tokens"] == 4
    # one ITL entry per frame: a writer that fell behind may have put two tokens in one
    assert len(long["itl_ticks"]) == len(set(long["token_times"])) - 1


class NeverStarts(OpenAIServer):
    """Accepts every stream and sends nothing until its client goes away (a request stuck in a queue)."""

    async def _stream(self, request: Any, req: Any, job: Any, rid: str) -> Any:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        while await self._wait(request, job):
            pass
        return resp


def test_a_cancel_before_the_first_token_has_no_ttft(serve: Any) -> None:
    from pytest_cbatch.contract import CLAIMS, check_report

    url = serve(server_class=NeverStarts, tick_ms=5)
    trace = [{"time": 0, "event": "arrival", "id": "r", "prompt_tokens": 2, "output_tokens": 3},
             {"time": 2, "event": "cancel", "id": "r"}]
    report = resolve_impl(url, tick_seconds=0.05).run(trace, BASE_CONFIG).report
    row = report["requests"]["r"]
    assert row["status"] == "cancelled" and row["ttft_ticks"] is None and row["token_times"] == [], row
    assert [e["event"] for e in report["events"]] == ["arrival", "cancelled"]
    assert check_report(report, trace, BASE_CONFIG, honoured=CLAIMS) == []


def test_pytest_run_against_the_embedded_server(pytester: pytest.Pytester, slow_url: str) -> None:
    from pytest_cbatch.plugin import suite_dir

    result = pytester.runpytest(str(suite_dir() / "test_contract.py"), f"--cbatch-impl={slow_url}",
                                "-k", "test_contract and demo and not serial", "-p", "no:cacheprovider", "-q")
    outcomes = result.parseoutcomes()
    assert outcomes.get("passed", 0) >= len(CLIENT_CLAUSES) - 2 and not outcomes.get("failed"), result.stdout.str()
    result.stdout.fnmatch_lines(["*pytest-cbatch*", "*contract clauses selected*"])


def test_broken_server_sending_a_token_twice_fails_its_clauses(serve: Any) -> None:
    from pytest_cbatch.examples.live.broken_servers import DuplicateTokenServer

    url = serve(server_class=DuplicateTokenServer, **SLOW)
    results = judge_all(url, demo_trace())
    failed = {cid for cid, r in results.items() if r.status == "fail"}
    assert {"no_duplicate_emission", "finished_outputs_complete", "usage_agrees"} <= failed, failed
    messages = [str(v) for v in results["no_duplicate_emission"].violations]
    assert any("repeats an index" in m and "'long'" in m for m in messages), messages


def test_broken_server_inventing_a_first_token_is_caught(serve: Any) -> None:
    from pytest_cbatch.examples.live.broken_servers import InventedTokenServer

    url = serve(server_class=InventedTokenServer, **SLOW)
    results = judge_all(url, demo_trace())
    report = results["completes"].report
    # a request run to its end shows the invented token as one more output ...
    assert report["requests"]["long"]["output_tokens"] == 5
    # ... and the server's own running count numbers its first real token 1 again
    assert results["no_duplicate_emission"].status == "fail"


def _get(url: str) -> tuple[int, str, str]:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return resp.status, resp.headers.get("Content-Type", ""), resp.read().decode()


def _post(url: str, body: dict[str, Any]) -> Any:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=20) as resp:
        return resp.headers.get("Content-Type", ""), resp.read().decode()


def test_endpoints_chat_whole_bodies_and_metrics(serve: Any) -> None:
    url = serve(tick_ms=5)
    assert _get(url + "/health")[0] == 200
    model = json.loads(_get(url + "/v1/models")[2])["data"][0]["id"]
    ctype, body = _post(url + "/v1/chat/completions", {"model": model, "max_tokens": 3, "logprobs": True,
                                                       "messages": [{"role": "user", "content": "1 2 3"}]})
    doc = json.loads(body)
    assert doc["usage"] == {"prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6}
    assert len(doc["choices"][0]["logprobs"]["content"]) == 3
    ctype, body = _post(url + "/v1/chat/completions", {"model": model, "max_tokens": 2, "stream": True,
                                                       "messages": [{"role": "user", "content": "4 5"}]})
    assert "text/event-stream" in ctype and body.rstrip().endswith("data: [DONE]")
    assert json.loads(body.split("\n\n")[0][6:])["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    _, _, text = _get(url + "/metrics")
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                 "vllm:num_preemptions_total", "vllm:time_to_first_token_seconds_count",
                 "vllm:inter_token_latency_seconds_bucket", "vllm:iteration_tokens_total_sum"):
        assert name in text, name
    assert 'vllm:time_to_first_token_seconds_count{model_name="%s"} 2' % model in text


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unreachable_server_is_one_clear_refusal() -> None:
    url = f"http://127.0.0.1:{_free_port()}"
    out = resolve_impl(url, timeout=5).run(demo_trace(), BASE_CONFIG)
    assert out.report is None and out.refused and url in out.refused and "cannot reach" in out.refused


def test_http_error_and_malformed_streams_name_the_url(serve: Any) -> None:
    class Garbage(OpenAIServer):
        async def completions(self, request: Any) -> Any:
            body = await request.json()
            if body["max_tokens"] == 1:
                return web.Response(text="data: {oops\n\n", content_type="text/event-stream")
            return web.json_response({"plain": "json"})

    url = serve(server_class=Garbage, tick_ms=5)
    trace = [{"time": 0, "event": "arrival", "id": "a", "prompt_tokens": 2, "output_tokens": 1},
             {"time": 0, "event": "arrival", "id": "b", "prompt_tokens": 2, "output_tokens": 2}]
    report = resolve_impl(url, timeout=60).run(trace, BASE_CONFIG).report
    a, b = report["requests"]["a"], report["requests"]["b"]
    assert a["status"] == b["status"] == "rejected"
    assert a["error"].startswith(url) and "malformed stream: data frame is not JSON" in a["error"]
    assert "not an event stream" in b["error"]
    good = serve(**SLOW)
    big = [{"time": 0, "event": "arrival", "id": "huge", "prompt_tokens": 300, "output_tokens": 4}]
    row = resolve_impl(good, timeout=60).run(big, BASE_CONFIG).report["requests"]["huge"]
    assert row["status"] == "rejected" and "HTTP 400" in row["error"] and "never fit" in row["error"]


def test_optimistic_workloads_are_unsupported_and_invalid_traces_refused(slow_url: str) -> None:
    impl = resolve_impl(slow_url)
    assert "preempt" in impl.unsupported_reason({**BASE_CONFIG, "admission": "optimistic"})
    bad = [{"time": 0, "event": "cancel", "id": "ghost"}]
    assert "ghost" in impl.run(bad, BASE_CONFIG).refused


def test_a_cancel_after_the_finish_frame_is_ignored(serve: Any) -> None:
    """vLLM sends finish_reason with the last token, then the usage frame and [DONE]: a cancel landing in
    between comes too late to cancel anything (the request finished with all its tokens)."""
    from pytest_cbatch.contract import CLAIMS, check_report

    class LateDone(OpenAIServer):
        async def send(self, resp: Any, frame: dict[str, Any]) -> None:
            if not frame.get("choices"):
                await asyncio.sleep(3.0)    # the usage frame (and [DONE]) 3 s after the finish frame
            await super().send(resp, frame)

    url = serve(server_class=LateDone, tick_ms=5)
    # The cancel, 1 s after the arrival, falls between the finish frame (two 5 ms server ticks after
    # it) and the usage frame (3 s later): about a second of margin before it, two after.
    trace = [{"time": 0, "event": "arrival", "id": "r", "prompt_tokens": 2, "output_tokens": 2},
             {"time": 20, "event": "cancel", "id": "r"}]
    report = resolve_impl(url, tick_seconds=0.05).run(trace, BASE_CONFIG).report
    ignored = next(e for e in report["events"] if e["event"].startswith("cancel"))
    assert ignored["event"] == "cancel_ignored" and ignored["status"] == "finished", ignored
    assert report["requests"]["r"]["status"] == "finished" and report["requests"]["r"]["output_tokens"] == 2
    assert check_report(report, trace, BASE_CONFIG, honoured=CLAIMS) == []


class StallingClock:
    """Stands in for the replay's ``time``: from the ``since``-th reading on, each reading jumps ``jump`` s
    further ahead, as if the client had been starved that long between two lines of the trace."""

    def __init__(self, since: int, jump: float, until: int | None = None) -> None:
        self.since, self.jump, self.until = since, jump, until
        self.readings, self.offset = 0, 0.0

    def perf_counter(self) -> float:
        self.readings += 1
        if self.readings >= self.since and (self.until is None or self.readings < self.until):
            self.offset += self.jump
        return time.perf_counter() + self.offset


TWO_LINES = [{"time": 0, "event": "arrival", "id": "a", "prompt_tokens": 2, "output_tokens": 2},
             {"time": 1, "event": "arrival", "id": "b", "prompt_tokens": 2, "output_tokens": 1}]


def test_a_replay_whose_client_fell_behind_is_replayed(serve: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from pytest_cbatch.contract import CLAIMS, check_report
    from pytest_cbatch.live import replay

    # the first run's second reading comes 30 s late: that run is void, the second keeps the schedule
    clock = StallingClock(since=2, jump=30.0, until=3)
    monkeypatch.setattr(replay, "time", clock)
    report = resolve_impl(serve(**SLOW), tick_seconds=0.05).run(TWO_LINES, BASE_CONFIG).report
    assert report is not None and check_report(report, TWO_LINES, BASE_CONFIG, honoured=CLAIMS) == []
    assert [r["status"] for r in report["requests"].values()] == ["finished", "finished"]


def test_a_client_that_never_keeps_the_schedule_is_one_clear_refusal(serve: Any,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from pytest_cbatch.live import replay

    monkeypatch.setattr(replay, "time", StallingClock(since=2, jump=30.0))
    out = resolve_impl(serve(**SLOW), tick_seconds=0.05).run(TWO_LINES, BASE_CONFIG)
    assert out.report is None and "the client fell behind the trace's schedule by" in out.refused, out
    assert "in 3 tries (the contract allows 1 s)" in out.refused and "--cbatch-tick-seconds" in out.refused
