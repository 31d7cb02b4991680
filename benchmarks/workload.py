"""Seeded large workloads and timing shared by the benchmark scripts."""

from __future__ import annotations

import random
import time
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
    rng = random.Random(seed)
    trace: list[dict[str, Any]] = []
    t = 0
    for i in range(requests):
        t += rng.choice((0, 0, 1))
        rid = f"r{i}"
        trace.append({"time": t, "event": "arrival", "id": rid,
                      "prompt_tokens": rng.randint(16, 1024), "output_tokens": rng.randint(1, 256)})
        if rng.random() < 0.05:
            trace.append({"time": t + rng.randint(0, 200), "event": "cancel", "id": rid})
    trace.sort(key=lambda line: line["time"])
    return trace


def best_of(repeat: int, fn: Callable[[], Any]) -> tuple[float, Any]:
    """The fastest of ``repeat`` timed calls of ``fn``, and its last result."""
    best, value = float("inf"), None
    for _ in range(repeat):
        start = time.perf_counter()
        value = fn()
        best = min(best, time.perf_counter() - start)
    return best, value
