"""What a report says happened, per request and per tick: the model a schedule picture draws.

``schedule_of`` reads a report (untrusted: anything an implementation returned)
into lanes and page counts, keeping only well-formed values (times from 0 to
``MAX_TIME``) and at most ``MAX_LANES`` requests over ``MAX_TICKS`` ticks (a
window around the violation when the run is longer), ``MAX_PER_LANE`` cells,
spans and marks a request and ``MAX_SNAPSHOTS`` page counts; what it left out is
listed in ``Schedule.omitted``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from .markup import clip, number

__all__ = ["Cell", "Lane", "Mark", "MAX_EVENTS", "MAX_LANES", "MAX_MAPPED_PAGES", "MAX_PER_LANE", "MAX_SNAPSHOTS",
           "MAX_TICKS", "MAX_TIME", "PageCount", "PageMap", "Schedule", "schedule_of"]

MAX_LANES = 32
MAX_TICKS = 240
MAX_EVENTS = 50_000
MAX_PER_LANE = 2 * MAX_TICKS
MAX_SNAPSHOTS = 2 * MAX_TICKS
MAX_TIME = 1e9
MAX_MAPPED_PAGES = 512
TERMINAL = ("finished", "cancelled", "rejected")
POINT_EVENTS = ("preempted", "cancelled", "rejected", "finished", "release", "admission_blocked", "cancel_ignored")


@dataclass
class Cell:
    """One dispatch row of a request: ``phase`` (prefill, decode, recompute) feeding ``tokens`` at ``time``."""

    time: float
    phase: str
    tokens: int


@dataclass
class Mark:
    """A point event of a request (preempted, cancelled, rejected, finished, release, ...) with its details."""

    time: float
    kind: str
    detail: str


@dataclass
class Lane:
    """One request: its spans (start, end, ``waiting`` or ``admitted``), dispatch cells, point events, token times."""

    rid: str
    spans: list[tuple[float, float | None, str]] = field(default_factory=list)
    cells: list[Cell] = field(default_factory=list)
    marks: list[Mark] = field(default_factory=list)
    tokens: list[float] = field(default_factory=list)
    status: str = ""


@dataclass
class PageCount:
    """A snapshot's KV pages: allocated (in block tables), reserved and draining where the report has them."""

    time: float
    allocated: int | None
    reserved: int | None
    draining: int | None
    free: int | None


@dataclass
class PageMap:
    """Every page of the pool in one snapshot (the violation's, else the last): who holds each, and the pages
    that break a rule there: ``doubled`` (in two block tables), ``leaked`` (held in the last snapshot by a
    request never released after it), and ``unlisted``, how many pages the snapshot counts as allocated that
    no block table lists (their ids are not in the report)."""

    time: float
    capacity: int
    owners: dict[int, list[str]]
    ended: set[str]
    doubled: set[int]
    leaked: set[int]
    unlisted: int
    last: bool


@dataclass
class Schedule:
    lanes: list[Lane]
    pages: list[PageCount]
    capacity: int | None
    start: float
    end: float
    unit: str
    omitted: list[str] = field(default_factory=list)
    page_map: PageMap | None = None


def _count(value: Any) -> int | None:
    n = number(value)
    return int(n) if n is not None and n >= 0 and n == int(n) and n < 2**53 else None


def _rid(value: Any) -> str | None:
    return clip(value, 120) if isinstance(value, str) and value else None


def schedule_of(report: Mapping[str, Any], focus: Sequence[str] = (), at: float | None = None,
                snapshot: int | None = None) -> Schedule:
    """The lanes and page counts of ``report``.  Requests in ``focus`` (the violation's) come first;
    with a time ``at``, a run longer than MAX_TICKS is shown in a window around it.  The page map is of the
    event ``snapshot`` when it is a snapshot (the violation's), else of the last snapshot at or before ``at``,
    else of the last one."""
    raw = report.get("events") if isinstance(report, Mapping) else None
    events = [e for e in raw[:MAX_EVENTS] if isinstance(e, Mapping)] if isinstance(raw, list) else []
    omitted = [f"{len(raw) - MAX_EVENTS} events after the first {MAX_EVENTS}"] if isinstance(raw, list) and \
        len(raw) > MAX_EVENTS else []
    lanes: dict[str, Lane] = {}
    pages: list[PageCount] = []
    times: list[float] = []
    for ev in events:
        t = number(ev.get("time"))
        kind = ev.get("event")
        if t is None or not 0 <= t <= MAX_TIME or not isinstance(kind, str):
            continue
        times.append(t)
        if kind == "snapshot":
            pages.append(PageCount(t, *(_count(ev.get(k)) for k in
                                        ("allocated_blocks", "reserved_blocks", "draining_blocks", "free_blocks"))))
        elif kind == "dispatch" and isinstance(ev.get("work"), list):
            for row in ev["work"]:
                rid = _rid(row.get("id")) if isinstance(row, Mapping) else None
                if rid is not None:
                    phase = row.get("phase") if row.get("phase") in ("prefill", "decode", "recompute") else "other"
                    _lane(lanes, rid).cells.append(Cell(t, phase, _count(row.get("input_tokens")) or 0))
        elif (rid := _rid(ev.get("id"))) is not None:
            _event(_lane(lanes, rid), t, kind, ev)
    config = report.get("config") if isinstance(report, Mapping) else None
    capacity = _count(config.get("capacity")) if isinstance(config, Mapping) else None
    unit = "seconds" if report.get("time_unit") == "seconds" else "tick"
    start, end = (min(times), max(times) + (1 if unit == "tick" else 0)) if times else (0.0, 1.0)
    if unit == "tick" and end - start > MAX_TICKS:
        centre = at if at is not None else start
        lo = max(start, min(centre - MAX_TICKS // 2, end - MAX_TICKS))
        omitted.append(f"ticks outside {lo:g}..{lo + MAX_TICKS:g} (the run spans {start:g}..{end:g})")
        start, end = lo, lo + MAX_TICKS
    end = max(end, start + 1e-6)
    ordered = [lanes[r] for r in dict.fromkeys(focus) if r in lanes]
    ordered += [lane for rid, lane in lanes.items() if rid not in focus]
    if len(ordered) > MAX_LANES:
        omitted.append(f"{len(ordered) - MAX_LANES} of {len(ordered)} requests (the first {MAX_LANES} are drawn)")
        ordered = ordered[:MAX_LANES]
    crowded = sum(_trim(lane, start, end) for lane in ordered)
    if crowded:
        omitted.append(f"{crowded} rows, spans and marks of requests beyond {MAX_PER_LANE} each")
    shown = list({c.time: c for c in pages if start <= c.time <= end}.values())  # the last snapshot of a time
    if len(shown) > MAX_SNAPSHOTS:
        omitted.append(f"{len(shown) - MAX_SNAPSHOTS} of {len(shown)} page snapshots (an even sample is drawn)")
        shown = shown[:: -(-len(shown) // MAX_SNAPSHOTS)]
    return Schedule(ordered, shown, capacity, start, end, unit, omitted,
                    _page_map(events, capacity, snapshot if isinstance(raw, list) else None, at))


def _page_map(events: list[Mapping[str, Any]], capacity: int | None, index: int | None,
              at: float | None) -> PageMap | None:
    """The page map of one snapshot (see ``schedule_of``), or None without a capacity or a snapshot."""
    if capacity is None or not 0 < capacity <= MAX_MAPPED_PAGES:
        return None
    snaps = [i for i, ev in enumerate(events) if ev.get("event") == "snapshot" and number(ev.get("time")) is not None
             and isinstance(ev.get("block_tables"), Mapping)]
    if not snaps:
        return None
    chosen = index if index in snaps else None
    if chosen is None and at is not None:
        chosen = next((i for i in reversed(snaps) if number(events[i].get("time")) <= at), None)
    chosen = snaps[-1] if chosen is None else chosen
    snap = events[chosen]
    owners: dict[int, list[str]] = {}
    for rid, table in list(snap["block_tables"].items())[:MAX_MAPPED_PAGES]:
        pages = [p for p in table[:MAX_MAPPED_PAGES] if isinstance(p, int) and not isinstance(p, bool)] \
            if isinstance(table, list) else []
        for page in set(pages):
            if 0 <= page < capacity:
                owners.setdefault(page, []).append(clip(rid, 120))
    ended = {clip(ev.get("id"), 120) for ev in events[:chosen] if ev.get("event") in TERMINAL}
    last = chosen == snaps[-1]
    released = {clip(ev.get("id"), 120) for ev in events[chosen + 1:] if ev.get("event") == "release"}
    leaked = {page for page, held in owners.items() if last and any(rid not in released for rid in held)}
    allocated = _count(snap.get("allocated_blocks"))
    distinct = len(owners)
    unlisted = max(0, min(capacity - distinct, (allocated or 0) - distinct))
    return PageMap(number(snap.get("time")) or 0.0, capacity, owners, ended,
                   {page for page, held in owners.items() if len(held) > 1}, leaked, unlisted, last)


def _trim(lane: Lane, start: float, end: float) -> int:
    """Keep a lane's cells, spans and marks in the window, at most MAX_PER_LANE of each; how many it dropped."""
    dropped = 0
    for name in ("cells", "marks", "tokens"):
        items = [i for i in getattr(lane, name) if start <= (i if name == "tokens" else i.time) <= end]
        dropped += max(0, len(items) - MAX_PER_LANE)
        setattr(lane, name, items[:MAX_PER_LANE])
    dropped += max(0, len(lane.spans) - MAX_PER_LANE)
    lane.spans = lane.spans[:MAX_PER_LANE]
    return dropped


def _lane(lanes: dict[str, Lane], rid: str) -> Lane:
    lane = lanes.get(rid)
    if lane is None:
        lane = lanes[rid] = Lane(rid)
    return lane


def _event(lane: Lane, t: float, kind: str, ev: Mapping[str, Any]) -> None:
    """Fold one request event into its lane: spans open and close, point events become marks."""
    open_span = lane.spans[-1] if lane.spans and lane.spans[-1][1] is None else None

    def close() -> None:
        if open_span is not None:
            lane.spans[-1] = (open_span[0], t, open_span[2])

    if kind == "arrival" and not lane.spans:
        lane.spans.append((t, None, "waiting"))
    elif kind == "admit":
        close()
        lane.spans.append((t, None, "admitted"))
    elif kind == "preempted":
        close()
        lane.spans.append((t, None, "waiting"))
    elif kind == "token":
        lane.tokens.append(t)
    if kind in TERMINAL:
        close()
        lane.status = kind
    if kind in POINT_EVENTS or kind.startswith("x-"):
        extra = {k: v for k, v in list(ev.items())[:8] if k not in ("time", "event", "id")}
        lane.marks.append(Mark(t, kind, " ".join(f"{clip(k, 30)}={clip(v, 60)}" for k, v in extra.items())))
