"""Reference continuous-batching scheduler simulator (standard library only).

Replays a trace of arrivals and cancellations on a paged KV pool in synthetic
ticks and returns a JSON-ready report: the config, one row per request, the
ordered event trace and summary counts.  Every dispatch lasts one tick; its
results (token and finished events) commit at the next tick boundary, before
that boundary's arrivals and cancellations.

Semantics, tick by tick at boundary ``t``:

1. commit the dispatch of ``t - 1``: ``token`` events in row order, ``finished``
   right after a request's last token;
2. the trace's events at ``t`` in trace order: ``arrival`` (an impossible
   request is ``rejected`` at once), ``cancel`` (``cancelled``, or
   ``cancel_ignored`` for a request that already ended);
3. ``release`` of retired requests whose ``release_delay`` has passed: their
   pages drain until then and are neither free nor admission headroom;
4. FIFO admission while ``max_active`` (1 under ``policy="serial"``) and the
   page headroom allow; ``admission_blocked`` the first time the head waits;
5. the next dispatch is planned: decode rows first (one token each), then
   chunked prefill or recompute rows, each list served round-robin (the rows
   served move to the back, so the next dispatch starts with whoever waited);
   pages for its rows are allocated, oldest request first, and under
   ``admission="optimistic"`` victims are ``preempted`` (newest first);
6. a ``snapshot`` of the pool: the block tables the dispatch will write into;
7. the ``dispatch``.

Admission ``"reserve"`` (the default) reserves ``ceil((prompt + output - 1) /
block_size)`` pages up front (the last sampled token is never fed back), so a
running request never runs out of pages.  ``"optimistic"`` claims only the
pages of the prompt (or of the rows to recompute) and allocates the rest on
demand; when the pool runs dry the newest admitted request is preempted, its
pages are freed, and it goes back to the front of the queue.  On re-admission
it recomputes its committed rows (phase ``"recompute"``, never emitting) and
resumes without emitting any output twice.  The oldest running request never
yields pages to a newer one, so it always makes progress.

Run ``python scheduler_sim.py --help`` for the command line.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections import deque
from typing import Any, Iterable, Mapping

try:
    from .trace_format import load_trace, validate_config, validate_trace
except ImportError:  # run as a script, or imported from this folder
    from trace_format import load_trace, validate_config, validate_trace

__all__ = ["DEFAULT_CONFIG", "demo_trace", "simulate", "main"]

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


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


class _Request:
    __slots__ = (
        "id", "prompt", "output", "arrival", "status", "admitted", "end",
        "token_times", "emitted", "committed", "recompute_to", "pages",
        "claim", "blocked_reported", "ever_admitted", "seq",
    )

    def __init__(self, rid: str, prompt: int, output: int, arrival: int) -> None:
        self.id = rid
        self.prompt = prompt
        self.output = output
        self.arrival = arrival
        self.status = "queued"
        self.admitted: int | None = None
        self.end: int | None = None
        self.token_times: list[int] = []
        self.emitted = 0
        self.committed = 0        # input rows whose KV exists in this incarnation
        self.recompute_to = 0     # rows committed before the last preemption
        self.pages: list[int] = []  # replaced, never mutated: snapshots share it
        self.claim = 0            # pages counted against headroom while active
        self.blocked_reported = False
        self.ever_admitted = False
        self.seq = 0              # admission order; re-admission counts as newest

    def reserved(self) -> int:
        return max(self.claim, len(self.pages))

    def next_row(self, chunk: int, budget: int) -> tuple[str, int]:
        """Phase and size of this request's next row within ``budget``."""
        if self.committed < self.recompute_to:
            return "recompute", min(chunk, self.recompute_to - self.committed, budget)
        if self.committed < self.prompt:
            return "prefill", min(chunk, self.prompt - self.committed, budget)
        return "decode", 1


class _Simulation:
    def __init__(self, config: dict[str, Any], trace: list[dict[str, Any]], check: bool) -> None:
        self.cfg = config
        self.trace = trace
        self.check = check
        self.bs = config["block_size"]
        self.capacity = config["capacity"]
        self.optimistic = config["admission"] == "optimistic"
        self.max_active = 1 if config["policy"] == "serial" else config["max_active"]
        self.events: list[dict[str, Any]] = []
        self.requests: dict[str, _Request] = {}
        self.queue: deque[_Request] = deque()
        self.active: list[_Request] = []          # admission order: oldest first
        self.decode_q: list[_Request] = []
        self.prefill_q: list[_Request] = []       # prefill and recompute rows
        self.free: deque[int] = deque(range(self.capacity))
        self.reserved_total = 0
        self.draining: deque[tuple[int, _Request]] = deque()  # (release tick, request)
        self.draining_pages = 0
        self.pending: list[tuple[_Request, str, int, bool]] = []   # rows awaiting commit
        self.dispatches = 0
        self.admissions = 0
        self.input_tokens = 0

    # -- boundary steps -------------------------------------------------
    def commit(self, t: int) -> None:
        emit = self.events.append
        for req, phase, n, emits in self.pending:
            req.committed += n
            if emits:
                req.emitted += 1
                req.token_times.append(t)
                emit({"time": t, "event": "token", "id": req.id, "output_index": req.emitted})
                if req.emitted == req.output:
                    emit({"time": t, "event": "finished", "id": req.id})
                    self.retire(req, t, "finished")
                    continue
            if phase != "decode" and req.committed >= max(req.prompt, req.recompute_to):
                self.prefill_q.remove(req)
                self.decode_q.append(req)
        self.pending = []

    def arrival(self, t: int, line: dict[str, Any]) -> None:
        req = _Request(line["id"], line["prompt_tokens"], line["output_tokens"], t)
        self.requests[req.id] = req
        self.events.append({"time": t, "event": "arrival", "id": req.id})
        if _ceil_div(req.prompt + req.output - 1, self.bs) > self.capacity:
            req.status = "rejected"
            req.end = t
            self.events.append({"time": t, "event": "rejected", "id": req.id})
        else:
            self.queue.append(req)

    def cancel(self, t: int, rid: str) -> None:
        req = self.requests[rid]
        if req.status in ("finished", "cancelled", "rejected"):
            self.events.append({"time": t, "event": "cancel_ignored", "id": rid, "status": req.status})
            return
        self.events.append({"time": t, "event": "cancelled", "id": rid})
        if req.status == "active":
            self.retire(req, t, "cancelled")
            return
        self.queue.remove(req)
        req.status = "cancelled"
        req.end = t
        if req.ever_admitted:  # preempted earlier: it still owes its release event
            self.draining.append((t + self.cfg["release_delay"], req))

    def retire(self, req: _Request, t: int, status: str) -> None:
        self.active.remove(req)
        (self.decode_q if req in self.decode_q else self.prefill_q).remove(req)
        self.reserved_total -= req.reserved()
        self.draining_pages += len(req.pages)
        req.status = status
        req.end = t
        self.draining.append((t + self.cfg["release_delay"], req))

    def release_due(self, t: int) -> None:
        while self.draining and self.draining[0][0] <= t:
            _, req = self.draining.popleft()
            self.free.extend(req.pages)
            self.draining_pages -= len(req.pages)
            req.pages = []
            self.events.append({"time": t, "event": "release", "id": req.id})

    def admission_need(self, req: _Request) -> int:
        if not self.optimistic:
            return _ceil_div(req.prompt + req.output - 1, self.bs)
        rows = req.prompt if req.emitted == 0 else req.prompt + req.emitted
        return _ceil_div(rows, self.bs)

    def headroom(self) -> int:
        """Pages still free for admission; under optimistic admission running
        requests may outgrow their claims, which counts as no headroom, never less."""
        return max(0, self.capacity - self.reserved_total - self.draining_pages)

    def admit(self, t: int) -> None:
        while self.queue and len(self.active) < self.max_active:
            req = self.queue[0]
            need = self.admission_need(req)
            if need > self.headroom():
                if not req.blocked_reported:
                    req.blocked_reported = True
                    self.events.append(
                        {"time": t, "event": "admission_blocked", "id": req.id, "required_blocks": need}
                    )
                return
            self.queue.popleft()
            req.status = "active"
            req.claim = need
            req.ever_admitted = True
            self.admissions += 1
            req.seq = self.admissions
            if req.admitted is None:
                req.admitted = t
            self.reserved_total += need
            self.active.append(req)
            self.prefill_q.append(req)
            self.events.append({"time": t, "event": "admit", "id": req.id, "reserved_blocks": need})

    def snapshot(self, t: int) -> None:
        tables = {req.id: req.pages for req in self.active}
        for _, req in self.draining:
            if req.pages:
                tables[req.id] = req.pages
        free = len(self.free)
        self.events.append({
            "time": t,
            "event": "snapshot",
            "active": len(self.active),
            "queued": len(self.queue),
            "reserved_blocks": self.reserved_total,
            "draining_blocks": self.draining_pages,
            "allocated_blocks": self.capacity - free,
            "free_blocks": free,
            "admission_headroom": self.headroom(),
            "block_tables": tables,
        })

    # -- dispatch -------------------------------------------------------
    def plan(self) -> list[tuple[_Request, str, int]]:
        budget = self.cfg["token_budget"]
        rows: list[tuple[_Request, str, int]] = []
        for req in self.decode_q:
            if budget == 0:
                return rows
            rows.append((req, "decode", 1))
            budget -= 1
        chunk = self.cfg["prefill_chunk"]
        for req in self.prefill_q:
            if budget == 0:
                break
            phase, n = req.next_row(chunk, budget)
            rows.append((req, phase, n))
            budget -= n
        return rows

    def preempt(self, t: int, req: _Request) -> None:
        self.active.remove(req)
        (self.decode_q if req in self.decode_q else self.prefill_q).remove(req)
        self.reserved_total -= req.reserved()
        released = len(req.pages)
        self.free.extend(req.pages)
        req.pages = []
        req.recompute_to = max(req.recompute_to, req.committed)
        req.committed = 0
        req.claim = 0
        req.status = "queued"
        req.blocked_reported = False
        self.queue.appendleft(req)
        self.events.append({"time": t, "event": "preempted", "id": req.id, "released_blocks": released})

    def allocate(self, t: int, rows: list[tuple[_Request, str, int]]) -> list[tuple[_Request, str, int]]:
        """Give each row the pages it needs, oldest request first; return the rows that run."""
        waiting: list[_Request] = []
        for req, _, n in sorted(rows, key=lambda row: row[0].seq):
            if req.status != "active":  # preempted a moment ago for an older request
                continue
            need = _ceil_div(req.committed + n, self.bs) - len(req.pages)
            while need > len(self.free):
                if not self.optimistic:
                    raise AssertionError(f"reservation broken: {req.id} needs {need} pages")
                victim = self.active[-1]
                if victim is req:
                    if victim is self.active[0]:
                        waiting.append(req)  # alone: wait for draining pages, yield to nobody
                    else:
                        self.preempt(t, req)
                    break
                self.preempt(t, victim)
            else:
                if need > 0:
                    old = req.reserved()
                    req.pages = req.pages + [self.free.popleft() for _ in range(need)]
                    self.reserved_total += req.reserved() - old
        if not waiting and all(req.status == "active" for req, _, _ in rows):
            return rows
        return [row for row in rows if row[0].status == "active" and row[0] not in waiting]

    def dispatch(self, t: int, planned: list[tuple[_Request, str, int]], rows: list[tuple[_Request, str, int]]) -> bool:
        if not rows:
            return False
        work = []
        used = 0
        pending = self.pending
        for req, phase, n in rows:
            work.append({"id": req.id, "phase": phase, "input_tokens": n})
            used += n
            pending.append((req, phase, n, phase != "recompute" and req.committed + n == req.prompt + req.emitted))
        self.events.append({
            "time": t, "event": "dispatch", "work": work,
            "unused_budget": self.cfg["token_budget"] - used,
        })
        self.dispatches += 1
        self.input_tokens += used
        if len(rows) == len(planned):  # served rows are a prefix of each list
            decodes = sum(1 for row in rows if row[1] == "decode")
            self.decode_q[:] = self.decode_q[decodes:] + self.decode_q[:decodes]
            k = len(rows) - decodes
            self.prefill_q[:] = self.prefill_q[k:] + self.prefill_q[:k]
        else:
            served = {row[0].id for row in rows}
            for q in (self.decode_q, self.prefill_q):
                q[:] = [r for r in q if r.id not in served] + [r for r in q if r.id in served]
        return True

    # -- main loop ------------------------------------------------------
    def run(self) -> dict[str, Any]:
        trace = self.trace
        i = 0
        t = trace[0]["time"] if trace else 0
        while True:
            self.commit(t)
            while i < len(trace) and trace[i]["time"] == t:
                line = trace[i]
                i += 1
                if line["event"] == "arrival":
                    self.arrival(t, line)
                else:
                    self.cancel(t, line["id"])
            self.release_due(t)
            self.admit(t)
            planned = self.plan()
            rows = self.allocate(t, planned)
            self.snapshot(t)
            preempted = len(rows) < len(planned) and any(req.status == "queued" for req, _, _ in planned)
            if self.dispatch(t, planned, rows) or preempted:
                if self.check:
                    self.verify()
                t += 1  # after a preemption that left nothing to run, re-admit and re-plan next tick
                continue
            if self.check:
                self.verify()
            upcoming = []
            if i < len(trace):
                upcoming.append(trace[i]["time"])
            if self.draining:
                upcoming.append(self.draining[0][0])
            if not upcoming:
                if self.active or self.queue:
                    raise AssertionError(f"tick {t}: requests left with nothing that could free them")
                break
            t = min(upcoming)
        return self.report(t)

    def verify(self) -> None:
        """Full invariant scan (only with ``check=True``): pages, reservations, queues."""
        owned: list[int] = [p for req in self.active for p in req.pages]
        owned += [p for _, req in self.draining for p in req.pages]
        everything = owned + list(self.free)
        assert sorted(everything) == list(range(self.capacity)), "a page is lost or doubled"
        assert self.reserved_total == sum(r.reserved() for r in self.active), "reservation total drifted"
        assert self.draining_pages == sum(len(r.pages) for _, r in self.draining), "draining total drifted"
        if not self.optimistic:
            assert self.capacity - self.reserved_total - self.draining_pages >= 0, "negative headroom"
        for req in self.active:
            assert len(req.pages) >= _ceil_div(req.committed, self.bs), f"{req.id}: rows without pages"
        assert sorted(map(id, self.decode_q + self.prefill_q)) == sorted(map(id, self.active)), "queues drifted"

    def report(self, t_end: int) -> dict[str, Any]:
        requests = {}
        counts = {"finished": 0, "cancelled": 0, "rejected": 0}
        for req in self.requests.values():
            times = req.token_times
            counts[req.status] += 1
            requests[req.id] = {
                "status": req.status,
                "arrival": req.arrival,
                "admitted": req.admitted,
                "end": req.end,
                "output_tokens": req.emitted,
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
                "drained_at_tick": t_end,
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
    config = validate_config({
        "capacity": capacity, "block_size": block_size, "token_budget": token_budget,
        "max_active": max_active, "prefill_chunk": prefill_chunk,
        "release_delay": release_delay, "policy": policy, "admission": admission,
    })
    if not isinstance(check, bool):
        raise ValueError(f"check: must be true or false, got {check!r}")
    return _Simulation(config, validate_trace(events), check).run()


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
    parser.add_argument("--admission", choices=["reserve", "optimistic"], default="reserve")
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


if __name__ == "__main__":
    sys.exit(main())
