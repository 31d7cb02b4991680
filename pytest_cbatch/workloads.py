"""The fixed workloads of the conformance suite: the seed's built-in trace, its
five experiments, boundary cases, optimistic-admission cases that force
preemption, and depth cases on which a one-line bug against a clause fails
that very clause.  Each is a trace plus the config it runs under; a workload's
config names only the settings it needs beyond the implementation's defaults
for the seven base settings, which are always given explicitly.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .reference.scheduler_sim import DEFAULT_CONFIG

__all__ = ["BASE_CONFIG", "Workload", "WORKLOADS", "INVALID_INPUTS", "arrival", "cancel"]

# The seven base settings every implementation takes, at the reference's defaults.
BASE_CONFIG: dict[str, Any] = {k: v for k, v in DEFAULT_CONFIG.items() if k != "admission"}


def arrival(t: int, rid: str, prompt: int, output: int) -> dict[str, Any]:
    """One arrival trace line."""
    return {"time": t, "event": "arrival", "id": rid, "prompt_tokens": prompt, "output_tokens": output}


def cancel(t: int, rid: str) -> dict[str, Any]:
    """One cancel trace line."""
    return {"time": t, "event": "cancel", "id": rid}


@dataclass(frozen=True)
class Workload:
    """A named trace and the config it runs under."""

    name: str
    description: str
    trace: tuple[dict[str, Any], ...]
    overrides: dict[str, Any] = field(default_factory=dict)

    @property
    def config(self) -> dict[str, Any]:
        return {**BASE_CONFIG, **self.overrides}


def _w(name: str, description: str, lines: list[dict[str, Any]], **overrides: Any) -> Workload:
    return Workload(name, description, tuple(lines), overrides)


_DEMO = [
    arrival(0, "long", 8, 4), arrival(0, "short", 2, 2), arrival(1, "cancel-me", 6, 4),
    cancel(2, "cancel-me"), arrival(2, "late", 3, 2),
]

_PREEMPT = [arrival(0, "a", 4, 12), arrival(0, "b", 4, 12), arrival(1, "c", 3, 10), arrival(2, "d", 2, 6)]

WORKLOADS: dict[str, Workload] = {w.name: w for w in (
    _w("demo", "the seed's built-in five-line workload", _DEMO),
    _w("demo_serial", "the built-in workload under the serial policy", _DEMO, policy="serial"),
    _w("reservation", "experiment 1: a reservation blocks admission despite free pages",
       [arrival(0, "big", 1, 8), arrival(0, "small", 1, 1)], capacity=2),
    _w("release_delay_3", "experiment 2: a one-page pool waits for a delayed release",
       [arrival(0, "first", 1, 1), arrival(0, "second", 1, 1)], capacity=1, release_delay=3),
    _w("release_delay_0", "experiment 2: release at once", [arrival(0, "first", 1, 1), arrival(0, "second", 1, 1)],
       capacity=1, release_delay=0),
    _w("cancel_after_dispatch", "experiment 3: completion wins a cancel at the dispatch boundary",
       [arrival(0, "r", 1, 1), cancel(1, "r")]),
    _w("cancel_same_tick", "experiment 3: a cancel in the arrival tick means the request never runs",
       [arrival(0, "r", 1, 1), cancel(0, "r")]),
    _w("budget_1", "experiment 4: token budget 1 with several active requests",
       [arrival(0, "a", 1, 3), arrival(0, "b", 1, 3), arrival(0, "c", 2, 2)], token_budget=1),
    _w("impossible", "experiment 5: a request that cannot fit even alone, behind and ahead of others",
       [arrival(0, "ok", 2, 2), arrival(0, "huge", 40, 4), arrival(1, "after", 2, 1)], capacity=4),
    _w("one_token_outputs", "several one-token outputs (empty ITL lists)",
       [arrival(0, "a", 3, 1), arrival(0, "b", 1, 1), arrival(2, "c", 5, 1)]),
    _w("cancel_mid_prefill", "cancel while the prompt is half fed: wasted prefill, TTFT null",
       [arrival(0, "victim", 8, 3), arrival(0, "other", 2, 2), cancel(2, "victim")]),
    _w("duplicate_cancel", "the same request cancelled twice in one tick and once more later",
       [arrival(0, "a", 4, 4), arrival(0, "b", 2, 2), cancel(1, "a"), cancel(1, "a"), cancel(5, "a")]),
    _w("cancel_after_finish", "cancels after completion and after rejection are ignored",
       [arrival(0, "done", 1, 2), arrival(0, "nope", 30, 1), cancel(6, "done"), cancel(6, "nope")], capacity=4),
    _w("idle_gaps", "arrivals separated by idle stretches",
       [arrival(0, "a", 2, 2), arrival(20, "b", 3, 1), arrival(21, "c", 1, 3), arrival(60, "d", 2, 2)]),
    _w("active_limit", "more small requests than max_active allows at once",
       [arrival(0, f"s{i}", 2, 2) for i in range(5)], capacity=16, max_active=2),
    _w("queue_pressure", "more requests than max_active and the pool can hold",
       [arrival(t, f"q{t}", 3 + t % 4, 1 + t % 3) for t in range(8)], capacity=4, max_active=2),
    _w("chunk_boundaries", "prompts ending on, before and after page boundaries with uneven chunks",
       [arrival(0, "p3", 3, 2), arrival(0, "p4", 4, 2), arrival(0, "p5", 5, 3), arrival(1, "p9", 9, 1)],
       capacity=12, prefill_chunk=3, token_budget=5),
    _w("late_start", "the first arrival comes at t=5: nothing may happen before it",
       [arrival(5, "a", 2, 2), arrival(5, "b", 1, 1)]),
    _w("impossible_behind", "an impossible request waits behind a running one and is cancelled before it "
                            "reaches the head (serial): cancelled, never admitted",
       [arrival(0, "first", 4, 4), arrival(0, "huge", 40, 4), arrival(1, "next", 1, 1), cancel(2, "huge")],
       capacity=4, policy="serial"),
    _w("cancel_before_rows", "a request admitted and cancelled before its first row holds no pages at its end",
       [arrival(0, "a", 2, 3), arrival(0, "b", 2, 3), arrival(0, "c", 2, 1), cancel(1, "c")],
       token_budget=2),
    _w("preempt_decode", "optimistic admission: decode growth runs the pool dry and preempts",
       _PREEMPT, admission="optimistic"),
    _w("preempt_cancel", "optimistic admission: a preempted request is cancelled while re-queued",
       _PREEMPT + [cancel(9, "c")], admission="optimistic"),
    _w("preempt_tight", "optimistic admission on a pool one request can fill",
       [arrival(0, "x", 6, 7), arrival(0, "y", 5, 7), arrival(0, "z", 1, 9)],
       admission="optimistic", capacity=4, prefill_chunk=3, release_delay=0),
    # Depth: each makes a one-line bug against one clause fail that very clause.
    _w("mixed_endings", "every ending in one run (the summary counts each): finished, two rejections, a cancel "
                        "while running and one in the arrival tick, and a cancel ignored after each kind of end",
       [arrival(0, "fin", 2, 2), arrival(0, "huge", 30, 2), arrival(1, "run", 3, 3), arrival(1, "gone", 4, 4),
        cancel(1, "gone"), arrival(2, "huge2", 20, 1), cancel(2, "run"), cancel(4, "huge"), cancel(5, "run"),
        cancel(9, "fin")],
       capacity=4, max_active=2),
    _w("drain_reuse", "a pool two requests share one at a time, with a long release_delay: the next request must "
                      "wait for the release, not take the draining pages",
       [arrival(0, "a", 4, 4), arrival(0, "b", 4, 4), arrival(2, "c", 1, 2)], capacity=2, release_delay=4),
    _w("impossible_alone", "an impossible request that is left alone once the others finish, cancelled much "
                           "later: it must have been rejected by then",
       [arrival(0, "ok", 2, 2), arrival(0, "huge", 40, 4), cancel(12, "huge")], capacity=4),
)}


# Inputs every implementation must refuse (clause invalid_input_refused).
INVALID_INPUTS: dict[str, tuple[list[dict[str, Any]], dict[str, Any]]] = {
    "bool_time": ([{**arrival(0, "a", 1, 1), "time": True}], {}),
    "bool_prompt": ([{**arrival(0, "a", 1, 1), "prompt_tokens": True}], {}),
    "unknown_field": ([{**arrival(0, "a", 1, 1), "priority": 1}], {}),
    "zero_prompt": ([arrival(0, "a", 0, 1)], {}),
    "negative_output": ([arrival(0, "a", 1, -2)], {}),
    "negative_time": ([arrival(-1, "a", 1, 1)], {}),
    "duplicate_id": ([arrival(0, "a", 1, 1), arrival(1, "a", 2, 2)], {}),
    "cancel_unknown": ([arrival(0, "a", 1, 1), cancel(1, "b")], {}),
    "cancel_before_arrival": ([cancel(0, "a"), arrival(1, "a", 1, 1)], {}),
    "bad_event": ([{"time": 0, "event": "pause", "id": "a"}], {}),
    "zero_capacity": ([arrival(0, "a", 1, 1)], {"capacity": 0}),
    "zero_budget": ([arrival(0, "a", 1, 1)], {"token_budget": 0}),
    "bool_block_size": ([arrival(0, "a", 1, 1)], {"block_size": True}),
    "negative_release_delay": ([arrival(0, "a", 1, 1)], {"release_delay": -1}),
    "unknown_policy": ([arrival(0, "a", 1, 1)], {"policy": "fifo-ish"}),
}


# ---- Mutation campaign: workloads that close gaps the campaign found (docs/mutation.md) ----
# Each kills a mutant of the reference that every earlier workload let through; each holds for every
# correct scheduler (the shipped variants included), whatever its admission order or rotation.
WORKLOADS.update({w.name: w for w in (
    _w("impossible_first", "an impossible request heads the queue of an idle pool, a feasible one behind it: "
                           "it is rejected and the one behind still runs",
       [arrival(0, "huge", 40, 4), arrival(0, "ok", 2, 2)], capacity=4),
    _w("long_output", "an output of 300 tokens beside a short request: outputs longer than any small-integer "
                      "cache, every token counted to the end",
       [arrival(0, "long", 2, 300), arrival(0, "short", 3, 2)], capacity=24, block_size=16),
    _w("reserve_asked", "the preemption workload with reserve admission asked for by name: the report records "
                        "the admission the run asked for",
       _PREEMPT, admission="reserve"),
    _w("wide_batch", "300 one-token requests with max_active 260: more requests running at once than a small-integer "
                     "cache holds (vLLM's default max_num_seqs is 256), and the limit still holds",
       [arrival(0, f"w{i}", 1, 1) for i in range(300)], capacity=300, max_active=260),
    _w("cancel_listed_first", "a cancel listed before its request's arrival at the same time: at one time every "
                              "arrival comes before every cancel, whatever the order of the lines",
       [arrival(0, "a", 2, 2), cancel(1, "b"), arrival(1, "b", 3, 2)]),
)})

INVALID_INPUTS.update({
    # A config is invalid whatever the trace: refused even when no arrival would ever need a page.
    "zero_block_size_empty_trace": ([], {"block_size": 0}),
    "zero_max_active": ([arrival(0, "a", 1, 1)], {"max_active": 0}),
})
