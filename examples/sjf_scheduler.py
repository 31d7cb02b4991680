"""A shortest-job-first scheduler: an example of writing an implementation for pytest-cbatch.

This scheduler was written from scratch against the contract
(the ``pytest_cbatch.contract`` package), not derived from the reference simulator; it
shares only the kit's input validator.  Check it like any other engine::

    pytest --cbatch-impl=pytest_cbatch.examples.sjf_scheduler:simulate
    pytest --cbatch-impl="exec:python examples/exec_scheduler.py"   # the same, out of process

What an implementation must provide is ``simulate(trace, **config) -> report``:
refuse invalid input with ValueError, never mutate its arguments, and return
the JSON-ready report (config, one row per request, the ordered events,
summary counts) described by ``schemas/report.schema.json``.  The settings it
accepts are its capabilities: this one has no ``admission`` keyword, so the kit
skips the optimistic-admission (preemption) workloads for it.

The tick semantics are the ones every checked engine shares.  At boundary ``t``:

1. the dispatch of ``t - 1`` commits: ``token`` events in row order, each
   request's ``finished`` right after its last token;
2. the trace's lines at ``t`` in trace order: ``arrival`` (``rejected`` at
   once if the request could not fit the pool even alone) and ``cancel``
   (``cancelled``, or ``cancel_ignored`` with the status of a request that
   already ended);
3. ``release`` of ended requests whose ``release_delay`` has passed;
4. admission;
5. the next dispatch is planned;
6. a ``snapshot`` of the pool shows the block tables that dispatch writes into;
7. the ``dispatch``, whose results commit at ``t + 1``.

The policy is this scheduler's own, and all of it is legal under the contract:

* **Admission** is shortest job first: the queue is ordered by prompt + output
  tokens, ties by arrival order.  The head waits (``admission_blocked``, once)
  while its pages do not fit; nobody behind it could fit either, since a longer
  job needs at least as many pages.  ``policy="serial"`` admits one at a time.
* **Pages** are reserved for the whole sequence, ``ceil((prompt + output - 1)
  / block_size)`` (the last sampled token is never fed back), and allocated at
  admission, lowest page ids first, so a running request never needs more and
  nothing is ever preempted.  Pages of an ended request drain for
  ``release_delay`` ticks before they are free again.
* **Dispatch rows** follow admission order without rotation: one decode row
  per decoding request, then chunked prefill rows, until the token budget is
  spent.
"""

from __future__ import annotations

import bisect
import heapq
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

__all__ = ["simulate", "pages_needed"]

TERMINAL = ("finished", "cancelled", "rejected")


def pages_needed(prompt: int, output: int, block_size: int) -> int:
    """Pages a request's whole sequence occupies: every row but the last sampled token."""
    return -(-(prompt + output - 1) // block_size)


@dataclass(eq=False)
class _Request:
    """One request's progress; ``fed`` counts the input rows whose KV exists."""

    id: str
    prompt: int
    output: int
    arrival: int
    order: int                          # position among the trace's arrivals (SJF tie-break)
    status: str = "queued"              # queued, active, or a terminal status
    admitted: int | None = None
    end: int | None = None
    fed: int = 0
    token_times: list[int] = field(default_factory=list)
    pages: list[int] = field(default_factory=list)
    blocked_reported: bool = False

    def job_size(self) -> tuple[int, int]:
        """The SJF queue key: total tokens, then arrival order."""
        return self.prompt + self.output, self.order

    def decoding(self) -> bool:
        """True once the prompt is fed (its last prefill row emitted the first token)."""
        return self.fed >= self.prompt


class _SjfScheduler:
    """Replays a validated trace under a validated config; ``run`` returns the report."""

    def __init__(self, trace: list[dict[str, Any]], config: dict[str, Any]) -> None:
        self.trace = trace
        self.config = config
        self.capacity: int = config["capacity"]
        self.block_size: int = config["block_size"]
        self.max_active: int = 1 if config["policy"] == "serial" else config["max_active"]
        self.requests: dict[str, _Request] = {}
        self.queue: list[_Request] = []         # kept sorted by job_size
        self.active: list[_Request] = []        # admission order
        self.draining: deque[tuple[int, _Request]] = deque()  # (release tick, request), due in order
        self.free: list[int] = list(range(self.capacity))      # a heap: lowest page id first
        self.in_flight: list[tuple[_Request, int]] = []         # (request, rows) of the last dispatch
        self.events: list[dict[str, Any]] = []
        self.dispatches = 0
        self.input_tokens = 0

    def emit(self, t: int, kind: str, **fields: Any) -> None:
        """Append one event to the report."""
        self.events.append({"time": t, "event": kind, **fields})

    def run(self) -> dict[str, Any]:
        """Visit tick boundaries until nothing is queued, running or draining."""
        pos = 0
        t = self.trace[0]["time"] if self.trace else 0
        while True:
            self.commit(t)
            while pos < len(self.trace) and self.trace[pos]["time"] == t:
                line = self.trace[pos]
                pos += 1
                if line["event"] == "arrival":
                    self.arrive(t, line)
                else:
                    self.cancel(t, self.requests[line["id"]])
            self.release_due(t)
            self.admit(t)
            rows = self.plan()
            self.snapshot(t)
            if rows:
                self.dispatch(t, rows)
                t += 1
                continue
            upcoming = [self.trace[pos]["time"]] if pos < len(self.trace) else []
            if self.draining:
                upcoming.append(self.draining[0][0])
            if not upcoming:
                return self.report(t)
            t = min(upcoming)

    # -- boundary steps, in tick order -----------------------------------------
    def commit(self, t: int) -> None:
        """Step 1: the last dispatch's rows land; a row that completes the prompt,
        or any decode row, samples one output token."""
        for req, rows in self.in_flight:
            req.fed += rows
            if req.fed == req.prompt + len(req.token_times):
                req.token_times.append(t)
                self.emit(t, "token", id=req.id, output_index=len(req.token_times))
                if len(req.token_times) == req.output:
                    self.emit(t, "finished", id=req.id)
                    self.retire(t, req, "finished")
        self.in_flight = []

    def arrive(self, t: int, line: Mapping[str, Any]) -> None:
        """Step 2: queue a new request, or reject one the pool could never hold."""
        req = _Request(line["id"], line["prompt_tokens"], line["output_tokens"], t, len(self.requests))
        self.requests[req.id] = req
        self.emit(t, "arrival", id=req.id)
        if pages_needed(req.prompt, req.output, self.block_size) > self.capacity:
            req.status, req.end = "rejected", t
            self.emit(t, "rejected", id=req.id)
        else:
            bisect.insort(self.queue, req, key=_Request.job_size)

    def cancel(self, t: int, req: _Request) -> None:
        """Step 2: end a queued or running request; a request that already ended is left alone."""
        if req.status in TERMINAL:
            self.emit(t, "cancel_ignored", id=req.id, status=req.status)
            return
        self.emit(t, "cancelled", id=req.id)
        if req.status == "active":
            self.retire(t, req, "cancelled")
        else:
            self.queue.remove(req)
            req.status, req.end = "cancelled", t

    def retire(self, t: int, req: _Request, status: str) -> None:
        """End a running request; its pages drain until ``t + release_delay``."""
        self.active.remove(req)
        req.status, req.end = status, t
        self.draining.append((t + self.config["release_delay"], req))

    def release_due(self, t: int) -> None:
        """Step 3: drained pages return to the free heap."""
        while self.draining and self.draining[0][0] <= t:
            _, req = self.draining.popleft()
            for page in req.pages:
                heapq.heappush(self.free, page)
            req.pages = []
            self.emit(t, "release", id=req.id)

    def admit(self, t: int) -> None:
        """Step 4: admit the shortest jobs while slots and free pages allow."""
        while self.queue and len(self.active) < self.max_active:
            req = self.queue[0]
            need = pages_needed(req.prompt, req.output, self.block_size)
            if need > len(self.free):
                if not req.blocked_reported:
                    req.blocked_reported = True
                    self.emit(t, "admission_blocked", id=req.id, required_blocks=need)
                return
            self.queue.pop(0)
            req.status, req.admitted = "active", t
            req.pages = [heapq.heappop(self.free) for _ in range(need)]
            self.active.append(req)
            self.emit(t, "admit", id=req.id, reserved_blocks=need)

    def plan(self) -> list[tuple[_Request, str, int]]:
        """Step 5: decode rows, then prefill rows, each in admission order, within the budget."""
        budget = self.config["token_budget"]
        rows: list[tuple[_Request, str, int]] = []
        for req in (r for r in self.active if r.decoding()):
            if budget == 0:
                return rows
            rows.append((req, "decode", 1))
            budget -= 1
        for req in (r for r in self.active if not r.decoding()):
            if budget == 0:
                break
            n = min(self.config["prefill_chunk"], req.prompt - req.fed, budget)
            rows.append((req, "prefill", n))
            budget -= n
        return rows

    def snapshot(self, t: int) -> None:
        """Step 6: the pool as the next dispatch sees it."""
        holders = self.active + [req for _, req in self.draining]
        reserved = sum(len(req.pages) for req in self.active)
        draining = sum(len(req.pages) for _, req in self.draining)
        self.emit(
            t, "snapshot",
            active=len(self.active),
            queued=len(self.queue),
            reserved_blocks=reserved,
            draining_blocks=draining,
            allocated_blocks=self.capacity - len(self.free),
            free_blocks=len(self.free),
            admission_headroom=self.capacity - reserved - draining,
            block_tables={req.id: list(req.pages) for req in holders},
        )

    def dispatch(self, t: int, rows: list[tuple[_Request, str, int]]) -> None:
        """Step 7: one forward pass; its rows commit at the next boundary."""
        used = sum(n for _, _, n in rows)
        work = [{"id": req.id, "phase": phase, "input_tokens": n} for req, phase, n in rows]
        self.emit(t, "dispatch", work=work, unused_budget=self.config["token_budget"] - used)
        self.in_flight = [(req, n) for req, _, n in rows]
        self.dispatches += 1
        self.input_tokens += used

    # -- the report --------------------------------------------------------------
    def report(self, t_end: int) -> dict[str, Any]:
        """The JSON-ready report of the finished run."""
        table: dict[str, dict[str, Any]] = {}
        for req in self.requests.values():
            times = req.token_times
            table[req.id] = {
                "status": req.status,
                "arrival": req.arrival,
                "admitted": req.admitted,
                "end": req.end,
                "output_tokens": len(times),
                "token_times": list(times),
                "queue_ticks": None if req.admitted is None else req.admitted - req.arrival,
                "ttft_ticks": times[0] - req.arrival if times else None,
                "itl_ticks": [b - a for a, b in zip(times, times[1:])],
            }
        statuses = [req.status for req in self.requests.values()]
        return {
            "schema_version": 1,
            "time_unit": "synthetic_tick",
            "config": dict(self.config),
            "requests": table,
            "events": self.events,
            "summary": {
                "drained_at_tick": t_end,
                "dispatches": self.dispatches,
                "processed_input_tokens": self.input_tokens,
                "free_blocks": len(self.free),
                **{status: statuses.count(status) for status in TERMINAL},
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
) -> dict[str, Any]:
    """Replay ``trace`` under shortest-job-first admission and return the report.

    Invalid traces or settings raise ValueError naming the field; the input is
    never mutated, and the same input always gives the same report.
    """
    config = validate_config({
        "capacity": capacity, "block_size": block_size, "token_budget": token_budget,
        "max_active": max_active, "prefill_chunk": prefill_chunk,
        "release_delay": release_delay, "policy": policy,
    })
    return _SjfScheduler(validate_trace(trace), config).run()
