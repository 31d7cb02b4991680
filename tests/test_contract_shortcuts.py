"""The clauses' shortcuts clear only what their walks would clear.

``pending_sample_fed_once``, ``row_shape`` and ``lifecycle_order`` first test
each request's rows and tokens from the index's compact lists
(``_fed_as_emitted``, ``_rows_well_formed``, ``_rows_while_admitted``) and
walk the events only when that test cannot clear them.  A shortcut that
cleared a faulty request would pass broken code, so each clause is judged
here twice on edited reports, with its shortcut and with the shortcut
refusing every request (the walk alone), and must find the same violations.
``pages_cover_rows`` looks again at each snapshot only at the requests whose
page need or block table changed; on edited rows and tables it must find the
requests short of pages, and the tables held by requests neither admitted nor
draining, that looking at every request in every snapshot finds.
"""

from __future__ import annotations

import copy
from typing import Any, Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from contract_snapshot import generated_cases
from pytest_cbatch.contract import ReportIndex, check_report, rows
from pytest_cbatch.contract.core import Replay
from pytest_cbatch.reference.scheduler_sim import simulate
from pytest_cbatch.workloads import WORKLOADS

SHORTCUTS = {"pending_sample_fed_once": "_fed_as_emitted", "row_shape": "_rows_well_formed",
             "lifecycle_order": "_rows_while_admitted"}
CASES = [{"name": w.name, "trace": list(w.trace), "config": w.config}
         for w in WORKLOADS.values() if w.name in ("preempt_decode", "preempt_cancel", "preempt_tight",
                                                    "chunk_boundaries", "cancel_mid_prefill", "demo")]
CASES += generated_cases(12, seed=31)
REPORTS = [(case, simulate(copy.deepcopy(case["trace"]), **case["config"])) for case in CASES]


def _edit_rows(report: dict[str, Any], draw: Callable[[Any], Any]) -> None:
    """One edit of what the shortcuts read: a row's size, phase or place, a token, a preemption."""
    events = report["events"]
    dispatches = [i for i, ev in enumerate(events) if ev["event"] == "dispatch" and ev["work"]]
    tokens = [i for i, ev in enumerate(events) if ev["event"] == "token"]
    if not dispatches:
        return
    i = draw(st.sampled_from(dispatches))
    work = events[i]["work"]
    row = draw(st.sampled_from(work))
    edit = draw(st.sampled_from(["size", "last", "phase", "twice", "move", "drop_token", "move_token", "preempt",
                                 "empty"]))
    if edit == "size":
        row["input_tokens"] = max(1, row["input_tokens"] + draw(st.sampled_from([-1, 1, 2, 40])))
    elif edit == "last":   # the request's last row, which may come after its last output
        last = [r for k in dispatches for r in events[k]["work"] if r["id"] == row["id"]][-1]
        last["input_tokens"] += draw(st.sampled_from([1, 16, 64]))
    elif edit == "phase":
        row["phase"] = draw(st.sampled_from(["prefill", "decode", "recompute"]))
    elif edit == "twice":
        work.append(dict(row))
    elif edit == "move":
        work.remove(row)
        events[draw(st.sampled_from(dispatches))]["work"].append(row)
    elif edit == "drop_token" and tokens:
        del events[draw(st.sampled_from(tokens))]
    elif edit == "move_token" and tokens:
        events.insert(draw(st.integers(0, len(events))), events.pop(draw(st.sampled_from(tokens))))
    elif edit == "preempt":   # shortly before one of its rows, or anywhere
        events.insert(draw(st.sampled_from([i, max(0, i - 3), draw(st.integers(0, len(events)))])),
                      {"time": events[i]["time"], "event": "preempted", "id": row["id"], "released_blocks": 0})
    elif edit == "empty":
        work.clear()


def _verdicts(cid: str, report: dict[str, Any], case: dict[str, Any]) -> list[Any]:
    return check_report(report, case["trace"], case["config"], clauses=[cid], max_per_clause=10**6)


def _edited(data: st.DataObject, pick: int, edits: int, kinds: list[Callable[..., None]]) -> tuple[Any, Any]:
    """A copy of report ``pick`` with ``edits`` edits of the ``kinds`` drawn, still schema-valid."""
    case, report = REPORTS[pick]
    bad = copy.deepcopy(report)
    for _ in range(edits):
        data.draw(st.sampled_from(kinds))(bad, data.draw)
    assert check_report(bad, case["trace"], case["config"], clauses=[]) == []   # the clauses judge it
    return case, bad


@settings(max_examples=100, deadline=None, derandomize=True, database=None)
@given(data=st.data(), pick=st.integers(0, len(REPORTS) - 1), edits=st.integers(1, 3))
def test_each_shortcut_agrees_with_its_walk(data: st.DataObject, pick: int, edits: int) -> None:
    case, bad = _edited(data, pick, edits, [_edit_rows])
    for cid, name in SHORTCUTS.items():
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(rows, name, lambda *args: False)
            walked = _verdicts(cid, bad, case)
        assert _verdicts(cid, bad, case) == walked, cid


@pytest.mark.parametrize("case, report", REPORTS, ids=[case["name"] for case, _ in REPORTS])
def test_each_shortcut_clears_the_reference(case: dict[str, Any], report: dict[str, Any]) -> None:
    """On honest reports the shortcuts clear every request (else they would save nothing)."""
    from pytest_cbatch.contract import ReportIndex

    ix = ReportIndex(report, case["trace"], case["config"])
    chunk = ix.cfg["prefill_chunk"]
    for rid, line in ix.arrivals.items():
        assert rows._rows_while_admitted(ix, rid), rid
        assert rows._rows_well_formed(ix, rid, line["prompt_tokens"], chunk), rid
        assert rows._fed_as_emitted(ix, rid, line["prompt_tokens"]), rid


def test_rows_past_the_last_output_are_judged() -> None:
    """A request cancelled during its prefill emits no output; rows beyond its prompt fail the clause."""
    case, report = next((case, report) for case, report in REPORTS if case["name"] == "cancel_mid_prefill")
    bad = copy.deepcopy(report)
    emitted = {ev["id"] for ev in bad["events"] if ev["event"] == "token"}
    last = [row for ev in bad["events"] if ev["event"] == "dispatch" for row in ev["work"]
            if row["id"] not in emitted][-1]
    last["input_tokens"] += 1000
    found = _verdicts("pending_sample_fed_once", bad, case)
    assert len(found) == 1 and found[0].request == last["id"], found
    assert found[0].message.startswith("rows fed reach") and "0 outputs emitted" in found[0].message, found


def _edit_tables(report: dict[str, Any], draw: Callable[[Any], Any]) -> None:
    """One edit of a snapshot's block tables: a table shorter, gone, or given to another request."""
    ids = sorted(report["requests"])
    events = report["events"]
    snapshots = [ev for ev in events if ev["event"] == "snapshot" and ev["block_tables"]]
    if not snapshots:
        return
    tables = draw(st.sampled_from(snapshots))["block_tables"]
    rid = draw(st.sampled_from(sorted(tables)))
    edit = draw(st.sampled_from(["shorter", "gone", "moved"]))
    if edit == "shorter":
        del tables[rid][draw(st.integers(0, 2)):]
    elif edit == "gone":
        del tables[rid]
    else:
        tables[draw(st.sampled_from(ids))] = tables.pop(rid)


def _at_every_snapshot(report: dict[str, Any], case: dict[str, Any]) -> list[tuple[str, str, int]]:
    """("short", request, snapshot) where an admitted or draining request's table is short of its rows, and
    ("held", request, snapshot) where a request neither admitted nor draining holds pages, every request
    looked at in every snapshot."""
    ix = ReportIndex(report, case["trace"], case["config"])
    replay, found = Replay(), []
    for i in ix.steps:
        ev = ix.events[i]
        if ev["event"] == "snapshot":
            tables = ev["block_tables"]
            for members in (replay.members["active"], replay.members["draining"]):
                found += [("short", rid, i) for rid in sorted(members)
                          if len(tables.get(rid, ())) < -(-replay.fed.get(rid, 0) // ix.bs)]
            found += [("held", rid, i) for rid, table in tables.items()
                      if table and rid in ix.arrivals and replay.state.get(rid) not in ("active", "draining")]
        replay.advance(ev)
    return found


def _pages_cover_rows_found(report: dict[str, Any], case: dict[str, Any]) -> list[tuple[str, str, int]]:
    found = []
    for v in _verdicts("pages_cover_rows", report, case):
        if v.message.startswith("has fed"):
            found.append(("short", v.request, v.event_index))
        elif " while " in v.message:
            found.append(("held", v.request, v.event_index))
    return found


@settings(max_examples=60, deadline=None, derandomize=True, database=None)
@given(data=st.data(), pick=st.integers(0, len(REPORTS) - 1), edits=st.integers(1, 4))
def test_pages_cover_rows_finds_every_short_table(data: st.DataObject, pick: int, edits: int) -> None:
    case, bad = _edited(data, pick, edits, [_edit_rows, _edit_tables])
    assert _pages_cover_rows_found(bad, case) == _at_every_snapshot(bad, case)


def test_pages_cover_rows_forgets_a_short_table_at_preemption() -> None:
    """A request's table shown empty from just before its preemption until it holds pages again: short
    before the preemption, no longer short after it (it has fed nothing this incarnation), though the
    snapshots show the same table."""
    case, report = next((case, report) for case, report in REPORTS if case["name"] == "preempt_tight")
    bad = copy.deepcopy(report)
    events = bad["events"]
    emptied = 0
    for k, ev in enumerate(events):
        if ev["event"] != "preempted":
            continue
        rid = ev["id"]
        held = [j for j, s in enumerate(events[:k]) if s["event"] == "snapshot" and s["block_tables"].get(rid)]
        for s in events[held[-1]:] if held else ():
            if s["event"] == "snapshot":
                if s["time"] > ev["time"] and s["block_tables"].get(rid):
                    break
                s["block_tables"][rid] = []
                emptied += 1
    assert emptied, "the workload preempts no request that held pages"
    found = _pages_cover_rows_found(bad, case)
    assert found and found == _at_every_snapshot(bad, case)
