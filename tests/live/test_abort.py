"""The abort check (pytest_cbatch.live.abort) against the embedded server, a correct one and broken ones.

Every stream asks for 5000 tokens from a server that steps at most once per
10 ms tick, so none can finish in under 50 s: longer than any of these checks
lasts, whatever the machine's load.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pytest_cbatch.examples.live.broken_servers import KeepsClosedStreamsServer
from pytest_cbatch.live import LiveError
from pytest_cbatch.live.abort import check_abort, main

LONG = {"tick_ms": 10, "capacity": 8192}   # 8192 pages of 16 tokens: four 5000-token requests fit at once
MAX_TOKENS = 5000


def test_closed_streams_that_are_freed_pass(serve: Any) -> None:
    result = check_abort(serve(**LONG), streams=4, max_tokens=MAX_TOKENS)
    assert result.freed and result.attempts == 1, result.describe()
    assert result.running_before == 4 and result.kv_before > 0 and all(n >= 1 for n in result.tokens_seen)
    assert result.running_after == 0 and result.kv_after == 0
    # the server's own counter: the streams were stopped, not run to their end
    assert result.generated is not None and result.generated < MAX_TOKENS
    assert result.aborts_counted is None and "not exported" in result.describe()


def test_a_server_that_keeps_closed_streams_running_fails(serve: Any, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    url = serve(server_class=KeepsClosedStreamsServer, **LONG)
    out = tmp_path / "abort.json"
    rc = main(["--base-url", url, "--streams", "3", "--max-tokens", str(MAX_TOKENS), "--free-within", "1",
               "--json", str(out)])
    text = capsys.readouterr().out
    assert rc == 1, text
    assert "FAILED: 1 s after closing every stream, vllm:num_requests_running is 3" in text
    assert f"python -m pytest_cbatch.live.abort --base-url {url} --streams 3" in text
    doc = json.loads(out.read_text())
    assert doc["freed"] is False and doc["freed_seconds"] is None and doc["running_before"] == 3


def test_a_server_that_never_frees_the_pages_of_closed_streams_fails(serve: Any) -> None:
    result = check_abort(serve(release_delay=10**9, **LONG), streams=2, max_tokens=MAX_TOKENS, free_within=1.0)
    assert not result.freed, result.describe()
    assert result.running_after == 0 and result.kv_after > 0   # cancelled, but the pages are still held
    assert "vllm:kv_cache_usage_perc" in result.describe().splitlines()[1]


def test_streams_that_finish_before_they_are_closed_void_the_setup_not_the_verdict(serve: Any) -> None:
    # one token each: every stream has ended (or, by the server's token counter, may have) before it is closed
    url = serve(tick_ms=1)
    with pytest.raises(LiveError) as info:
        check_abort(url, streams=2, max_tokens=1, attempts=2)
    message = str(info.value)
    assert "no setup kept 2 streams of max_tokens 1 running until they were closed, in 2 tries" in message
    assert "setup 1: " in message and "setup 2: " in message and "give a larger max_tokens" in message


def test_a_server_that_cannot_be_used_is_exit_2(serve: Any, capsys: pytest.CaptureFixture[str]) -> None:
    from .test_live_server import _free_port

    url = f"http://127.0.0.1:{_free_port()}"
    assert main(["--base-url", url, "--max-tokens", "10"]) == 2
    assert url in capsys.readouterr().err
    # the embedded server lists no max_model_len: the check asks for max_tokens instead of guessing
    assert main(["--base-url", serve(**LONG)]) == 2
    assert "give max_tokens (--max-tokens)" in capsys.readouterr().err
