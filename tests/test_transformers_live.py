"""``transformers serve --continuous-batching`` through the kit's live client, and what happens to a request
whose client disconnects (streamed: cancelled; non-streamed: it keeps decoding to its length).

The server is ``python -m cbatch_transformers.serve``: the tiny seeded model in a hub cache (so
``/v1/models`` lists it) and a read-only debug route, ``GET /cbatch/scheduler``, showing the requests the
engine's scheduler holds and how many tokens each has generated; the server has no ``/metrics``.  Runs only
where transformers and the adapter are installed (``.ci/transformers-server-job`` runs it).  No verdict
depends on speed: the disconnect checks compare token counts the scheduler reports against the request's
length, polled until the scheduler is idle (bounded).
"""

from __future__ import annotations

import http.client
import json
import socket
import time
import urllib.request
from typing import Any, Iterator

import pytest

pytest.importorskip("transformers", reason="transformers is not installed here: build its venv with "
                                           ".ci/transformers-venv and run .ci/transformers-server-job")
serve = pytest.importorskip("cbatch_transformers.serve", reason="the transformers adapter is not installed: "
                                                        "pip install -e examples/transformers")
pytest.importorskip("aiohttp", reason="the live client needs the live extra")

from pytest_cbatch.contract import CLAIMS, check_report  # noqa: E402
from pytest_cbatch.impls import resolve_impl  # noqa: E402
from pytest_cbatch.live.local_server import ServerStartError, running  # noqa: E402
from pytest_cbatch.reference.scheduler_sim import demo_trace  # noqa: E402
from pytest_cbatch.workloads import BASE_CONFIG  # noqa: E402

STARTUP_SECONDS = 240
IDLE_SECONDS = 300
MODEL = "cbatch/tiny-llama"
PROMPT = "the cache holds pages"
LENGTH = 600     # tokens; the control test checks the prompt's greedy continuation has no end-of-sequence


def _get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=30) as resp:
        return json.loads(resp.read())


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    work = tmp_path_factory.mktemp("serve-live")
    try:
        with running(["-m", "cbatch_transformers.serve", "--work", str(work)], work,
                     startup_seconds=STARTUP_SECONDS) as url:
            yield url
    except ServerStartError as exc:
        pytest.fail(str(exc))


def _until_idle(url: str) -> list[dict[str, int]]:
    """Poll the scheduler until it holds nothing; every reading's active requests (id -> tokens generated)."""
    readings = []
    deadline = time.monotonic() + IDLE_SECONDS
    while time.monotonic() < deadline:
        state = _get_json(url + "/cbatch/scheduler")
        readings.append(state["active"])
        if not state["active"] and not state["waiting"]:
            return readings
        time.sleep(0.05)
    pytest.fail(f"the scheduler still held requests after {IDLE_SECONDS} s: {readings[-1]}")


def _send(url: str, stream: bool) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse | None]:
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": LENGTH, "stream": stream}
    conn.request("POST", "/v1/completions", json.dumps(body), {"content-type": "application/json"})
    return conn, conn.getresponse() if stream else None


def _disconnect(conn: http.client.HTTPConnection) -> None:
    conn.sock.shutdown(socket.SHUT_RDWR)
    conn.close()


def test_control_the_prompt_runs_to_its_length(server: str) -> None:
    _until_idle(server)
    conn, _ = _send(server, stream=False)
    doc = json.loads(conn.getresponse().read())
    conn.close()
    assert doc["choices"][0]["finish_reason"] == "length" and doc["usage"]["completion_tokens"] == LENGTH, doc


def test_a_streamed_request_whose_client_disconnects_is_cancelled(server: str) -> None:
    _until_idle(server)
    conn, resp = _send(server, stream=True)
    assert resp is not None and resp.status == 200
    while not resp.readline().startswith(b"data: "):   # the first frame: the request is running
        pass
    _disconnect(conn)
    most = max((n for reading in _until_idle(server) for n in reading.values()), default=0)
    assert most < LENGTH // 2, f"the request kept decoding after its client left: seen at {most} of {LENGTH} tokens"


def test_a_non_streamed_request_whose_client_disconnects_keeps_decoding(server: str) -> None:
    """Finding: the non-streamed path awaits the engine's result with no disconnect watch and never calls
    cancel_request (transformers/cli/serving/utils.py, CBGenerateManager.generate_non_streaming), so
    the request holds its blocks and decodes to max_tokens for a client that is gone."""
    _until_idle(server)
    conn, _ = _send(server, stream=False)
    deadline = time.monotonic() + IDLE_SECONDS
    while not (at := _get_json(server + "/cbatch/scheduler")["active"]):
        assert time.monotonic() < deadline, "the request never reached the scheduler"
        time.sleep(0.02)
    _disconnect(conn)
    left_at = max(at.values())
    most = max((n for reading in _until_idle(server) for n in reading.values()), default=0)
    assert left_at < LENGTH // 4, f"the client left only at {left_at} of {LENGTH} tokens; the check needs an early exit"
    assert most >= LENGTH // 2, f"the request stopped at {most} of {LENGTH} tokens after its client left at {left_at}"


def test_the_live_client_counts_a_coalescing_stream_from_its_usage(server: str) -> None:
    """The server refuses ignore_eos and return_token_ids (HTTP 422), streams several tokens a frame, puts
    usage in its last frame and sends no [DONE]: the client drops the optional fields once, says so, and
    judges what it can observe."""
    trace = demo_trace()
    report = resolve_impl(server, tick_seconds=0.05, timeout=60).run(trace, BASE_CONFIG).report
    assert report is not None
    assert report["server"]["ignore_eos"] is False and "422" in report["server"]["notes"][0]
    finished = [r for r in report["requests"].values() if r["status"] == "finished"]
    assert finished and all(r["output_tokens"] == r["usage_completion_tokens"] for r in finished)
    assert all(r["finish_reason"] in ("length", "stop") for r in finished)
    assert check_report(report, trace, BASE_CONFIG, honoured=CLAIMS) == []
