"""Hypothesis strategies for scheduler workloads (public API).

    from hypothesis import given
    from pytest_cbatch import strategies as cst

    @given(cst.workloads())
    def test_my_property(workload):
        trace, config = workload
        report = my_engine.simulate(trace, **config)
        ...

Every trace drawn here is valid (see ``reference/scheduler_sim.py``); configs
use only the seven base settings unless ``admission`` is asked for;
``preemption_workloads()`` adds optimistic admission on a pool too small for
its requests, so preemption and recompute happen on most examples.  Shrinking
goes toward fewer, shorter requests, earlier times and fewer cancels.
"""

from __future__ import annotations

from typing import Any, Sequence

from hypothesis import strategies as st

__all__ = ["traces", "configs", "workloads", "preemption_workloads"]


@st.composite
def traces(
    draw: st.DrawFn,
    *,
    min_requests: int = 1,
    max_requests: int = 8,
    max_gap: int = 3,
    max_prompt: int = 16,
    max_output: int = 12,
    max_cancels_per_request: int = 2,
) -> list[dict[str, Any]]:
    """Valid traces: arrivals with unique ids, and cancels at or after their arrival.

    Lines are ordered by time; at equal times in generation order, so a cancel
    sharing its request's arrival tick follows that arrival.
    """
    count = draw(st.integers(min_requests, max_requests), label="requests")
    lines: list[tuple[int, int, dict[str, Any]]] = []
    t = 0
    for i in range(count):
        t += draw(st.integers(0, max_gap), label=f"gap before r{i}")
        rid = f"r{i}"
        lines.append((t, len(lines), {
            "time": t, "event": "arrival", "id": rid,
            "prompt_tokens": draw(st.integers(1, max_prompt), label=f"{rid}.prompt_tokens"),
            "output_tokens": draw(st.integers(1, max_output), label=f"{rid}.output_tokens"),
        }))
        for k in range(draw(st.integers(0, max_cancels_per_request), label=f"{rid} cancels")):
            at = t + draw(st.integers(0, 3 * (max_prompt + max_output) // 4), label=f"{rid} cancel {k} delay")
            lines.append((at, len(lines), {"time": at, "event": "cancel", "id": rid}))
    lines.sort(key=lambda item: (item[0], item[1]))
    return [line for _, _, line in lines]


@st.composite
def configs(
    draw: st.DrawFn,
    *,
    policies: Sequence[str] = ("continuous", "serial"),
    admissions: Sequence[str] | None = None,
    max_capacity: int = 16,
) -> dict[str, Any]:
    """Scheduler configs over the base settings; ``admissions`` adds the admission key."""
    config: dict[str, Any] = {
        "capacity": draw(st.integers(1, max_capacity), label="capacity"),
        "block_size": draw(st.integers(1, 8), label="block_size"),
        "token_budget": draw(st.integers(1, 12), label="token_budget"),
        "max_active": draw(st.integers(1, 6), label="max_active"),
        "prefill_chunk": draw(st.integers(1, 8), label="prefill_chunk"),
        "release_delay": draw(st.integers(0, 3), label="release_delay"),
        "policy": draw(st.sampled_from(list(policies)), label="policy"),
    }
    if admissions:
        config["admission"] = draw(st.sampled_from(list(admissions)), label="admission")
    return config


def workloads(
    *, admissions: Sequence[str] | None = None, max_requests: int = 8
) -> st.SearchStrategy[tuple[list[dict[str, Any]], dict[str, Any]]]:
    """(trace, config) pairs: ``traces()`` with ``configs()``."""
    return st.tuples(traces(max_requests=max_requests), configs(admissions=admissions))


@st.composite
def preemption_workloads(draw: st.DrawFn, *, max_requests: int = 6, max_output: int = 24) -> tuple[
        list[dict[str, Any]], dict[str, Any]]:
    """(trace, config) pairs that preempt often, and preempt again during recompute.

    Optimistic admission, continuous policy; three or more requests arriving
    together, prompts of up to three prefill chunks (so a recompute spans
    several dispatches), long outputs on pages of one or two tokens (so decodes
    keep asking for pages), and a pool between the largest request and a third
    of the way to all of them.  Within a hundred examples this reaches a
    preemption in the middle of a recompute, a second preemption of a request
    whose recompute was cut short, and the cancel of a request waiting after a
    preemption (tests/test_strategies.py counts them).
    """
    chunk = draw(st.integers(1, 3), label="prefill_chunk")
    trace = draw(traces(min_requests=3, max_requests=max(3, max_requests), max_gap=1, max_prompt=3 * chunk + 2,
                        max_output=max_output, max_cancels_per_request=1))
    block_size = draw(st.integers(1, 2), label="block_size")
    needs = [-(-(line["prompt_tokens"] + line["output_tokens"] - 1) // block_size)
             for line in trace if line["event"] == "arrival"]
    most = max(needs)
    return trace, {
        "capacity": draw(st.integers(most, most + (sum(needs) - most) // 3), label="capacity"),
        "block_size": block_size,
        "token_budget": draw(st.integers(chunk, 3 * chunk + 2), label="token_budget"),
        "max_active": draw(st.integers(2, 6), label="max_active"),
        "prefill_chunk": chunk,
        "release_delay": draw(st.integers(0, 3), label="release_delay"),
        "policy": "continuous",
        "admission": "optimistic",
    }
