"""Reference continuous-batching scheduler simulator (standard library only).

This file is self-contained: copy it anywhere and run ``python
scheduler_sim.py --output continuous.json``, or load it by path alone
(``importlib.util.spec_from_file_location``).  It replays a trace of arrivals
and cancellations on a paged KV pool in synthetic ticks and returns a
JSON-ready report: the config, one row per request (arrival order), the
ordered event trace and summary counts.  With the default ``admission=
"reserve"`` it follows the course's published simulator event for event.
It also holds ``PagedKV``, the lifecycle exercises' allocator.

Semantics.  The trace is validated, then sorted stably by ``(time, event ==
"cancel")``: at one time every arrival precedes every cancel.  ``now`` starts
at 0.  While trace events remain or requests wait, run or await release:

1. trace events at ``now``: ``arrival`` (queued at the back of the FIFO
   queue); ``cancel``: a queued or running request is retired as
   ``cancelled``, an ended one answers ``cancel_ignored{status}``;
2. every release due (``release_time <= now``, in (time, id) order) frees the
   request's pages and emits ``release``;
3. admission, while requests wait and fewer than ``limit`` run (1 under
   ``policy="serial"``, else ``max_active``).  The head needs ``ceil((prompt +
   output - 1) / block_size)`` pages (the last sampled token is never fed
   back).  More than ``capacity``: it is ``rejected`` and the next head is
   tried.  More than ``capacity`` minus the needs of running requests minus the
   pages awaiting release: ``admission_blocked{required_blocks}`` (each tick it
   waits) and admission stops.  Otherwise it is admitted with an empty block
   table: ``admit{reserved_blocks}``;
4. the dispatch is planned within ``token_budget``: decode rows first (one
   token each), the running requests in decode taken in admission order
   rotated by ``decode_turn``; then prefill chunks of ``min(prefill_chunk,
   prompt left, budget left)``, rotated by ``prefill_turn``.  ``decode_turn``
   grows by ``min(decoders, token_budget)``, ``prefill_turn`` by the prefill
   rows planned;
5. a ``snapshot``, every tick: running and queued ids, reservation, draining,
   allocated and free counts, admission headroom, and every block table in
   the pool (creation order, draining ones included) as it stands *before* the
   dispatch writes;
6. no rows: ``now`` jumps to the next trace time or release, whichever is
   first; with neither, the run ends (``drained_at_tick = now``);
7. otherwise the ``dispatch{work, unused_budget}``, then ``now += 1`` and each
   row in order writes its KV rows (a new page, the lowest free id, whenever
   the tail page is full or absent); a prompt's last chunk and every decode
   row emit ``token{output_index}`` at the new ``now``, then ``finished`` once
   the output is complete.

A retired request (finished or cancelled while running) leaves the running
set at once and keeps its pages until ``now + release_delay``; one cancelled
or rejected while queued just leaves the queue (no pages, no release).  TTFT
is null when no output was produced, never 0; a one-token output has an empty
ITL list.

Extension, not part of the course (``admission="optimistic"``): admission
claims only the pages of the prompt (or of the rows to recompute), later pages
are allocated as rows need them, and when a planned dispatch needs more pages
than are free the newest running request is ``preempted{released_blocks}``:
its pages are freed at once and it returns to the front of the queue.  Back in,
it recomputes its committed rows (phase ``recompute``, never emitting) and
continues without emitting any output twice; the oldest running request never
yields, so it always makes progress.  Snapshots count the pages the coming
dispatch will claim as reserved.

``Scheduler`` is the same machine one tick at a time (for live serving);
``simulate`` drives it over a trace.  Run ``python scheduler_sim.py --help``
for the command line.
"""

from __future__ import annotations

import argparse
import heapq
import json
import os
import sys
import tempfile
from collections import deque
from typing import Any, Iterable, Mapping, Sequence

__all__ = [
    "DEFAULT_CONFIG", "PagedKV", "Scheduler", "demo_trace", "drive", "load_trace", "main", "simulate",
    "validate_config", "validate_trace",
]

SCHEMA_VERSION = 1
TIME_UNIT = "synthetic_tick"

DEFAULT_CONFIG: dict[str, Any] = {
    "capacity": 8,
    "block_size": 4,
    "token_budget": 4,
    "max_active": 4,
    "prefill_chunk": 2,
    "release_delay": 1,
    "policy": "continuous",
    "admission": "reserve",
}

_DEMO_TRACE = (
    {"time": 0, "event": "arrival", "id": "long", "prompt_tokens": 8, "output_tokens": 4},
    {"time": 0, "event": "arrival", "id": "short", "prompt_tokens": 2, "output_tokens": 2},
    {"time": 1, "event": "arrival", "id": "cancel-me", "prompt_tokens": 6, "output_tokens": 4},
    {"time": 2, "event": "cancel", "id": "cancel-me"},
    {"time": 2, "event": "arrival", "id": "late", "prompt_tokens": 3, "output_tokens": 2},
)


def demo_trace() -> list[dict[str, Any]]:
    """Return a fresh copy of the built-in five-line workload."""
    return [dict(line) for line in _DEMO_TRACE]


# -- input validation --------------------------------------------------------

TRACE_FIELDS: dict[str, tuple[str, ...]] = {
    "arrival": ("time", "event", "id", "prompt_tokens", "output_tokens"),
    "cancel": ("time", "event", "id"),
}

# name -> minimum for integer settings; a tuple of allowed values for the others
CONFIG_CHOICES: dict[str, Any] = {
    "capacity": 1,
    "block_size": 1,
    "token_budget": 1,
    "max_active": 1,
    "prefill_chunk": 1,
    "release_delay": 0,
    "policy": ("continuous", "serial"),
    "admission": ("reserve", "optimistic"),
}


_INT_LIMIT = 2**63 - 1  # beyond a 64-bit integer no count, time or setting is meaningful here


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and -_INT_LIMIT <= value <= _INT_LIMIT


def _shown(value: Any) -> str:
    """``repr(value)``, except for integers too long to print."""
    if isinstance(value, int) and not -_INT_LIMIT <= value <= _INT_LIMIT:
        return f"an integer of {value.bit_length()} bits"
    return repr(value)


def _check_line(line: Any, where: str) -> dict[str, Any]:
    if not isinstance(line, Mapping):
        raise ValueError(f"{where}: expected a JSON object, got {type(line).__name__}")
    kind = line.get("event")
    if not isinstance(kind, str) or kind not in TRACE_FIELDS:
        raise ValueError(f"{where}: event: must be 'arrival' or 'cancel', got {kind!r}")
    fields = TRACE_FIELDS[kind]
    unknown = sorted(set(line) - set(fields), key=str)
    if unknown:
        raise ValueError(f"{where}: unknown field {unknown[0]!r} in a {kind} line (allowed: {', '.join(fields)})")
    for name in fields:
        if name not in line:
            raise ValueError(f"{where}: {name}: missing from a {kind} line")
    if not _is_int(line["time"]) or line["time"] < 0:
        raise ValueError(f"{where}: time: must be a nonnegative integer, got {_shown(line['time'])}")
    if not isinstance(line["id"], str) or not line["id"]:
        raise ValueError(f"{where}: id: must be a non-empty string, got {_shown(line['id'])}")
    for name in ("prompt_tokens", "output_tokens"):
        if name in fields and (not _is_int(line[name]) or line[name] < 1):
            raise ValueError(f"{where}: {name}: must be a positive integer, got {_shown(line[name])}")
    return {name: line[name] for name in fields}


def validate_trace(
    events: Iterable[Mapping[str, Any]], labels: Sequence[str] | None = None
) -> list[dict[str, Any]]:
    """Check a trace; return fresh copies of its lines sorted stably by (time, cancel after arrival).

    Times are nonnegative integers, lengths positive integers, ids non-empty
    strings unique across the trace; a cancel names a request arriving at or
    before its time.  Unknown fields and booleans as integers are refused.
    ``labels`` optionally names where each line came from (default
    ``trace[i]``).  Raises ValueError naming the place and the field.
    """
    if isinstance(events, (str, bytes, Mapping)):
        raise ValueError(f"trace: expected a sequence of event objects, got {type(events).__name__}")
    try:
        lines = list(events)
    except TypeError:
        raise ValueError(f"trace: expected a sequence of event objects, got {type(events).__name__}") from None
    checked = []
    for i, line in enumerate(lines):
        where = labels[i] if labels is not None else f"trace[{i}]"
        clean = _check_line(line, where)
        checked.append((clean["time"], clean["event"] == "cancel", i, clean, where))
    checked.sort(key=lambda item: item[:3])
    arrived: set[str] = set()
    out = []
    for time, _, _, line, where in checked:
        rid = line["id"]
        if line["event"] == "arrival":
            if rid in arrived:
                raise ValueError(f"{where}: id: duplicate request id {rid!r} (ids must be unique in a trace)")
            arrived.add(rid)
        elif rid not in arrived:
            raise ValueError(f"{where}: id: cancel names {rid!r}, which has no arrival at or before time {time}")
        out.append(line)
    return out


def validate_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """Check scheduler settings; return a plain dict.  Unknown keys are refused."""
    unknown = sorted(set(config) - set(CONFIG_CHOICES))
    if unknown:
        raise ValueError(f"config: unknown setting {unknown[0]!r} (known: {', '.join(CONFIG_CHOICES)})")
    for name, rule in CONFIG_CHOICES.items():
        if name not in config:
            continue
        value = config[name]
        if isinstance(rule, tuple):
            if not isinstance(value, str) or value not in rule:
                raise ValueError(f"config: {name}: must be one of {', '.join(rule)}, got {_shown(value)}")
        elif not _is_int(value) or value < rule:
            kind = "positive" if rule == 1 else "nonnegative"
            raise ValueError(f"config: {name}: must be a {kind} integer, got {_shown(value)}")
    return dict(config)


def load_trace(path: str) -> list[dict[str, Any]]:
    """Read and validate a JSONL workload; errors name the file and line number."""
    lines: list[Any] = []
    labels: list[str] = []
    with open(path, "rb") as fh:
        for number, raw in enumerate(fh, start=1):
            where = f"{path} line {number}"
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise ValueError(f"{where}: not UTF-8 text (byte {exc.start + 1})") from None
            if not text.strip():
                continue
            try:
                lines.append(json.loads(text))
            except json.JSONDecodeError as exc:
                raise ValueError(f"{where}: invalid JSON: {exc.msg} (column {exc.colno})") from None
            except RecursionError:
                raise ValueError(f"{where}: invalid JSON: nested too deeply") from None
            except ValueError as exc:  # a number too long to read
                raise ValueError(f"{where}: invalid JSON: {exc}") from None
            labels.append(where)
    return validate_trace(lines, labels)


# -- the scheduler -------------------------------------------------------------

def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


class _Request:
    __slots__ = ("id", "prompt", "output", "arrival", "status", "admitted", "end", "token_times",
                 "written", "recompute_to", "claim", "held")

    def __init__(self, rid: str, prompt: int, output: int, arrival: int) -> None:
        self.id = rid
        self.prompt = prompt
        self.output = output
        self.arrival = arrival
        self.status = "queued"
        self.admitted: int | None = None
        self.end: int | None = None
        self.token_times: list[int] = []
        self.written = 0        # KV rows written in this incarnation
        self.recompute_to = 0   # rows to rebuild after a preemption
        self.claim = 0          # pages counted against admission while running
        self.held = 0           # its share of reserved_blocks: max(claim, pages in its table)

    def next_row(self, chunk: int, budget: int) -> tuple[str, int]:
        """Phase and size of this request's next row within ``budget``."""
        if self.written < self.recompute_to:
            return "recompute", min(chunk, self.recompute_to - self.written, budget)
        if self.written < self.prompt:
            return "prefill", min(chunk, self.prompt - self.written, budget)
        return "decode", 1


_Row = tuple[_Request, str, int]


class Scheduler:
    """The reference scheduler, one tick at a time.

    ``arrive`` and ``cancel`` act at the current tick ``now``; ``step()`` runs
    the rest of that tick (releases, admission, planning, snapshot, dispatch)
    and moves to the next tick; ``simulate`` instead jumps over idle ticks.
    Every event is appended to ``events`` (a long-running caller may clear it);
    ``report()`` builds the report of everything so far.
    """

    def __init__(self, *, capacity: int = 8, block_size: int = 4, token_budget: int = 4, max_active: int = 4,
                 prefill_chunk: int = 2, release_delay: int = 1, policy: str = "continuous",
                 admission: str = "reserve", check: bool = False) -> None:
        self.cfg = validate_config({
            "capacity": capacity, "block_size": block_size, "token_budget": token_budget,
            "max_active": max_active, "prefill_chunk": prefill_chunk,
            "release_delay": release_delay, "policy": policy, "admission": admission,
        })
        if not isinstance(check, bool):
            raise ValueError(f"check: must be true or false, got {check!r}")
        self.check = check
        self.bs = block_size
        self.capacity = capacity
        self.optimistic = admission == "optimistic"
        self.limit = 1 if policy == "serial" else max_active
        self.now = 0
        self.events: list[dict[str, Any]] = []
        self.requests: dict[str, _Request] = {}
        self.waiting: deque[_Request] = deque()
        self.active: list[_Request] = []                  # admission order
        self.releases: list[tuple[int, str]] = []         # heap of (release time, id)
        self.free: list[int] = list(range(capacity))      # heap: the lowest id goes first
        self.tables: dict[str, list[int]] = {}            # creation order; lists are replaced, never mutated
        self.draining_pages = 0
        self.reserved = 0                                 # sum of held over running requests
        self._ids: dict[str, list[str] | None] = {"active": None, "queued": None}  # shared by snapshots until changed
        self.decode_turn = 0
        self.prefill_turn = 0
        self.dispatches = 0
        self.input_tokens = 0
        self.preemptions = 0

    # -- trace events ----------------------------------------------------------
    def arrive(self, rid: str, prompt_tokens: int, output_tokens: int) -> None:
        """A request arrives now and joins the back of the queue."""
        if not isinstance(rid, str) or not rid or rid in self.requests:
            raise ValueError(f"id: must be a new non-empty string, got {rid!r}")
        for name, value in (("prompt_tokens", prompt_tokens), ("output_tokens", output_tokens)):
            if not _is_int(value) or value < 1:
                raise ValueError(f"{name}: must be a positive integer, got {value!r}")
        req = _Request(rid, prompt_tokens, output_tokens, self.now)
        self.requests[rid] = req
        self.waiting.append(req)
        self._ids["queued"] = None
        self.events.append({"time": self.now, "event": "arrival", "id": rid})

    def cancel(self, rid: str) -> None:
        """Cancel a request now: it retires if queued or running, else the cancel is ignored."""
        req = self.requests.get(rid)
        if req is None:
            raise ValueError(f"id: cancel names {rid!r}, which has not arrived")
        if req.status in ("queued", "active"):
            self._retire(req, "cancelled")
        else:
            self.events.append({"time": self.now, "event": "cancel_ignored", "id": rid, "status": req.status})

    def _retire(self, req: _Request, status: str) -> None:
        if req.status == "active":
            self.active.remove(req)
            self._ids["active"] = None
            self.reserved -= req.held
            req.held = 0
            self.draining_pages += len(self.tables[req.id])
            heapq.heappush(self.releases, (self.now + self.cfg["release_delay"], req.id))
        else:
            self.waiting.remove(req)
            self._ids["queued"] = None
        req.status = status
        req.end = self.now
        self.events.append({"time": self.now, "event": status, "id": req.id})

    # -- one boundary ----------------------------------------------------------
    def _release_due(self) -> None:
        while self.releases and self.releases[0][0] <= self.now:
            _, rid = heapq.heappop(self.releases)
            pages = self.tables.pop(rid)
            for page in pages:
                heapq.heappush(self.free, page)
            self.draining_pages -= len(pages)
            self.events.append({"time": self.now, "event": "release", "id": rid})

    def _need(self, req: _Request) -> int:
        if not self.optimistic:
            return _ceil_div(req.prompt + req.output - 1, self.bs)
        return _ceil_div(req.prompt + len(req.token_times), self.bs)

    def _hold(self, req: _Request) -> None:
        held = max(req.claim, len(self.tables[req.id]))
        self.reserved += held - req.held
        req.held = held

    def _admit(self) -> None:
        waiting = self.waiting
        while waiting and len(self.active) < self.limit:
            req = waiting[0]
            need = self._need(req)
            if _ceil_div(req.prompt + req.output - 1, self.bs) > self.capacity:
                self._retire(req, "rejected")
                continue
            if need > self.capacity - self.reserved - self.draining_pages:
                self.events.append({"time": self.now, "event": "admission_blocked", "id": req.id,
                                    "required_blocks": need})
                return
            waiting.popleft()
            req.status = "active"
            req.claim = need
            if req.admitted is None:
                req.admitted = self.now
            self.active.append(req)
            self._ids["active"] = self._ids["queued"] = None
            self.tables[req.id] = []
            self._hold(req)
            self.events.append({"time": self.now, "event": "admit", "id": req.id, "reserved_blocks": need})

    def _plan(self) -> tuple[list[_Row], int, int]:
        """The next dispatch's rows and how far each rotation turns."""
        budget = self.cfg["token_budget"]
        chunk = self.cfg["prefill_chunk"]
        decode: list[_Request] = []
        prefill: list[tuple[_Request, str]] = []
        for req in self.active:
            phase, _ = req.next_row(chunk, budget)
            if phase == "decode":
                decode.append(req)
            else:
                prefill.append((req, phase))
        rows: list[_Row] = []
        turn_d = turn_p = 0
        if decode:
            start = self.decode_turn % len(decode)
            for req in (decode[start:] + decode[:start])[:budget]:
                rows.append((req, "decode", 1))
            budget -= len(rows)
            turn_d = min(len(decode), self.cfg["token_budget"])
        if prefill and budget > 0:
            start = self.prefill_turn % len(prefill)
            for req, _ in prefill[start:] + prefill[:start]:
                phase, n = req.next_row(chunk, budget)
                if n == 0:
                    break
                rows.append((req, phase, n))
                budget -= n
                turn_p += 1
        return rows, turn_d, turn_p

    def _new_pages(self, rows: list[_Row]) -> dict[str, int]:
        bs, tables = self.bs, self.tables
        return {req.id: _ceil_div(req.written + n, bs) - len(tables[req.id]) for req, _, n in rows}

    def _preempt(self, req: _Request) -> None:
        self.active.remove(req)
        pages = self.tables.pop(req.id)
        for page in pages:
            heapq.heappush(self.free, page)
        self.reserved -= req.held
        req.recompute_to = max(req.recompute_to, req.written)
        req.written = req.claim = req.held = 0
        req.status = "queued"
        self.waiting.appendleft(req)
        self._ids["active"] = self._ids["queued"] = None
        self.preemptions += 1
        self.events.append({"time": self.now, "event": "preempted", "id": req.id, "released_blocks": len(pages)})

    def _boundary(self) -> list[_Row]:
        """Steps 2-5 of a tick: releases, admission, planning, snapshot; return the rows to dispatch."""
        self._release_due()
        self._admit()
        while True:
            rows, turn_d, turn_p = self._plan()
            planned = self._new_pages(rows)
            if sum(planned.values()) <= len(self.free):
                break
            if not self.optimistic:
                raise AssertionError(f"t={self.now}: reservation broken, the dispatch needs more pages than are free")
            if len(self.active) == 1:  # the oldest waits for draining pages; it yields to nobody
                rows, planned, turn_d, turn_p = [], {}, 0, 0
                break
            self._preempt(self.active[-1])
        self.decode_turn += turn_d
        self.prefill_turn += turn_p
        free = len(self.free)
        reserved = self.reserved
        if self.optimistic:  # pages the coming dispatch claims beyond a request's credit count as reserved
            tables = self.tables
            reserved += sum(max(req.claim, len(tables[req.id]) + planned[req.id]) - req.held for req, _, _ in rows)
        ids = self._ids
        if ids["active"] is None:
            ids["active"] = [r.id for r in self.active]
        if ids["queued"] is None:
            ids["queued"] = [r.id for r in self.waiting]
        self.events.append({
            "time": self.now,
            "event": "snapshot",
            "active": ids["active"],
            "queued": ids["queued"],
            "reserved_blocks": reserved,
            "draining_blocks": self.draining_pages,
            "allocated_blocks": self.capacity - free,
            "free_blocks": free,
            "admission_headroom": max(0, self.capacity - reserved - self.draining_pages),
            "block_tables": dict(self.tables),
        })
        return rows

    def _dispatch(self, rows: list[_Row]) -> None:
        """Step 7: emit the dispatch, advance the clock, write every row and commit its token."""
        used = sum(n for _, _, n in rows)
        self.events.append({
            "time": self.now, "event": "dispatch",
            "work": [{"id": req.id, "phase": phase, "input_tokens": n} for req, phase, n in rows],
            "unused_budget": self.cfg["token_budget"] - used,
        })
        self.dispatches += 1
        self.input_tokens += used
        self.now += 1
        now, bs, free, tables, emit = self.now, self.bs, self.free, self.tables, self.events.append
        for req, phase, n in rows:
            req.written += n
            table = tables[req.id]
            grow = _ceil_div(req.written, bs) - len(table)
            if grow > 0:
                tables[req.id] = table + [heapq.heappop(free) for _ in range(grow)]
                if len(table) + grow > req.claim:
                    self._hold(req)
            if phase == "recompute" or req.written != req.prompt + len(req.token_times):
                continue
            req.token_times.append(now)
            emit({"time": now, "event": "token", "id": req.id, "output_index": len(req.token_times)})
            if len(req.token_times) == req.output:
                self._retire(req, "finished")

    def step(self) -> list[dict[str, Any]]:
        """Run the rest of the current tick and move to the next; return the events it emitted."""
        start = len(self.events)
        rows = self._boundary()
        if rows:
            self._dispatch(rows)
        else:
            self.now += 1
        if self.check:
            self.verify()
        return self.events[start:]

    @property
    def busy(self) -> bool:
        """True while requests wait, run or await release."""
        return bool(self.waiting or self.active or self.releases)

    def pool_stats(self) -> dict[str, Any]:
        """The pool and queues right now (for gauges)."""
        free = len(self.free)
        return {
            "capacity": self.capacity, "free_blocks": free, "allocated_blocks": self.capacity - free,
            "reserved_blocks": self.reserved, "draining_blocks": self.draining_pages,
            "running": [r.id for r in self.active], "waiting": [r.id for r in self.waiting],
            "preemptions": self.preemptions,
        }

    def verify(self) -> None:
        """Full invariant scan: pages, reservations, queues; AssertionError on any break."""
        held = [p for table in self.tables.values() for p in table]
        assert sorted(held + self.free) == list(range(self.capacity)), f"t={self.now}: a page is lost or doubled"
        draining = sum(len(self.tables[rid]) for _, rid in self.releases)
        assert draining == self.draining_pages, f"t={self.now}: draining total drifted"
        assert len(self.tables) == len(self.active) + len(self.releases), f"t={self.now}: tables drifted"
        for req in self.active:
            assert len(self.tables[req.id]) == _ceil_div(req.written, self.bs), f"{req.id}: rows without pages"
        held = sum(max(r.claim, len(self.tables[r.id])) for r in self.active)
        assert self.reserved == held, f"t={self.now}: reservation total drifted"
        if not self.optimistic:
            assert self.reserved + self.draining_pages <= self.capacity, f"t={self.now}: negative headroom"

    def report(self) -> dict[str, Any]:
        """The report of the run so far; ``drained_at_tick`` is the current tick."""
        requests = {}
        counts = {"finished": 0, "cancelled": 0, "rejected": 0}
        for req in self.requests.values():
            times = req.token_times
            if req.status in counts:
                counts[req.status] += 1
            requests[req.id] = {
                "status": req.status,
                "arrival": req.arrival,
                "admitted": req.admitted,
                "end": req.end,
                "output_tokens": len(times),
                "token_times": times,
                "queue_ticks": None if req.admitted is None else req.admitted - req.arrival,
                "ttft_ticks": times[0] - req.arrival if times else None,
                "itl_ticks": [b - a for a, b in zip(times, times[1:])],
            }
        config = {k: v for k, v in self.cfg.items() if k != "admission"}
        if self.optimistic:
            config["admission"] = "optimistic"
        return {
            "schema_version": SCHEMA_VERSION,
            "time_unit": TIME_UNIT,
            "config": config,
            "requests": requests,
            "events": self.events,
            "summary": {
                "drained_at_tick": self.now,
                "dispatches": self.dispatches,
                "processed_input_tokens": self.input_tokens,
                "free_blocks": len(self.free),
                **counts,
            },
        }


def simulate(
    events: Iterable[Mapping[str, Any]],
    *,
    capacity: int = 8,
    block_size: int = 4,
    token_budget: int = 4,
    max_active: int = 4,
    prefill_chunk: int = 2,
    release_delay: int = 1,
    policy: str = "continuous",
    admission: str = "reserve",
    check: bool = False,
) -> dict[str, Any]:
    """Replay ``events`` (trace lines) and return the report.

    The trace and the config are validated first; bad input raises ValueError
    naming the field and nothing is simulated.  The input is never mutated.
    The same trace and config always give an identical report.  ``check=True``
    rescans the whole pool after every tick and raises AssertionError on any
    broken invariant (slower; for tests).
    """
    sched = Scheduler(capacity=capacity, block_size=block_size, token_budget=token_budget, max_active=max_active,
                      prefill_chunk=prefill_chunk, release_delay=release_delay, policy=policy,
                      admission=admission, check=check)
    return drive(sched, validate_trace(events))


def drive(sched: Scheduler, trace: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Replay a validated, sorted ``trace`` on ``sched`` from tick 0, jumping over idle ticks; return the report."""
    i, n = 0, len(trace)
    while i < n or sched.busy:
        while i < n and trace[i]["time"] == sched.now:
            line = trace[i]
            i += 1
            if line["event"] == "arrival":
                sched.arrive(line["id"], line["prompt_tokens"], line["output_tokens"])
            else:
                sched.cancel(line["id"])
        rows = sched._boundary()
        if rows:
            sched._dispatch(rows)
        else:
            upcoming = [trace[i]["time"]] if i < n else []
            if sched.releases:
                upcoming.append(sched.releases[0][0])
            if not upcoming:
                break
            sched.now = min(upcoming)
        if sched.check:
            sched.verify()
    return sched.report()


def _summary_line(report: dict[str, Any]) -> str:
    s = report["summary"]
    return (
        f"{report['config']['policy']}: {s['dispatches']} dispatches, "
        f"{s['processed_input_tokens']} input tokens, finished {s['finished']}, "
        f"cancelled {s['cancelled']}, rejected {s['rejected']}, drained at tick "
        f"{s['drained_at_tick']}, {s['free_blocks']} free pages"
    )


def write_json_atomic(path: str, document: Any) -> None:
    """Write ``document`` as JSON to ``path`` via a temporary file and a rename."""
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".json", dir=folder)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(document, fh, indent=2)
            fh.write("\n")
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def build_parser(prog: str | None = None) -> argparse.ArgumentParser:
    """The command line of ``scheduler_sim.py`` (also ``cbatch simulate``)."""
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Replay a workload on the reference continuous-batching scheduler.",
    )
    parser.add_argument("--trace", metavar="JSONL", help="workload file (default: the built-in demo trace)")
    parser.add_argument("--output", metavar="PATH", help="write the JSON report here (default: print it)")
    parser.add_argument("--policy", choices=["continuous", "serial"], default="continuous")
    parser.add_argument("--admission", choices=["reserve", "optimistic"], default="reserve",
                        help="reserve (the course's behaviour, default) or optimistic (an extension: "
                             "on-demand pages and preemption)")
    for name in ("capacity", "block_size", "token_budget", "max_active", "prefill_chunk", "release_delay"):
        parser.add_argument(
            "--" + name.replace("_", "-"), dest=name, type=int, default=DEFAULT_CONFIG[name],
            metavar="N", help=f"default {DEFAULT_CONFIG[name]}",
        )
    parser.add_argument("--check", action="store_true", help="rescan every invariant after each tick")
    return parser


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    """Command-line entry point; returns the exit status (2 on bad input)."""
    args = build_parser(prog).parse_args(argv)
    config = {k: getattr(args, k) for k in DEFAULT_CONFIG}
    try:
        trace = load_trace(args.trace) if args.trace else demo_trace()
        report = simulate(trace, check=args.check, **config)
    except (ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.output:
        try:
            write_json_atomic(args.output, report)
        except OSError as exc:
            print(f"error: cannot write {args.output}: {exc}", file=sys.stderr)
            return 2
        print(f"{_summary_line(report)} -> {args.output}")
    else:
        json.dump(report, sys.stdout, indent=2)
        sys.stdout.write("\n")
    return 0


# ==== PagedKV: the published lifecycle allocator (owned by the lifecycle work) ====
# Uses only the module's ``heapq`` import; scheduler_faults.py beside this file imports it.


class Page:
    """One KV page: the owners whose tables list it, the pins holding it, and its token rows."""

    __slots__ = ("owners", "pins", "tokens")

    def __init__(self, owners: set[str] | None = None, pins: set[str] | None = None,
                 tokens: list[int] | None = None) -> None:
        self.owners: set[str] = set() if owners is None else owners
        self.pins: set[str] = set() if pins is None else pins
        self.tokens: list[int] = [] if tokens is None else tokens

    def __repr__(self) -> str:
        return f"Page(owners={self.owners!r}, pins={self.pins!r}, tokens={self.tokens!r})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Page):
            return NotImplemented
        return (self.owners, self.pins, self.tokens) == (other.owners, other.pins, other.tokens)


class PagedKV:
    """A pool of ``capacity`` pages of ``block_size`` token rows: shared pages, copy-on-write, pins.

    Token integers stand in for KV rows.  Public state, all live views:

    * ``free``: the free page ids, a min-heap, so the lowest free id is taken first;
    * ``pages``: ``{id: Page}`` for every allocated page (held by an owner or a pin);
    * ``tables``: ``{owner: [page ids]}``, each table's non-tail pages full;
    * ``transfers``: ``{pin name: tuple of page ids}``.

    A page is free exactly when no table lists it and no pin holds it.  ``fork``
    shares every page, partial tail included.  ``append`` writes in place only
    into a tail page nobody else sees: a partial tail that another owner shares
    or any pin holds is first copied to a fresh page (synchronous copy-on-write),
    so pinned views stay frozen.  ``append`` raises MemoryError, changing
    nothing, exactly when it needs a page (tail absent, full, or to be copied)
    and none is free.  Duplicate names raise ValueError, unknown ones KeyError.
    """

    def __init__(self, capacity: int, block_size: int) -> None:
        for name, value in (("capacity", capacity), ("block_size", block_size)):
            if type(value) is not int or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        self.capacity = capacity
        self.block_size = block_size
        self.free: list[int] = list(range(capacity))  # sorted, hence already a heap
        self.pages: dict[int, Page] = {}
        self.tables: dict[str, list[int]] = {}
        self.transfers: dict[str, tuple[int, ...]] = {}

    def create(self, owner: str) -> None:
        """Register ``owner`` with an empty table; ValueError if it exists."""
        if owner in self.tables:
            raise ValueError(f"owner {owner!r} already exists")
        self.tables[owner] = []

    def fork(self, source: str, target: str) -> None:
        """Make ``target`` share every page of ``source``; allocates nothing. ValueError if target exists."""
        if target in self.tables:
            raise ValueError(f"target {target!r} already exists")
        table = self._table(source)
        self.tables[target] = list(table)
        for page_id in table:
            self.pages[page_id].owners.add(target)

    def read(self, owner: str) -> list[int]:
        """The owner's token rows, in order."""
        pages = self.pages
        return [token for page_id in self._table(owner) for token in pages[page_id].tokens]

    def append(self, owner: str, token: int) -> None:
        """Write one row at the end of ``owner``; MemoryError, changing nothing, if a page is needed and none is free."""
        if type(token) is not int:
            raise ValueError(f"a token must be an int, got {token!r}")
        table = self._table(owner)
        if table:
            tail = self.pages[table[-1]]
            if len(tail.tokens) < self.block_size:
                if len(tail.owners) > 1 or tail.pins:
                    copy = self._allocate(owner, list(tail.tokens))
                    tail.owners.discard(owner)  # another owner or a pin still holds it: never freed here
                    table[-1] = copy
                    tail = self.pages[copy]
                tail.tokens.append(token)
                return
        page_id = self._allocate(owner, [token])
        table.append(page_id)

    def pin(self, owner: str, name: str) -> tuple[int, ...]:
        """Hold the owner's current pages under ``name`` and return their ids; ValueError if the name exists."""
        if name in self.transfers:
            raise ValueError(f"pin {name!r} already exists")
        pages = tuple(self._table(owner))
        self.transfers[name] = pages
        for page_id in pages:
            self.pages[page_id].pins.add(name)
        return pages

    def unpin(self, name: str) -> None:
        """Drop a pin; pages nothing else holds become free."""
        try:
            pages = self.transfers.pop(name)
        except KeyError:
            raise KeyError(f"unknown pin {name!r}") from None
        for page_id in pages:
            self.pages[page_id].pins.discard(name)
            self._collect(page_id)

    def release(self, owner: str) -> None:
        """Drop ``owner`` and its table; pages nothing else holds become free."""
        table = self._table(owner)
        del self.tables[owner]
        for page_id in table:
            self.pages[page_id].owners.discard(owner)
            self._collect(page_id)

    def check(self) -> None:
        """Verify every invariant of the pool; AssertionError names the first one broken."""
        free = self.free
        assert len(free) == len(set(free)), f"the free list holds a page twice: {sorted(free)}"
        both = set(free) & set(self.pages)
        assert not both, f"pages {sorted(both)} are both free and allocated"
        assert set(free) | set(self.pages) == set(range(self.capacity)), (
            f"free {sorted(free)} and allocated {sorted(self.pages)} do not cover 0..{self.capacity - 1}"
        )
        for owner, table in self.tables.items():
            assert len(table) == len(set(table)), f"owner {owner!r} lists a page twice: {table}"
            for offset, page_id in enumerate(table):
                page = self.pages.get(page_id)
                assert page is not None, f"owner {owner!r} lists page {page_id}, which is free"
                assert owner in page.owners, f"page {page_id} does not know its owner {owner!r}"
                fill = len(page.tokens)
                full = offset < len(table) - 1
                assert (fill == self.block_size) if full else (1 <= fill <= self.block_size), (
                    f"owner {owner!r}: page {page_id} holds {fill} of {self.block_size} rows"
                )
        for name, pages in self.transfers.items():
            for page_id in pages:
                assert page_id in self.pages, f"pin {name!r} holds page {page_id}, which is free"
        for page_id, page in self.pages.items():
            assert page.owners or page.pins, f"page {page_id} is allocated but nothing holds it"
            owners = {owner for owner, table in self.tables.items() if page_id in table}
            assert page.owners == owners, f"page {page_id} names owners {page.owners}, tables say {owners}"
            pins = {name for name, pages in self.transfers.items() if page_id in pages}
            assert page.pins == pins, f"page {page_id} names pins {page.pins}, transfers say {pins}"

    def _table(self, owner: str) -> list[int]:
        try:
            return self.tables[owner]
        except KeyError:
            raise KeyError(f"unknown owner {owner!r}") from None

    def _allocate(self, owner: str, tokens: list[int]) -> int:
        if not self.free:
            raise MemoryError("no free KV page")
        page_id = heapq.heappop(self.free)
        self.pages[page_id] = Page({owner}, set(), tokens)
        return page_id

    def _collect(self, page_id: int) -> None:
        page = self.pages[page_id]
        if not page.owners and not page.pins:
            del self.pages[page_id]
            heapq.heappush(self.free, page_id)


# ==== end PagedKV ====


if __name__ == "__main__":
    sys.exit(main())
