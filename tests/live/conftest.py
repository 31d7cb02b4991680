"""Embedded servers on free loopback ports for the live tests (aiohttp is in the test extra)."""

from __future__ import annotations

from typing import Any, Callable, Iterator

import pytest

pytest.importorskip("aiohttp", reason="the live tests need the live extra: pip install 'pytest-cbatch[live]'")

from pytest_cbatch.live.server import ServerThread, create_server  # noqa: E402

# A slow, small server: a 6-token prompt takes 3 ticks of prefill, so the demo
# trace's cancel (one 50 ms trace tick after its arrival) usually lands before
# any token.  No test relies on that: the clauses judge whatever happened, and
# the cancel before a first token is tested on a server that never sends one.
SLOW = {"tick_ms": 40, "capacity": 64, "block_size": 4, "token_budget": 4, "max_active": 4, "prefill_chunk": 2}


@pytest.fixture
def serve() -> Iterator[Callable[..., str]]:
    """``serve(**create_server_kwargs) -> base URL``; every server started is stopped after the test."""
    running: list[ServerThread] = []

    def start(**kwargs: Any) -> str:
        thread = ServerThread(create_server(**kwargs))
        url = thread.__enter__()
        running.append(thread)
        return url

    yield start
    for thread in running:
        thread.__exit__(None, None, None)


@pytest.fixture(scope="module")
def slow_url() -> Iterator[str]:
    with ServerThread(create_server(**SLOW)) as url:
        yield url
