"""Clauses about the KV pool: snapshots, block tables, releases and the final drain.

A correct scheduler may allocate a dispatch's pages before its snapshot
(engine style) or while the dispatch runs (the course's simulator), hand out
page ids in any order, and snapshot every tick or only before dispatches; the
clauses below hold for all of these.  The ones that judge each snapshot
against the lifecycle so far are registered with ``at=`` and share the
index's one replay; the block tables are read once, as changes
(``ReportIndex.block_tables``).
"""

from __future__ import annotations

from bisect import bisect_left
from typing import Any, Iterator, Mapping

from ..words import counted
from .core import TERMINAL, ReportIndex, Replay, Violation, clause, next_state, short


def _doubled(tables: Mapping[str, list[int]]) -> list[int]:
    owners: dict[int, str] = {}
    doubled = []
    for rid, table in tables.items():
        for page in table:
            if page in owners:
                doubled.append(page)
            owners[page] = rid
    return doubled


@clause("pages_conserved",
        "In every snapshot allocated_blocks + free_blocks = capacity, the block tables hold exactly "
        "allocated_blocks distinct pages in 0..capacity-1 with no page in two tables, and draining_blocks counts "
        "the pages of ended requests not yet released.",
        "A page in two tables is silent KV corruption; a page in none is a leak.", needs=("snapshot",),
        admits="any page ids and free-list order; a table per draining request",
        reads=("config.capacity", "events[snapshot].allocated_blocks", "events[snapshot].free_blocks",
               "events[snapshot].block_tables", "events[snapshot].draining_blocks", "events[finished]",
               "events[cancelled]", "events[release]"),
        compares={
            "events[snapshot].allocated_blocks": "allocated_blocks + free_blocks = capacity",
            "events[snapshot].free_blocks": "allocated_blocks + free_blocks = capacity",
            "events[snapshot].block_tables": "exactly allocated_blocks distinct pages in 0..capacity-1 with no page "
                                             "in two tables",
            "events[snapshot].draining_blocks": "draining_blocks counts the pages of ended requests not yet released",
        },
        at=("snapshot",))
def _pages_conserved(ix: ReportIndex, i: int, snap: dict[str, Any], replay: Replay) -> Iterator[Violation]:
    cid = "pages_conserved"
    cap = ix.capacity
    tables = snap["block_tables"]
    if snap["allocated_blocks"] + snap["free_blocks"] != cap:
        yield ix.violation(cid, f"allocated {snap['allocated_blocks']} + free {snap['free_blocks']} != capacity "
                                f"{cap}", None, i)
    total, distinct, outside = ix.block_tables().census[i]
    members = replay.members
    draining = sum(map(len, map(tables.__getitem__, [*(tables.keys() & members["draining"]),
                                                      *(tables.keys() & members["ended"])])))
    if distinct != total:
        yield ix.violation(cid, f"{total - distinct} page(s) appear twice in the block tables: "
                                f"{short(_doubled(tables))}", None, i)
    elif total != snap["allocated_blocks"]:
        yield ix.violation(cid, f"block tables hold {total} pages, allocated_blocks says "
                                f"{snap['allocated_blocks']}", None, i)
    if outside:
        pages: set[int] = set().union(*tables.values())
        yield ix.violation(cid, f"page id outside 0..{cap - 1}: {min(pages) if min(pages) < 0 else max(pages)}",
                           None, i)
    if draining != snap["draining_blocks"]:
        yield ix.violation(cid, f"ended requests hold {draining} pages, draining_blocks says "
                                f"{snap['draining_blocks']}", None, i)


@clause("snapshot_counts",
        "Where a snapshot carries active and queued, they agree with the event trace at that point: as id lists, "
        "exactly the requests admitted and the requests waiting (arrived or preempted, not ended), in any order; "
        "as counts, their numbers.",
        "Running/waiting gauges are what operators watch; they must match the events.", needs=("snapshot", "admit"),
        admits="active and queued as id lists in any order, as counts, or absent",
        reads=("events[snapshot].active", "events[snapshot].queued", "events[arrival]", "events[admit]",
               "events[preempted]", "events[finished]", "events[cancelled]", "events[rejected]"),
        compares={
            "events[snapshot].active": "exactly the requests admitted",
            "events[snapshot].queued": "the requests waiting (arrived or preempted, not ended)",
        },
        at=("snapshot",))
def _snapshot_counts(ix: ReportIndex, i: int, snap: dict[str, Any], replay: Replay) -> Iterator[Violation]:
    cid = "snapshot_counts"
    for field, state in (("active", "active"), ("queued", "queued")):
        shown = snap.get(field)
        if shown is None:
            continue
        members = replay.members[state]
        if isinstance(shown, list):
            # equal as multisets: same length, same set (members has no duplicates)
            if len(shown) != len(members) or not members.issuperset(shown):
                expected = sorted(members)
                extra = sorted(set(shown) - set(expected))
                missing = [rid for rid in expected if rid not in shown]
                yield ix.violation(cid, f"snapshot {field} lists {short(shown)}; events give {short(expected)} "
                                        f"(extra {short(extra)}, missing {short(missing)})", None, i)
        elif shown != len(members):
            yield ix.violation(cid, f"snapshot says {field}={shown}, events give {len(members)}", None, i)


@clause("pages_cover_rows",
        "Every dispatch follows a snapshot of its tick. Every snapshot gives each running or draining request at "
        "least ceil(rows it fed before the snapshot, this incarnation / block_size) pages (so pages may be "
        "allocated before the snapshot or while the dispatch runs) and at most ceil((prompt + output - 1) / "
        "block_size), and shows no page for a request that is neither admitted nor ended awaiting release.",
        "Rows without pages overwrite someone else's KV; pages beyond the largest need are hoarded capacity.",
        needs=("snapshot", "dispatch"),
        admits=("pages allocated before the snapshot (engine style, as vLLM's schedule() does), while the "
                "dispatch runs (the course's simulator) or all at admission; snapshots every tick or only before "
                "dispatches"),
        reads=("config.block_size", "trace.prompt_tokens", "trace.output_tokens", "events[snapshot].block_tables",
               "events[snapshot].time", "events[dispatch].time", "events[dispatch].work[].input_tokens",
               "events[admit]", "events[preempted]", "events[finished]", "events[cancelled]", "events[release]"),
        compares={
            "events[dispatch].time": "Every dispatch follows a snapshot of its tick",
            "events[snapshot].block_tables": "at least ceil(rows it fed before the snapshot",
        },
        at=("snapshot", "dispatch"))
def _pages_cover_rows(ix: ReportIndex, i: int, ev: dict[str, Any], replay: Replay) -> Iterator[Violation]:
    cid = "pages_cover_rows"
    if ev["event"] == "dispatch":
        if replay.snapshot_time != ev["time"]:
            yield ix.violation(cid, "dispatch without a snapshot at its tick, so its pages cannot be audited", None, i)
        return
    bs, fed, state = ix.bs, replay.fed, replay.state
    tables = ev["block_tables"]
    table_of, fed_by = tables.get, fed.get
    # Whether a request's table is short of its rows changes only where its need (replay.regrown) or its
    # table changed since the snapshot before, so only those are looked at again; the rest keep their finding.
    underfed, changed = replay.underfed, ix.block_tables()
    for rid in (*replay.regrown, *changed.changed[i], *changed.gone.get(i, ())):
        if len(table_of(rid, ())) < -(-fed_by(rid, 0) // bs):
            underfed.add(rid)
        else:
            underfed.discard(rid)
    for members in (replay.members["active"], replay.members["draining"]):
        for rid in sorted(underfed & members):
            need = -(-fed.get(rid, 0) // bs)
            yield ix.violation(cid, f"has fed {counted(fed.get(rid, 0), 'row')}, which need "
                                    f"{counted(need, 'page')}; the snapshot shows {len(tables.get(rid, ()))}", rid, i)
    largest = ix.largest
    # Only a table that grew past its largest need, or that a request neither admitted nor draining shows,
    # can be at fault: look closer only when there is one.
    held_elsewhere = tables.keys() - replay.members["active"] - replay.members["draining"]
    if not any(tables[rid] for rid in held_elsewhere) and not ix.block_tables().oversized[i]:
        return
    for rid, table in tables.items():
        if not table or rid not in largest:
            continue
        most = largest[rid]
        where = state.get(rid)
        if where not in ("active", "draining"):
            yield ix.violation(cid, f"holds {len(table)} page(s) while {where or 'not arrived'}", rid, i)
        elif len(table) > most:
            yield ix.violation(cid, f"holds {len(table)} pages; its whole sequence needs at most {most}", rid, i)


@clause("headroom_nonnegative", "admission_headroom is never negative.",
        "Negative headroom means the scheduler promised more pages than exist.", needs=("snapshot",),
        admits="any reservation policy",
        reads=("events[snapshot].admission_headroom",),
        compares={
            "events[snapshot].admission_headroom": "admission_headroom is never negative",
        })
def _headroom_nonnegative(ix: ReportIndex) -> Iterator[Violation]:
    for i in ix.snapshots:
        if ix.events[i]["admission_headroom"] < 0:
            yield ix.violation("headroom_nonnegative", f"admission_headroom is {ix.events[i]['admission_headroom']}",
                               None, i)


@clause("no_reuse_before_release",
        "A page of an ended request appears in another request's block table only after that request's release "
        "event, and no earlier than its end time + release_delay.",
        "In-flight transfers may still write to a retired request's pages; reusing them early corrupts KV.",
        needs=("snapshot", "release"),
        admits="any free-list order",
        reads=("config.release_delay", "events[snapshot].block_tables", "events[snapshot].time",
               "events[finished].time", "events[cancelled].time", "events[release]", "events[preempted]"),
        compares={
            "events[snapshot].block_tables": "appears in another request's block table only after that request's "
                                             "release event",
            "events[snapshot].time": "no earlier than its end time + release_delay",
        })
def _no_reuse_before_release(ix: ReportIndex) -> Iterator[Violation]:
    delay = ix.cfg["release_delay"]
    changed = ix.block_tables().changed
    owner: dict[int, str] = {}
    last_table: dict[str, list[int]] = {}
    ended_at: dict[str, float] = {}
    released: set[str] = set()
    preempted: set[str] = set()   # since the last snapshot
    events = ix.events
    for i in ix.steps:
        ev = events[i]
        kind = ev["event"]
        if kind in ("finished", "cancelled"):
            ended_at.setdefault(ev["id"], ev["time"])
        elif kind == "preempted":  # its pages went back to the pool at once
            for page in last_table.pop(ev["id"], []):
                if owner.get(page) == ev["id"]:
                    del owner[page]
            preempted.add(ev["id"])
        elif kind == "release":
            released.add(ev["id"])
        elif kind == "snapshot":
            tables = ev["block_tables"]
            # A table as the snapshot before showed it is its last_table still, unless it was preempted since.
            for rid in changed[i] if preempted.isdisjoint(tables) else tables:
                table = tables[rid]
                before = last_table.get(rid, [])
                if table == before:
                    continue
                new = table[len(before):] if table[:len(before)] == before else [p for p in table if p not in before]
                last_table[rid] = table
                for page in new:
                    prev = owner.get(page)
                    owner[page] = rid
                    if prev is None or prev == rid or prev not in ended_at:
                        continue
                    end = ended_at[prev]
                    if prev not in released or ev["time"] < end + delay:
                        yield ix.violation("no_reuse_before_release",
                                           f"page {page} of {prev!r} (ended t={end}, release_delay {delay}) given to "
                                           f"{rid!r} at t={ev['time']}"
                                           + ("" if prev in released else f" before {prev!r} was released"), rid, i)
            preempted.clear()


def _held_at_end(ix: ReportIndex, rid: str) -> bool:
    """Whether the request held pages when it last ended while admitted (False if it never did).

    It did when it had fed rows in that incarnation (rows need pages), or
    when a snapshot after that end still shows pages in its table.
    """
    state, end = None, None
    for i, kind in ix.marks(rid):
        if kind in ("finished", "cancelled") and state == "active":
            end = i
        state = next_state(state, kind)
    if end is None:
        return False
    if ix.block_tables().last_holding.get(rid, -1) > end:
        return True
    # A row (which feeds at least one token, the schema's minimum) after its last preemption before that end.
    rows = ix.rows_of(rid)[0]
    last_row = rows[bisect_left(rows, end) - 1] if rows and rows[0] < end else -1
    return last_row > max((i for i in ix.of(rid, "preempted") if i < end), default=-1)


@clause("release_once_after_delay",
        "A request that holds pages at its end gets exactly one release event, after its terminal event and no "
        "earlier than its end time + release_delay; one that holds none gets at most one, no earlier; a request "
        "never admitted gets none.",
        "Release events are how the pool's drain is observed and audited.", needs=("release", "admit", "dispatch"),
        admits=("no release event for a request that holds no pages at its end (cancelled before its first row, "
                "or while preempted)"),
        reads=("config.release_delay", "events[release].time", "events[admit]", "events[finished].time",
               "events[cancelled].time", "events[rejected]", "events[dispatch].work[].input_tokens",
               "events[snapshot].block_tables"),
        compares={
            "events[release]": "exactly one release event, after its terminal event",
            "events[release].time": "no earlier than its end time + release_delay",
        })
def _release_once_after_delay(ix: ReportIndex) -> Iterator[Violation]:
    cid = "release_once_after_delay"
    delay = ix.cfg["release_delay"]
    for rid in ix.arrivals:
        releases = ix.of(rid, "release")
        if not ix.of(rid, "admit"):
            if releases:
                yield ix.violation(cid, "release for a request never admitted", rid, releases[0])
            continue
        held = _held_at_end(ix, rid)
        expected = "exactly 1" if held else "at most 1"
        if len(releases) > 1 or (held and not releases):
            yield ix.violation(cid, f"expected {expected} release event (it "
                                    f"{'holds' if held else 'holds no'} pages at its end), got "
                                    f"{len(releases)}", rid, releases[1] if releases[1:] else None)
        end = ix.terminal(rid)
        if releases and end is not None:
            at = releases[0]
            if at < end[0] or ix.time(at) < ix.time(end[0]) + delay:
                yield ix.violation(cid, f"released at t={ix.time(at)}, ended t={ix.time(end[0])}, release_delay "
                                        f"{delay}", rid, at)
        elif releases and end is None:
            yield ix.violation(cid, "released while it had not ended", rid, releases[0])


@clause("no_leaked_pages",
        "summary.free_blocks equals capacity; every request holding pages in the last snapshot is released after "
        "it; and a snapshot that follows the last release shows every page free and no block table holding one.",
        "A page still held after drain is a leak that grows until the server stops admitting.",
        needs=("snapshot", "release"),
        admits="no snapshot after the last release: the end state is then judged from the summary and the releases",
        reads=("config.capacity", "summary.free_blocks", "events[snapshot].block_tables",
               "events[snapshot].free_blocks", "events[release]"),
        compares={
            "summary.free_blocks": "summary.free_blocks equals capacity",
            "events[release]": "every request holding pages in the last snapshot is released after it",
            "events[snapshot].free_blocks": "shows every page free and no block table holding one",
        })
def _no_leaked_pages(ix: ReportIndex) -> Iterator[Violation]:
    cid = "no_leaked_pages"
    cap = ix.capacity
    if ix.report["summary"]["free_blocks"] != cap:
        yield ix.violation(cid, f"summary.free_blocks {ix.report['summary']['free_blocks']}, capacity {cap}")
    if not ix.snapshots:
        return
    last = ix.snapshots[-1]
    snap = ix.events[last]
    held = {rid: table for rid, table in snap["block_tables"].items() if table}
    releases = ix.kinds["release"]
    released_after = {ix.events[i]["id"] for i in releases if i > last}
    for rid, table in held.items():
        if rid not in released_after:
            yield ix.violation(cid, f"the last snapshot shows it holding {short(table)} and it is never released "
                                    f"after that", rid, last)
    if (not releases or releases[-1] < last) and (snap["free_blocks"] != cap or held):
        owners = ", ".join(f"{rid}: {short(t)}" for rid, t in list(held.items())[:5])
        after = "after the last release" if releases else "(the report releases nothing)"
        yield ix.violation(cid, f"final snapshot {after}: free_blocks {snap['free_blocks']} of {cap}"
                                + (f"; still held by {owners}" if held else ""), None, last)


@clause("drain_time_consistent",
        "summary.drained_at_tick is no earlier than the last release (or, with no release, the last terminal "
        "event) and no later than the report's last event.",
        "The drain time is when the pool is reusable, which is not the last response's latency.",
        needs=("release",),
        admits="drained_at_tick anywhere from the last release to the last event",
        reads=("summary.drained_at_tick", "events[release].time", "events[finished].time", "events[cancelled].time",
               "events[rejected].time", "events[*].time"),
        compares={
            "summary.drained_at_tick": "no earlier than the last release",
        })
def _drain_time_consistent(ix: ReportIndex) -> Iterator[Violation]:
    drained = ix.report["summary"]["drained_at_tick"]
    last = ix.events[-1]["time"] if ix.events else 0
    releases = ix.kinds["release"]
    ends = releases or [i for kind in TERMINAL for i in ix.kinds[kind]]
    floor = max(map(ix.time, ends), default=0)
    if drained is None or not floor <= drained <= last:
        what = "last release" if releases else "last terminal event"
        yield ix.violation("drain_time_consistent", f"summary.drained_at_tick {drained}, expected between the "
                                                    f"{what} at t={floor} and the last event at t={last}")
