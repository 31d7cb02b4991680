"""Deliberately broken schedulers: each breaks one contract clause family.

They exist to prove the kit catches real bugs (tests/test_broken_schedulers.py)
and as demo failures for students:

    pytest --cbatch-impl=pytest_cbatch.examples.broken_schedulers:ttft_zero_on_cancel

Each is a ``simulate(trace, **config)`` built on the reference scheduler with
one fault: a wrong report field, a setting it silently ignores, or a changed
behaviour.  ``BROKEN`` maps each name to the clause it must fail.
"""

from __future__ import annotations

import heapq
import random
from typing import Any, Callable

from pytest_cbatch.reference import scheduler_sim as ref
from pytest_cbatch.reference.scheduler_sim import validate_config, validate_trace

__all__ = ["BROKEN"]

Report = dict[str, Any]


def _run(scheduler: type, trace: Any, config: dict[str, Any]) -> Report:
    """Run a (subclassed) reference scheduler with the reference's validation."""
    return ref.drive(scheduler(**validate_config({**ref.DEFAULT_CONFIG, **config})), validate_trace(trace))


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


class _LeakOnCancel(ref.Scheduler):
    def _release_due(self) -> None:
        leaking = [rid for due, rid in self.releases
                   if due <= self.now and self.requests[rid].status == "cancelled" and self.tables[rid]]
        super()._release_due()
        for _ in leaking:  # the release event goes out, but one of its pages never returns
            heapq.heappop(self.free)


def leak_on_cancel(trace: Any, **config: Any) -> Report:
    """Loses one free page for every cancelled request it releases."""
    return _run(_LeakOnCancel, trace, config)


class _Recancel(ref.Scheduler):
    def cancel(self, rid: str) -> None:
        if self.requests[rid].status == "cancelled":
            self.events.append({"time": self.now, "event": "cancelled", "id": rid})
            return
        super().cancel(rid)


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

release_delay_ignored = _ignoring("release_delay", lambda delay: 0)
release_delay_ignored.__doc__ = "Ignores release_delay: a retired request's pages are released at once."


class _RecomputeTargetCut(ref.Scheduler):
    """Emits a token for every decode row, and cuts a recompute target to its progress when preempted."""

    def _preempt(self, req: Any) -> None:
        written = req.written
        super()._preempt(req)
        req.recompute_to = written  # the bug: a recompute cut short keeps only its partial progress as target

    def _dispatch(self, rows: list[Any]) -> None:
        before = len(self.events)
        super()._dispatch(rows)
        emitted = {ev["id"] for ev in self.events[before:] if ev["event"] == "token"}
        for req, phase, _ in rows:  # a decode row samples a token (true only once the recompute is whole)
            if phase == "decode" and req.id not in emitted and req.status == "active":
                req.token_times.append(self.now)
                self.events.append({"time": self.now, "event": "token", "id": req.id,
                                    "output_index": len(req.token_times)})
                if len(req.token_times) == req.output:
                    self._retire(req, "finished")


def recompute_target_cut(trace: Any, **config: Any) -> Report:
    """Preempted in the middle of a recompute, a request keeps only its partial progress as the recompute
    target: once that is rebuilt it decodes and emits too early (a prompt or output row is never rebuilt)."""
    return _run(_RecomputeTargetCut, trace, config)


class _EarlyReuse(ref.Scheduler):
    def _retire(self, req: Any, status: str) -> None:
        running = req.status == "active"
        super()._retire(req, status)
        if running:  # back on the free heap at once, though the table drains and the release comes later
            for page in self.tables[req.id]:
                heapq.heappush(self.free, page)

    def _release_due(self) -> None:
        while self.releases and self.releases[0][0] <= self.now:
            _, rid = heapq.heappop(self.releases)
            self.draining_pages -= len(self.tables.pop(rid))
            self.events.append({"time": self.now, "event": "release", "id": rid})


def early_reuse(trace: Any, **config: Any) -> Report:
    """Hands a retired request's pages to new rows before its release event."""
    return _run(_EarlyReuse, trace, config)

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


class _Blocked(Exception):
    """Raised instead of rejecting: the request stays at the head of the queue."""


class _NeverRejects(ref.Scheduler):
    def _retire(self, req: Any, status: str) -> None:
        if status == "rejected":
            raise _Blocked(req)
        super()._retire(req, status)

    def _admit(self) -> None:
        try:
            super()._admit()
        except _Blocked as blocked:  # admission stops behind it, every tick, until a cancel ends it
            req = blocked.args[0]
            self.events.append({"time": self.now, "event": "admission_blocked", "id": req.id,
                                "required_blocks": self._need(req)})


def impossible_left_queued(trace: Any, **config: Any) -> Report:
    """Leaves a request that cannot fit at the head of the queue (blocking admission behind it) instead of
    rejecting it; only a cancel ends it."""
    return _run(_NeverRejects, trace, config)


class _ReuseWhileDraining(ref.Scheduler):
    def _retire(self, req: Any, status: str) -> None:
        running = req.status == "active"
        super()._retire(req, status)
        if running:  # the pool takes the pages back at the end; only the release event waits for release_delay
            pages = self.tables[req.id]
            self.draining_pages -= len(pages)
            self.tables[req.id] = []
            for page in pages:
                heapq.heappush(self.free, page)


def reuse_while_draining(trace: Any, **config: Any) -> Report:
    """Frees a finished or cancelled request's pages at its end and hands them out again, though its release
    event (and the end of in-flight writes it stands for) comes release_delay later."""
    return _run(_ReuseWhileDraining, trace, config)


def rejections_uncounted(trace: Any, **config: Any) -> Report:
    """Reports every rejection as an event and in the requests table, but counts none in the summary."""
    report = ref.simulate(trace, **config)
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


class _RandomPages(ref.Scheduler):
    def __init__(self, **config: Any) -> None:
        super().__init__(**config)
        random.shuffle(self.free)  # unseeded on purpose (and no longer a heap: pops come out in random order)


def nondeterministic_pages(trace: Any, **config: Any) -> Report:
    """Allocates pages from an unseeded shuffled free list, so two runs differ."""
    return _run(_RandomPages, trace, config)


def _lenient_int(value: Any, least: int) -> int:
    try:
        return max(least, int(value))
    except (TypeError, ValueError):
        return least


def accepts_invalid(trace: Any, **config: Any) -> Report:
    """Parses leniently instead of refusing: coerces bad values, drops unknown fields,
    duplicate ids and stray cancels, and simulates what is left."""
    lines, seen = [], set()
    for line in trace:
        if not isinstance(line, dict) or line.get("event") not in ("arrival", "cancel"):
            continue
        rid = str(line.get("id") or "?")
        if (line["event"] == "arrival") == (rid in seen):
            continue
        seen.add(rid)
        clean = {"time": _lenient_int(line.get("time"), 0), "event": line["event"], "id": rid}
        if line["event"] == "arrival":
            clean.update(prompt_tokens=_lenient_int(line.get("prompt_tokens"), 1),
                         output_tokens=_lenient_int(line.get("output_tokens"), 1))
        lines.append(clean)
    lines.sort(key=lambda line: (line["time"], line["event"] == "cancel"))
    settings = {key: (_lenient_int(config.get(key), 1 if key != "release_delay" else 0)
                      if isinstance(value, int) else config.get(key, value))
                for key, value in ref.DEFAULT_CONFIG.items()}
    settings = {k: v if k not in ("policy", "admission") or v in ref.CONFIG_CHOICES[k] else ref.DEFAULT_CONFIG[k]
                for k, v in settings.items()}
    return ref.simulate(lines, **settings)


BROKEN: dict[str, tuple[Callable[..., Report], str]] = {
    "ttft_zero_on_cancel": (ttft_zero_on_cancel, "ttft_null_on_cancel"),
    "itl_zero_for_one_token": (itl_zero_for_one_token, "itl_empty_for_one_token"),
    "leak_on_cancel": (leak_on_cancel, "no_leaked_pages"),
    "recancel": (recancel, "cancel_idempotent"),
    "reemit_after_recompute": (reemit_after_recompute, "no_duplicate_emission"),
    "pending_sample_refed": (pending_sample_refed, "pending_sample_fed_once"),
    "budget_overrun": (budget_overrun, "budget_respected"),
    "early_reuse": (early_reuse, "no_reuse_before_release"),
    "release_delay_ignored": (release_delay_ignored, "release_once_after_delay"),
    "over_admission": (over_admission, "lifecycle_order"),
    "oversized_chunks": (oversized_chunks, "row_shape"),
    "impossible_queued": (impossible_queued, "impossible_rejected"),
    "impossible_left_queued": (impossible_left_queued, "impossible_rejected"),
    "reuse_while_draining": (reuse_while_draining, "no_reuse_before_release"),
    "rejections_uncounted": (rejections_uncounted, "terminal_exactly_once"),
    "shared_page": (shared_page, "pages_conserved"),
    "rows_without_pages": (rows_without_pages, "pages_cover_rows"),
    "mutates_input": (mutates_input, "input_not_mutated"),
    "nondeterministic_pages": (nondeterministic_pages, "deterministic"),
    "accepts_invalid": (accepts_invalid, "invalid_input_refused"),
}
