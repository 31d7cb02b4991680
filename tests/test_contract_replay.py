"""The facts the contract's clauses share: one replay of the events, the block tables read once as changes.

Clauses registered with ``at=`` are judged during one replay that the index
runs for all of them, and the pool clauses read the snapshots' block tables
from one census; a clause checked alone (``check_report(..., clauses=[id])``)
must find exactly the pinned violations, and the census must agree with
counting every table of every snapshot.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from contract_snapshot import SNAPSHOT, verdicts
from pytest_cbatch.contract import CLAUSES, Violation, check_report, clause
from pytest_cbatch.contract.tables import BlockTables
from pytest_cbatch.reference.scheduler_sim import simulate
from pytest_cbatch.workloads import WORKLOADS

PINNED = json.loads(SNAPSHOT.read_text())
REPLAYED = [cid for cid, c in CLAUSES.items() if c.at]


def each_clause_alone(report: dict[str, Any], trace: list[Any], config: dict[str, Any],
                      max_per_clause: int = 20) -> list[Violation]:
    """check_report run once per clause judged by default, each time checking that clause only; the schema gate
    once."""
    gate = check_report(report, trace, config, clauses=[], max_per_clause=max_per_clause)
    if gate:
        return gate
    return [v for cid in CLAUSES if not CLAUSES[cid].opt_in
            for v in check_report(report, trace, config, clauses=[cid], max_per_clause=max_per_clause)]


def test_the_pool_clauses_share_the_replay() -> None:
    assert {"pages_conserved", "snapshot_counts", "pages_cover_rows"} <= set(REPLAYED)


@pytest.mark.parametrize("case", PINNED["cases"][::4], ids=[c["name"] for c in PINNED["cases"][::4]])
def test_each_clause_checked_alone_finds_the_pinned_violations(case: dict) -> None:
    """Every fourth pinned case (each clause alone checks every report once per clause)."""
    pinned = {key: rows for key, rows in PINNED["violations"].items() if key.endswith(f"/{case['name']}")}
    assert verdicts([case], check=each_clause_alone) == pinned


def test_checking_one_clause_runs_only_its_own_judge(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: dict[str, int] = dict.fromkeys(REPLAYED, 0)
    for cid in REPLAYED:
        def counted(ix: Any, i: int, ev: dict, replay: Any, _cid: str = cid, _step: Any = CLAUSES[cid].step) -> Any:
            calls[_cid] += 1
            return _step(ix, i, ev, replay)

        monkeypatch.setitem(CLAUSES, cid, dataclasses.replace(CLAUSES[cid], step=counted))
    demo = WORKLOADS["demo"]
    trace = list(demo.trace)
    report = simulate(trace, **demo.config)
    assert check_report(report, trace, demo.config, clauses=["snapshot_counts"]) == []
    assert calls["snapshot_counts"] > 0
    assert {cid: n for cid, n in calls.items() if n and cid != "snapshot_counts"} == {}


def test_a_replayed_clause_judges_the_state_just_before_its_event() -> None:
    """snapshot_counts sees an admit that precedes the snapshot, and not one that follows it."""
    demo = WORKLOADS["demo"]
    trace = list(demo.trace)
    report = simulate(trace, **demo.config)
    events = report["events"]
    i = next(k for k, ev in enumerate(events) if ev["event"] == "admit")
    j = next(k for k in range(i + 1, len(events)) if events[k]["event"] == "snapshot")
    events.insert(j, events.pop(i))   # the admit now follows the snapshot that listed it as active
    found = check_report(report, trace, demo.config, clauses=["snapshot_counts"])
    assert found and all(v.clause == "snapshot_counts" for v in found)
    assert found[0].event_index == j - 1


def test_at_must_name_events_the_replay_visits() -> None:
    with pytest.raises(ValueError, match="token"):
        clause("not_registered", "A statement.", "A reason.", at=("token",))
    assert "not_registered" not in CLAUSES


# Tables of up to four requests over snapshots; pages may repeat or fall outside the pool, ids come and go.
_tables = st.dictionaries(st.sampled_from(["a", "b", "c", "d"]), st.lists(st.integers(-1, 9), max_size=5),
                          max_size=4)


@settings(max_examples=200, deadline=None)
@given(st.lists(_tables, max_size=8), st.integers(1, 9))
def test_block_tables_census_agrees_with_counting_every_table(snaps: list[dict[str, list[int]]],
                                                                 capacity: int) -> None:
    events = [{"event": "snapshot", "time": t, "block_tables": tables} for t, tables in enumerate(snaps)]
    facts = BlockTables(events, range(len(events)), capacity)
    before: dict[str, list[int]] = {}
    for i, tables in enumerate(snaps):
        listed = [page for table in tables.values() for page in table]
        outside = sum(1 for page in listed if not 0 <= page < capacity)
        assert facts.census[i] == (len(listed), len(set(listed)), outside)
        assert facts.changed[i] == [rid for rid, table in tables.items() if before.get(rid) != table]
        before = tables
    for rid in "abcd":
        holding = [i for i, tables in enumerate(snaps) if tables.get(rid)]
        assert facts.last_holding.get(rid) == (holding[-1] if holding else None)


def _reuse_verdict(preempt: bool) -> list[Violation]:
    """a and b list page 0 together (a preempted just before, or not); b ends unreleased; then c gets page 0."""
    events: list[dict[str, Any]] = [{"time": 0, "event": "arrival", "id": rid} for rid in "abc"]
    events += [{"time": 0, "event": "admit", "id": "a"}, {"time": 0, "event": "admit", "id": "b"},
               {"time": 0, "event": "snapshot", "block_tables": {"a": [0], "b": [1]}}]
    events += [{"time": 1, "event": "preempted", "id": "a"}] if preempt else []
    events += [{"time": 1, "event": "snapshot", "block_tables": {"b": [1, 0], "a": [0]}},
               {"time": 2, "event": "finished", "id": "b"}, {"time": 3, "event": "admit", "id": "c"},
               {"time": 3, "event": "snapshot", "block_tables": {"a": [0], "c": [0]}}]
    trace = [{"time": 0, "event": "arrival", "id": rid, "prompt_tokens": 1, "output_tokens": 1} for rid in "abc"]
    config = {"capacity": 2, "block_size": 1, "release_delay": 0}
    from pytest_cbatch.contract import ReportIndex

    return list(CLAUSES["no_reuse_before_release"].check(ReportIndex({"events": events, "config": config},
                                                                     trace, config)))


def test_a_table_listed_again_after_a_preemption_takes_its_pages_back() -> None:
    """A preempted request's pages went back to the pool, so listing them again (even unchanged) is a new
    claim: page 0 is then a's, not b's, and c taking it reuses no page of the ended b."""
    assert _reuse_verdict(preempt=True) == []
    [found] = _reuse_verdict(preempt=False)
    assert "page 0 of 'b'" in found.message and found.request == "c"
