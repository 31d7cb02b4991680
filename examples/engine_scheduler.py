"""An engine-style scheduler: every legitimate choice made the other way from the reference.

Written from the contract, not from the reference simulator (it shares only
the kit's input validator), and shaped like a production engine's scheduler
(vLLM's V1 scheduler allocates in ``schedule()`` the same way).  It exists to
prove that the contract judges behaviour every correct scheduler shares, not
the reference's own timing choices::

    pytest --cbatch-impl=pytest_cbatch.examples.engine_scheduler:simulate

Where the reference (the course's published simulator) does one thing, this
one does the other, and both must pass every clause:

* **Page timing.**  Pages for a row are allocated while the step is scheduled,
  so the snapshot already shows the pages its dispatch writes into (the
  reference allocates while the dispatch runs and snapshots the tables before).
* **Page ids.**  Freed pages go to the back of a FIFO free list (the
  reference takes the lowest free id).
* **Rotation and row order.**  No rotation, and rows follow the running order
  whatever their phase (the reference puts decode rows first and rotates).
* **Impossible requests** are rejected on arrival (the reference rejects one
  when it reaches the head of the queue with a free slot).
* **Releases.**  A request that holds no pages when it ends (cancelled before
  its first row was scheduled) gets no release event.
* **Events.**  ``admission_blocked`` once per wait, not every tick; a tick's
  trace lines in trace order, not arrivals first; snapshots only before a
  dispatch, never on idle ticks or after the last release; snapshot
  ``active``/``queued`` left out; ``drained_at_tick`` is the last release.
* **Preemption** (``admission="optimistic"``): admission needs only the pages
  of the first chunk; when a running request cannot get a page the newest
  running request is preempted (vLLM's victim), nothing is admitted in a step
  that preempted, and the victim recomputes its committed rows when it is back.

The course fixes one thing both share: a dispatch's results (tokens, finished)
commit at the next boundary, before that boundary's arrivals and cancels.
"""

from __future__ import annotations

import os
import sys
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

try:
    from pytest_cbatch.reference.scheduler_sim import validate_config, validate_trace
except ImportError:  # an uninstalled checkout: the kit's validator sits in ../reference
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "reference"))
    from scheduler_sim import validate_config, validate_trace

__all__ = ["simulate"]

TERMINAL = ("finished", "cancelled", "rejected")


def _pages(rows: int, block_size: int) -> int:
    return -(-rows // block_size)


@dataclass(eq=False)
class _Request:
    id: str
    prompt: int
    output: int
    arrival: int
    status: str = "waiting"            # waiting, running, or a terminal status
    admitted: int | None = None
    end: int | None = None
    kv: int = 0                        # KV rows computed in this incarnation
    rebuild: int = 0                   # rows to recompute after a preemption
    tokens: list[int] = field(default_factory=list)
    table: list[int] = field(default_factory=list)
    blocked: bool = False

    def next_row(self, chunk: int, budget: int) -> tuple[str, int]:
        if self.kv < self.rebuild:
            return "recompute", min(chunk, self.rebuild - self.kv, budget)
        if self.kv < self.prompt:
            return "prefill", min(chunk, self.prompt - self.kv, budget)
        return "decode", 1

    def emits_after(self, rows: int) -> bool:
        """Whether feeding ``rows`` more rows completes a sample (the prompt, or the pending token)."""
        return self.kv + rows == self.prompt + len(self.tokens)


class _Engine:
    def __init__(self, config: dict[str, Any]) -> None:
        self.cfg = config
        self.bs: int = config["block_size"]
        self.capacity: int = config["capacity"]
        self.optimistic = config.get("admission") == "optimistic"
        self.limit = 1 if config["policy"] == "serial" else config["max_active"]
        self.free: deque[int] = deque(range(self.capacity))
        self.waiting: deque[_Request] = deque()
        self.running: list[_Request] = []
        self.draining: list[tuple[int, _Request]] = []      # (release tick, request), in retire order
        self.requests: dict[str, _Request] = {}
        self.events: list[dict[str, Any]] = []
        self.in_flight: list[tuple[_Request, str, int]] = []
        self.dispatches = self.fed = 0

    def emit(self, t: int, kind: str, **fields: Any) -> None:
        self.events.append({"time": t, "event": kind, **fields})

    # -- boundary -----------------------------------------------------------------
    def commit(self, t: int) -> None:
        for req, phase, n in self.in_flight:
            done = phase != "recompute" and req.emits_after(n)
            req.kv += n
            if done:
                req.tokens.append(t)
                self.emit(t, "token", id=req.id, output_index=len(req.tokens))
                if len(req.tokens) == req.output:
                    self.retire(t, req, "finished")
        self.in_flight = []

    def arrive(self, t: int, line: Mapping[str, Any]) -> None:
        req = _Request(line["id"], line["prompt_tokens"], line["output_tokens"], t)
        self.requests[req.id] = req
        self.emit(t, "arrival", id=req.id)
        self.waiting.append(req)
        if _pages(req.prompt + req.output - 1, self.bs) > self.capacity:
            self.retire(t, req, "rejected")

    def cancel(self, t: int, req: _Request) -> None:
        if req.status in TERMINAL:
            self.emit(t, "cancel_ignored", id=req.id, status=req.status)
        else:
            self.retire(t, req, "cancelled")

    def retire(self, t: int, req: _Request, status: str) -> None:
        if req.status == "running":
            self.running.remove(req)
            if req.table:  # nothing to release for a request that holds no pages
                self.draining.append((t + self.cfg["release_delay"], req))
        elif req.status == "waiting":
            self.waiting.remove(req)
        req.status, req.end = status, t
        self.emit(t, status, id=req.id)

    def release_due(self, t: int) -> None:
        due = [(at, req) for at, req in self.draining if at <= t]
        self.draining = [(at, req) for at, req in self.draining if at > t]
        for _, req in due:
            self.free.extend(req.table)
            req.table = []
            self.emit(t, "release", id=req.id)

    # -- scheduling -----------------------------------------------------------------
    def grow(self, req: _Request, rows: int) -> bool:
        """Allocate the pages ``rows`` more rows need; False (and nothing taken) if they are not free."""
        need = _pages(req.kv + rows, self.bs) - len(req.table)
        if need > len(self.free):
            return False
        req.table = req.table + [self.free.popleft() for _ in range(max(0, need))]
        return True

    def preempt(self, t: int, victim: _Request) -> None:
        self.running.remove(victim)
        self.free.extend(victim.table)
        self.emit(t, "preempted", id=victim.id, released_blocks=len(victim.table))
        victim.table, victim.rebuild, victim.kv = [], max(victim.rebuild, victim.kv), 0
        victim.status = "waiting"
        self.waiting.appendleft(victim)

    def reserved(self) -> int:
        if self.optimistic:
            return sum(len(r.table) for r in self.running)
        return sum(_pages(r.prompt + r.output - 1, self.bs) for r in self.running)

    def schedule(self, t: int) -> list[tuple[_Request, str, int]]:
        budget = self.cfg["token_budget"]
        chunk = self.cfg["prefill_chunk"]
        rows: list[tuple[_Request, str, int]] = []
        preempted = False
        for req in list(self.running):
            if budget == 0 or req.status != "running":
                continue
            phase, n = req.next_row(chunk, budget)
            while not self.grow(req, n):
                if not self.optimistic or len(self.running) == 1:
                    break  # reserve never runs dry; a lone request waits for draining pages
                victim = self.running[-1]  # the newest; it has no row yet, since rows follow running order
                self.preempt(t, victim)
                preempted = True
                if victim is req:
                    break
            else:
                rows.append((req, phase, n))
                budget -= n
        budget = self.cfg["token_budget"] - sum(n for _, _, n in rows)
        while not preempted and self.waiting and len(self.running) < self.limit:
            req = self.waiting[0]
            phase, n = req.next_row(chunk, max(budget, 1))
            if self.optimistic:
                need = _pages(n, self.bs)
                fits = need <= len(self.free)
            else:
                need = _pages(req.prompt + req.output - 1, self.bs)
                fits = need <= self.capacity - self.reserved() - self.draining_pages()
            if not fits:
                if not req.blocked:
                    req.blocked = True
                    self.emit(t, "admission_blocked", id=req.id, required_blocks=need)
                break
            self.waiting.popleft()
            req.status, req.blocked = "running", False
            if req.admitted is None:
                req.admitted = t
            self.running.append(req)
            self.emit(t, "admit", id=req.id, reserved_blocks=need)
            if budget > 0 and self.grow(req, min(n, budget)):
                rows.append((req, phase, min(n, budget)))
                budget -= min(n, budget)
        return rows

    def draining_pages(self) -> int:
        return sum(len(req.table) for _, req in self.draining)

    def snapshot(self, t: int) -> None:
        reserved, draining = self.reserved(), self.draining_pages()
        holders = self.running + [req for _, req in self.draining]
        self.emit(t, "snapshot", reserved_blocks=reserved, draining_blocks=draining,
                  allocated_blocks=self.capacity - len(self.free), free_blocks=len(self.free),
                  admission_headroom=max(0, self.capacity - reserved - draining),
                  block_tables={req.id: list(req.table) for req in holders if req.table})

    def dispatch(self, t: int, rows: list[tuple[_Request, str, int]]) -> None:
        used = sum(n for _, _, n in rows)
        self.emit(t, "dispatch", work=[{"id": r.id, "phase": p, "input_tokens": n} for r, p, n in rows],
                  unused_budget=self.cfg["token_budget"] - used)
        self.in_flight = rows
        self.dispatches += 1
        self.fed += used

    # -- the run ----------------------------------------------------------------------
    def run(self, lines: list[dict[str, Any]]) -> dict[str, Any]:
        pos = 0
        t = lines[0]["time"] if lines else 0
        while True:
            self.commit(t)
            deferred = []
            while pos < len(lines) and lines[pos]["time"] == t:
                line = lines[pos]
                pos += 1
                if line["event"] == "arrival":
                    self.arrive(t, line)
                elif line["id"] in self.requests:
                    self.cancel(t, self.requests[line["id"]])
                else:  # its arrival comes later in this tick's lines
                    deferred.append(line["id"])
            for rid in deferred:
                self.cancel(t, self.requests[rid])
            self.release_due(t)
            rows = self.schedule(t)
            if rows:
                self.snapshot(t)
                self.dispatch(t, rows)
                t += 1
                continue
            upcoming = [lines[pos]["time"]] if pos < len(lines) else []
            upcoming += [at for at, _ in self.draining[:1]]
            if not upcoming:
                if self.running or self.waiting:
                    raise AssertionError(f"t={t}: requests left with nothing that could free a page")
                return self.report()
            t = min(upcoming)

    def report(self) -> dict[str, Any]:
        table = {}
        for req in self.requests.values():
            times = req.tokens
            table[req.id] = {
                "status": req.status, "arrival": req.arrival, "admitted": req.admitted, "end": req.end,
                "output_tokens": len(times), "token_times": list(times),
                "queue_ticks": None if req.admitted is None else req.admitted - req.arrival,
                "ttft_ticks": times[0] - req.arrival if times else None,
                "itl_ticks": [b - a for a, b in zip(times, times[1:])],
            }
        releases = [ev["time"] for ev in self.events if ev["event"] == "release"]
        statuses = [req.status for req in self.requests.values()]
        return {
            "schema_version": 1, "time_unit": "synthetic_tick", "config": dict(self.cfg),
            "requests": table, "events": self.events,
            "summary": {
                "drained_at_tick": releases[-1] if releases else (self.events[-1]["time"] if self.events else 0),
                "dispatches": self.dispatches, "processed_input_tokens": self.fed,
                "free_blocks": len(self.free), **{s: statuses.count(s) for s in TERMINAL},
            },
        }


def simulate(
    trace: Iterable[Mapping[str, Any]],
    *,
    capacity: int = 8,
    block_size: int = 4,
    token_budget: int = 4,
    max_active: int = 4,
    prefill_chunk: int = 2,
    release_delay: int = 1,
    policy: str = "continuous",
    admission: str = "reserve",
) -> dict[str, Any]:
    """Replay ``trace`` engine-style and return the report.

    Invalid traces or settings raise ValueError naming the field; the input is
    never mutated; the same input always gives the same report.  A tick's
    trace lines are taken in the order given (stably by time), not arrivals
    first.
    """
    config = validate_config({
        "capacity": capacity, "block_size": block_size, "token_budget": token_budget,
        "max_active": max_active, "prefill_chunk": prefill_chunk,
        "release_delay": release_delay, "policy": policy, "admission": admission,
    })
    if admission == "reserve":
        del config["admission"]
    lines = list(trace)
    validate_trace(lines)
    ordered = sorted((dict(line) for line in lines), key=lambda line: line["time"])
    return _Engine(config).run(ordered)
