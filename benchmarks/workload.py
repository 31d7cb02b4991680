"""Seeded large workloads and timing shared by the benchmark scripts.

A workload's *shape* decides what dominates both parsing and checking its
report, so the checking benchmark runs several (``SHAPES``):

``long-queues``
    ``large_trace``: arrivals at about 2 per tick, faster than the pool drains,
    so hundreds of requests wait and every snapshot lists them in ``queued``.
    Those long id lists make ``json.loads`` itself slow (about 126 MB of JSON
    for 2,000 requests).
``short-queues``
    ``spread_trace``: arrivals about one every 1.5 ticks and shorter outputs,
    so the queue stays nearly empty and the report is mostly tokens, small
    snapshots and dispatches (about 110k events, 25 MB for 2,000 requests).
    Per event, the checker has the most to do relative to parsing here.
``preemption``
    ``spread_trace`` under optimistic admission on a pool a third the size:
    requests are admitted without reserving their pages and preempted when
    the pool runs dry (hundreds of preemptions, each followed by a recompute),
    with a queue of a few dozen.

The default configuration (``BENCH_CONFIG``) is the one the README's figures
were measured with; a shape overrides only what it names.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from typing import Any, Callable

BENCH_CONFIG: dict[str, Any] = {
    "capacity": 2048,
    "block_size": 16,
    "token_budget": 512,
    "max_active": 64,
    "prefill_chunk": 256,
    "release_delay": 1,
}


def large_trace(requests: int = 2000, seed: int = 0) -> list[dict[str, Any]]:
    """``requests`` arrivals (prompts 16-1024, outputs 1-256) at about 2 per tick, 5% cancelled."""
    return _trace(requests, seed, gaps=(0, 0, 1), prompt=1024, output=256)


def spread_trace(requests: int = 2000, seed: int = 0) -> list[dict[str, Any]]:
    """``requests`` arrivals (prompts 16-512, outputs 1-96) about one per 1.5 ticks, 5% cancelled."""
    return _trace(requests, seed, gaps=(0, 1, 2, 3), prompt=512, output=96)


def _trace(requests: int, seed: int, *, gaps: tuple[int, ...], prompt: int, output: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    trace: list[dict[str, Any]] = []
    t = 0
    for i in range(requests):
        t += rng.choice(gaps)
        rid = f"r{i}"
        trace.append({"time": t, "event": "arrival", "id": rid,
                      "prompt_tokens": rng.randint(16, prompt), "output_tokens": rng.randint(1, output)})
        if rng.random() < 0.05:
            trace.append({"time": t + rng.randint(0, 200), "event": "cancel", "id": rid})
    trace.sort(key=lambda line: line["time"])
    return trace


@dataclass(frozen=True)
class Shape:
    """A named workload: its trace generator and the config it runs under (``BENCH_CONFIG`` plus ``overrides``)."""

    name: str
    summary: str
    trace: Callable[[int, int], list[dict[str, Any]]]
    overrides: dict[str, Any] = field(default_factory=dict)

    def config(self) -> dict[str, Any]:
        return {**BENCH_CONFIG, **self.overrides}


SHAPES: dict[str, Shape] = {
    s.name: s
    for s in (
        Shape("long-queues", "arrivals outpace the pool; snapshots list hundreds of queued ids", large_trace),
        Shape("short-queues", "arrivals spread out; the queue stays nearly empty", spread_trace),
        Shape("preemption", "optimistic admission on a 640-page pool; hundreds of preemptions", spread_trace,
              {"capacity": 640, "admission": "optimistic"}),
    )
}


def best_of(repeat: int, fn: Callable[[], Any]) -> tuple[float, Any]:
    """The fastest of ``repeat`` timed calls of ``fn``, and its last result."""
    best, value = float("inf"), None
    for _ in range(repeat):
        start = time.perf_counter()
        value = fn()
        best = min(best, time.perf_counter() - start)
    return best, value
