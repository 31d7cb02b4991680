"""The course's scheduler written again from its published semantics, taking every freedom the other way.

An independent, exact implementation of the course's policy (reserve
admission): it gives the results the course states (the demo: 7 dispatches,
19 input tokens, all 8 pages free by tick 8) and passes ``course_results``,
while every choice the course leaves open is made differently from the
published simulator:

* a request that cannot fit even alone is rejected the moment it arrives;
* the pages a dispatch needs are taken while it is planned, before the
  snapshot (engine style), the highest free page first;
* a request that ends holding no page gets no release event;
* ``admission_blocked`` is logged once per request, the first time it blocks;
* snapshots come only before dispatches, with ``active`` and ``queued`` as
  counts; a dispatch lists its prefill rows before its decode rows;
* ``drained_at_tick`` is the last release (or the last end), even when trace
  lines come later.

The policy itself is the course's: a FIFO queue; at most ``max_active``
admitted (1 under ``serial``), each reserving ``ceil((prompt + output - 1) /
block_size)`` pages against the capacity left by the admitted requests and
the pages awaiting release, admission stopping at a head that does not fit;
per dispatch, decode rows first (one token each) for the decoding requests in
admission order rotated by a decode counter that advances by the rows it
could serve (``min(decoders, token_budget)``), then prefill chunks of
``min(prefill_chunk, prompt left, budget left)`` rotated by a prefill counter
that advances by one per prefill row; every dispatch takes one tick, and its
tokens and ends commit before the next tick's arrivals and cancels; a
request that ends keeps its pages for ``release_delay`` ticks.

    pytest --cbatch-impl=examples/course_scheduler.py --cbatch-course
"""

from __future__ import annotations

from typing import Any

CBATCH_UNSUPPORTED = ["admission=optimistic"]
"""The settings it never supports, declared up front: the kit skips their workloads without a run."""

_SETTINGS = {"capacity": 1, "block_size": 1, "token_budget": 1, "max_active": 1, "prefill_chunk": 1,
             "release_delay": 0}
_LINE_KEYS = {"arrival": {"time", "event", "id", "prompt_tokens", "output_tokens"}, "cancel": {"time", "event", "id"}}


def _whole(value: Any) -> bool:
    return type(value) is int


def _checked(trace: Any) -> list[dict[str, Any]]:
    if not isinstance(trace, list):
        raise ValueError(f"trace: a list of events, got {type(trace).__name__}")
    for n, line in enumerate(trace):
        if not isinstance(line, dict) or line.get("event") not in _LINE_KEYS:
            raise ValueError(f"trace line {n}: an arrival or cancel object, got {line!r:.80}")
        if set(line) != _LINE_KEYS[line["event"]]:
            raise ValueError(f"trace line {n}: fields {sorted(line)}, expected {sorted(_LINE_KEYS[line['event']])}")
        if not _whole(line["time"]) or line["time"] < 0:
            raise ValueError(f"trace line {n}: time must be an integer >= 0")
        if not isinstance(line["id"], str) or not line["id"]:
            raise ValueError(f"trace line {n}: id must be a non-empty string")
        for key in ("prompt_tokens", "output_tokens"):
            if key in line and (not _whole(line[key]) or line[key] < 1):
                raise ValueError(f"trace line {n}: {key} must be an integer >= 1")
    ordered = sorted(trace, key=lambda line: (line["time"], line["event"] == "cancel"))
    seen: set[str] = set()
    for line in ordered:
        if line["event"] == "arrival":
            if line["id"] in seen:
                raise ValueError(f"trace: request id {line['id']!r} arrives twice")
            seen.add(line["id"])
        elif line["id"] not in seen:
            raise ValueError(f"trace: cancel of {line['id']!r} before (or without) its arrival")
    return [dict(line) for line in ordered]


def simulate(trace: Any, *, capacity: int = 8, block_size: int = 4, token_budget: int = 4, max_active: int = 4,
             prefill_chunk: int = 2, release_delay: int = 1, policy: str = "continuous",
             admission: str = "reserve") -> dict[str, Any]:
    """The report of the course's scheduler on ``trace``; ValueError on invalid input."""
    settings = {"capacity": capacity, "block_size": block_size, "token_budget": token_budget,
                "max_active": max_active, "prefill_chunk": prefill_chunk, "release_delay": release_delay}
    for key, low in _SETTINGS.items():
        if not _whole(settings[key]) or settings[key] < low:
            raise ValueError(f"config: {key} must be an integer >= {low}, got {settings[key]!r}")
    if policy not in ("continuous", "serial"):
        raise ValueError(f"config: policy must be continuous or serial, got {policy!r}")
    if admission != "reserve":
        raise NotImplementedError(f"admission={admission!r}: only the course's reserve admission")
    run = _Run(_checked(trace), settings, 1 if policy == "serial" else max_active)
    run.play()
    return run.report({**settings, "policy": policy})


class _Run:
    def __init__(self, lines: list[dict[str, Any]], cfg: dict[str, int], limit: int) -> None:
        self.lines, self.cfg, self.limit = lines, cfg, limit
        self.log: list[dict[str, Any]] = []
        self.req: dict[str, dict[str, Any]] = {}
        self.queue: list[str] = []
        self.running: list[str] = []                 # admission order
        self.tables: dict[str, list[int]] = {}
        self.free = set(range(cfg["capacity"]))
        self.due: list[tuple[int, str]] = []         # (release time, id) of ended requests holding pages
        self.turn = {"decode": 0, "prefill": 0}
        self.dispatches = self.fed_total = 0
        self.drained = 0

    def need(self, rid: str) -> int:
        r = self.req[rid]
        return -(-(r["prompt"] + r["output"] - 1) // self.cfg["block_size"])

    def emit(self, now: int, kind: str, rid: str | None = None, **fields: Any) -> None:
        self.log.append({"time": now, "event": kind, **({"id": rid} if rid is not None else {}), **fields})

    def end(self, now: int, rid: str, status: str) -> None:
        r = self.req[rid]
        if rid in self.running:
            self.running.remove(rid)
            if self.tables[rid]:
                self.due.append((now + self.cfg["release_delay"], rid))
            else:
                del self.tables[rid]
        elif rid in self.queue:
            self.queue.remove(rid)
        r["status"], r["end"] = status, now
        self.drained = max(self.drained, now)
        self.emit(now, status, rid)

    def play(self) -> None:
        now, i = 0, 0
        while i < len(self.lines) or self.queue or self.running or self.due:
            while i < len(self.lines) and self.lines[i]["time"] == now:
                self.boundary(now, self.lines[i])
                i += 1
            for when, rid in sorted(d for d in self.due if d[0] <= now):
                self.due.remove((when, rid))
                self.free.update(self.tables.pop(rid))
                self.drained = max(self.drained, now)
                self.emit(now, "release", rid)
            self.admit(now)
            rows = self.plan()
            if rows:
                self.snapshot(now)
                self.dispatch(now, rows)
                now += 1
                continue
            upcoming = [t for t, _ in self.due] + ([self.lines[i]["time"]] if i < len(self.lines) else [])
            if not upcoming:
                break
            now = min(upcoming)

    def boundary(self, now: int, line: dict[str, Any]) -> None:
        rid = line["id"]
        if line["event"] == "cancel":
            r = self.req[rid]
            if r["status"] in ("finished", "cancelled", "rejected"):
                self.emit(now, "cancel_ignored", rid, status=r["status"])
            else:
                self.end(now, rid, "cancelled")
            return
        self.req[rid] = {"prompt": line["prompt_tokens"], "output": line["output_tokens"], "arrival": now,
                         "status": "queued", "admitted": None, "end": None, "fed": 0, "times": [],
                         "blocked": False}
        self.emit(now, "arrival", rid)
        if self.need(rid) > self.cfg["capacity"]:
            self.req[rid]["status"], self.req[rid]["end"] = "rejected", now
            self.drained = max(self.drained, now)
            self.emit(now, "rejected", rid)
        else:
            self.queue.append(rid)

    def admit(self, now: int) -> None:
        while self.queue and len(self.running) < self.limit:
            rid = self.queue[0]
            held = sum(len(self.tables[r]) for _, r in self.due)
            room = self.cfg["capacity"] - sum(self.need(r) for r in self.running) - held
            if self.need(rid) > room:
                if not self.req[rid]["blocked"]:
                    self.req[rid]["blocked"] = True
                    self.emit(now, "admission_blocked", rid, required_blocks=self.need(rid))
                return
            self.queue.pop(0)
            self.running.append(rid)
            self.tables[rid] = []
            self.req[rid].update(status="admitted", admitted=now)
            self.emit(now, "admit", rid, reserved_blocks=self.need(rid))

    def plan(self) -> list[tuple[str, str, int]]:
        budget = self.cfg["token_budget"]
        decoding = [r for r in self.running if self.req[r]["fed"] >= self.req[r]["prompt"]]
        filling = [r for r in self.running if self.req[r]["fed"] < self.req[r]["prompt"]]
        rows: list[tuple[str, str, int]] = []
        if decoding:
            k = self.turn["decode"] % len(decoding)
            rows += [(r, "decode", 1) for r in (decoding[k:] + decoding[:k])[:budget]]
            self.turn["decode"] += min(len(decoding), budget)
        left = budget - len(rows)
        if filling and left:
            k = self.turn["prefill"] % len(filling)
            for r in filling[k:] + filling[:k]:
                size = min(self.cfg["prefill_chunk"], self.req[r]["prompt"] - self.req[r]["fed"], left)
                if not size:
                    break
                rows.insert(0, (r, "prefill", size))   # listed first: the order of rows is free
                left -= size
                self.turn["prefill"] += 1
        for r, _, size in rows:   # pages taken while planning, the highest free page first
            want = -(-(self.req[r]["fed"] + size) // self.cfg["block_size"]) - len(self.tables[r])
            for _ in range(want):
                page = max(self.free)
                self.free.remove(page)
                self.tables[r] = self.tables[r] + [page]
        return rows

    def snapshot(self, now: int) -> None:
        reserved = sum(self.need(r) for r in self.running)
        draining = sum(len(self.tables[r]) for _, r in self.due)
        self.emit(now, "snapshot", active=len(self.running), queued=len(self.queue), reserved_blocks=reserved,
                  draining_blocks=draining, allocated_blocks=self.cfg["capacity"] - len(self.free),
                  free_blocks=len(self.free), admission_headroom=self.cfg["capacity"] - reserved - draining,
                  block_tables={r: list(t) for r, t in self.tables.items()})

    def dispatch(self, now: int, rows: list[tuple[str, str, int]]) -> None:
        used = sum(size for _, _, size in rows)
        self.emit(now, "dispatch", work=[{"id": r, "phase": p, "input_tokens": n} for r, p, n in rows],
                  unused_budget=self.cfg["token_budget"] - used)
        self.dispatches += 1
        self.fed_total += used
        for r, phase, size in rows:
            q = self.req[r]
            q["fed"] += size
            if phase == "prefill" and q["fed"] < q["prompt"]:
                continue
            q["times"].append(now + 1)
            self.emit(now + 1, "token", r, output_index=len(q["times"]))
            if len(q["times"]) == q["output"]:
                self.end(now + 1, r, "finished")

    def report(self, config: dict[str, Any]) -> dict[str, Any]:
        rows = {}
        for rid, r in self.req.items():
            times = r["times"]
            rows[rid] = {"status": r["status"], "arrival": r["arrival"], "admitted": r["admitted"], "end": r["end"],
                         "output_tokens": len(times), "token_times": list(times),
                         "queue_ticks": None if r["admitted"] is None else r["admitted"] - r["arrival"],
                         "ttft_ticks": times[0] - r["arrival"] if times else None,
                         "itl_ticks": [b - a for a, b in zip(times, times[1:])]}
        counts = {s: sum(r["status"] == s for r in self.req.values()) for s in ("finished", "cancelled", "rejected")}
        return {"schema_version": 1, "time_unit": "synthetic_tick", "config": config, "requests": rows,
                "events": self.log,
                "summary": {"drained_at_tick": self.drained, "dispatches": self.dispatches,
                            "processed_input_tokens": self.fed_total, "free_blocks": len(self.free), **counts}}
