"""Deliberately broken schedulers: each breaks one contract clause family.

They exist to prove the kit catches real bugs (tests/test_broken_schedulers.py)
and as demo failures for students:

    pytest --cbatch-impl=pytest_cbatch.examples.broken_schedulers:ttft_zero_on_cancel

Each is a ``simulate(trace, **config)`` built on the reference scheduler with
one fault: a wrong report field, a setting it silently ignores, or a changed
behaviour.  ``BROKEN`` maps each name to the clause it must fail.
"""

from __future__ import annotations

import random
from typing import Any, Callable

from pytest_cbatch.reference import scheduler_sim as ref
from pytest_cbatch.reference.trace_format import validate_config, validate_trace

__all__ = ["BROKEN"]

Report = dict[str, Any]


def _run(simulation: type, trace: Any, config: dict[str, Any]) -> Report:
    """Run a (subclassed) reference simulation with the reference's validation."""
    cfg = validate_config({**ref.DEFAULT_CONFIG, **config})
    return simulation(cfg, validate_trace(trace), False).run()


def _ignoring(setting: str, change: Callable[[Any], Any]) -> Callable[..., Report]:
    """A scheduler that runs with ``change(setting)`` but reports the value it was given."""

    def simulate(trace: Any, **config: Any) -> Report:
        asked = {**ref.DEFAULT_CONFIG, **config}
        report = ref.simulate(trace, **{**asked, setting: change(asked[setting])})
        report["config"][setting] = asked[setting]
        return report

    return simulate


def ttft_zero_on_cancel(trace: Any, **config: Any) -> Report:
    """Reports TTFT 0 instead of null for requests cancelled before any token."""
    report = ref.simulate(trace, **config)
    for row in report["requests"].values():
        if row["status"] == "cancelled" and row["ttft_ticks"] is None:
            row["ttft_ticks"] = 0
    return report


def itl_zero_for_one_token(trace: Any, **config: Any) -> Report:
    """Reports an ITL list of [0] for one-token outputs."""
    report = ref.simulate(trace, **config)
    for row in report["requests"].values():
        if row["output_tokens"] == 1:
            row["itl_ticks"] = [0]
    return report


class _LeakOnCancel(ref._Simulation):
    def release_due(self, t: int) -> None:
        leaking = [req for due, req in self.draining if due <= t and req.status == "cancelled" and req.pages]
        super().release_due(t)
        for _ in leaking:  # the release event goes out, but one of its pages never returns
            self.free.pop()


def leak_on_cancel(trace: Any, **config: Any) -> Report:
    """Loses one free page for every cancelled request it releases."""
    return _run(_LeakOnCancel, trace, config)


class _Recancel(ref._Simulation):
    def cancel(self, t: int, rid: str) -> None:
        if self.requests[rid].status == "cancelled":
            self.events.append({"time": t, "event": "cancelled", "id": rid})
            return
        super().cancel(t, rid)


def recancel(trace: Any, **config: Any) -> Report:
    """Answers a second cancel with another ``cancelled`` instead of ``cancel_ignored``."""
    return _run(_Recancel, trace, config)


def reemit_after_recompute(trace: Any, **config: Any) -> Report:
    """After a preemption, sends the client's last token again before continuing."""
    report = ref.simulate(trace, **config)
    last_index: dict[str, int] = {}
    pending: set[str] = set()
    events = []
    for ev in report["events"]:
        if ev["event"] == "preempted" and last_index.get(ev["id"]):
            pending.add(ev["id"])
        if ev["event"] == "token":
            if ev["id"] in pending:
                pending.discard(ev["id"])
                events.append({**ev, "output_index": last_index[ev["id"]]})
            last_index[ev["id"]] = ev["output_index"]
        events.append(ev)
    report["events"] = events
    return report


def pending_sample_refed(trace: Any, **config: Any) -> Report:
    """Recompute rebuilds prompt + all outputs, feeding the pending sample a second time."""
    report = ref.simulate(trace, **config)
    extra = 0
    for ev in report["events"]:
        if ev["event"] == "dispatch":
            for row in ev["work"]:
                if row["phase"] == "recompute":
                    row["input_tokens"] += 1
                    ev["unused_budget"] -= 1
                    extra += 1
    report["summary"]["processed_input_tokens"] += extra
    return report


budget_overrun = _ignoring("token_budget", lambda budget: budget + 1)
budget_overrun.__doc__ = "Feeds one token more than the token budget allows."

early_reuse = _ignoring("release_delay", lambda delay: 0)
early_reuse.__doc__ = "Ignores release_delay: a retired request's pages are reused at once."

over_admission = _ignoring("max_active", lambda limit: limit + 1)
over_admission.__doc__ = "Admits one request more than max_active."

oversized_chunks = _ignoring("prefill_chunk", lambda chunk: chunk + 1)
oversized_chunks.__doc__ = "Feeds prefill rows one token longer than prefill_chunk."


def impossible_queued(trace: Any, **config: Any) -> Report:
    """Never rejects a request that cannot fit; it just sits in the queue."""
    report = ref.simulate(trace, **config)
    report["events"] = [ev for ev in report["events"] if ev["event"] != "rejected"]
    report["summary"]["rejected"] = 0
    return report


def shared_page(trace: Any, **config: Any) -> Report:
    """Hands the same page to two running requests."""
    report = ref.simulate(trace, **config)
    for ev in report["events"]:
        if ev["event"] == "snapshot":
            tables = [t for t in ev["block_tables"].values() if t]
            if len(tables) >= 2:
                tables[1][-1] = tables[0][0]
    return report


def rows_without_pages(trace: Any, **config: Any) -> Report:
    """Lets the newest running request feed rows before its last page is allocated."""
    report = ref.simulate(trace, **config)
    for ev in report["events"]:
        if ev["event"] == "snapshot" and ev["block_tables"]:
            rid = list(ev["block_tables"])[-1]
            table = ev["block_tables"][rid]
            if table:
                ev["block_tables"][rid] = table[:-1]
                ev["allocated_blocks"] -= 1
                ev["free_blocks"] += 1
    return report


def mutates_input(trace: Any, **config: Any) -> Report:
    """Tags every line of the caller's trace with a field of its own."""
    for line in trace:
        line["seen"] = True
    report = ref.simulate([{k: v for k, v in line.items() if k != "seen"} for line in trace], **config)
    return report


class _RandomPages(ref._Simulation):
    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        pages = list(self.free)
        random.shuffle(pages)  # unseeded on purpose
        self.free.clear()
        self.free.extend(pages)


def nondeterministic_pages(trace: Any, **config: Any) -> Report:
    """Allocates pages from an unseeded shuffled free list, so two runs differ."""
    return _run(_RandomPages, trace, config)


def accepts_invalid(trace: Any, **config: Any) -> Report:
    """Skips input validation and simulates whatever it is given."""
    lines = [dict(line) for line in trace]
    lines.sort(key=lambda line: line["time"] if isinstance(line.get("time"), int) else 0)
    return ref._Simulation({**ref.DEFAULT_CONFIG, **config}, lines, False).run()


BROKEN: dict[str, tuple[Callable[..., Report], str]] = {
    "ttft_zero_on_cancel": (ttft_zero_on_cancel, "ttft_null_on_cancel"),
    "itl_zero_for_one_token": (itl_zero_for_one_token, "itl_empty_for_one_token"),
    "leak_on_cancel": (leak_on_cancel, "no_leaked_pages"),
    "recancel": (recancel, "cancel_idempotent"),
    "reemit_after_recompute": (reemit_after_recompute, "no_duplicate_emission"),
    "pending_sample_refed": (pending_sample_refed, "pending_sample_fed_once"),
    "budget_overrun": (budget_overrun, "budget_respected"),
    "early_reuse": (early_reuse, "no_reuse_before_release"),
    "over_admission": (over_admission, "lifecycle_order"),
    "oversized_chunks": (oversized_chunks, "row_shape"),
    "impossible_queued": (impossible_queued, "impossible_rejected"),
    "shared_page": (shared_page, "pages_conserved"),
    "rows_without_pages": (rows_without_pages, "pages_cover_rows"),
    "mutates_input": (mutates_input, "input_not_mutated"),
    "nondeterministic_pages": (nondeterministic_pages, "deterministic"),
    "accepts_invalid": (accepts_invalid, "invalid_input_refused"),
}
