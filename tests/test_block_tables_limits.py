"""``BlockTables.oversized``: how many of a snapshot's tables list more pages than their request may need."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from pytest_cbatch.contract.tables import BlockTables

# Tables of up to four requests over snapshots; ids come and go, tables grow, shrink and are replaced.
_tables = st.dictionaries(st.sampled_from(["a", "b", "c", "d"]), st.lists(st.integers(0, 9), max_size=5),
                          max_size=4)
_limits = st.dictionaries(st.sampled_from(["a", "b", "c", "e"]), st.integers(0, 4))


@settings(max_examples=200, deadline=None)
@given(st.lists(_tables, max_size=8), _limits)
def test_oversized_agrees_with_counting_every_table(snaps: list[dict[str, list[int]]],
                                                    limits: dict[str, int]) -> None:
    events = [{"event": "snapshot", "time": t, "block_tables": tables} for t, tables in enumerate(snaps)]
    facts = BlockTables(events, range(len(events)), 10, limits)
    for i, tables in enumerate(snaps):
        assert facts.oversized[i] == sum(1 for rid, table in tables.items()
                                         if rid in limits and len(table) > limits[rid])


def test_without_limits_no_table_is_oversized() -> None:
    events = [{"event": "snapshot", "time": 0, "block_tables": {"a": [0, 1, 2]}}]
    assert BlockTables(events, [0], 4).oversized == {0: 0}


def test_a_table_past_its_largest_need_is_still_reported() -> None:
    """pages_cover_rows looks at a snapshot's tables one by one only when one could be at fault; a table
    that grew past its request's largest need (while the request runs) is one."""
    from pytest_cbatch.contract import check_report, required_blocks
    from pytest_cbatch.reference.scheduler_sim import simulate

    trace = [{"time": 0, "event": "arrival", "id": "a", "prompt_tokens": 4, "output_tokens": 3}]
    config = {"capacity": 8, "block_size": 2, "token_budget": 8, "max_active": 2, "prefill_chunk": 8,
              "release_delay": 1}
    report = simulate(trace, **config)
    assert check_report(report, trace, config) == []
    snap = next(ev for ev in report["events"] if ev["event"] == "snapshot" and ev["block_tables"].get("a"))
    most = required_blocks(4, 3, 2)
    snap["block_tables"]["a"] = list(range(most + 1))
    found = check_report(report, trace, config, clauses=["pages_cover_rows"])
    assert [v.message for v in found] == [f"holds {most + 1} pages; its whole sequence needs at most {most}"]
