"""check_report's verdicts are pinned: the same violations as the snapshot, case by case.

The snapshot (see ``contract_snapshot``) holds fixed workloads, seeded
generated traces and seeded corruptions of the reference's reports, with every
violation each shipped broken scheduler and the reference get.  It was
captured before the checker's indexing was rewritten for speed, so a change in
how clauses are computed that changes any verdict fails here.
"""

from __future__ import annotations

import json

import pytest

from contract_snapshot import SNAPSHOT, verdicts

PINNED = json.loads(SNAPSHOT.read_text())


@pytest.mark.parametrize("case", PINNED["cases"], ids=[c["name"] for c in PINNED["cases"]])
def test_violations_match_the_snapshot(case: dict) -> None:
    pinned = {key: rows for key, rows in PINNED["violations"].items() if key.endswith(f"/{case['name']}")}
    got = verdicts([case])
    assert got.keys() == pinned.keys()
    for key, rows in pinned.items():
        assert got[key] == rows, key


def test_the_snapshot_exercises_many_clauses() -> None:
    """A snapshot that pins no violations would pin nothing."""
    clauses = {row[0] for rows in PINNED["violations"].values() for row in rows}
    assert len(clauses) >= 20, clauses


@pytest.mark.parametrize("enabled", [True, False])
def test_check_report_leaves_the_garbage_collector_as_it_found_it(enabled: bool,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    import gc

    import pytest_cbatch.contract as contract
    from pytest_cbatch.contract import check_report
    from pytest_cbatch.reference.scheduler_sim import simulate
    from pytest_cbatch.workloads import WORKLOADS

    demo = WORKLOADS["demo"]
    report = simulate(list(demo.trace), **demo.config)
    was = gc.isenabled()
    try:
        gc.enable() if enabled else gc.disable()
        assert check_report(report, list(demo.trace), demo.config) == []
        assert gc.isenabled() is enabled
        def broken_index(*args: object) -> None:
            raise RuntimeError("index failed")

        monkeypatch.setattr(contract, "ReportIndex", broken_index)
        with pytest.raises(RuntimeError, match="index failed"):
            check_report(report, list(demo.trace), demo.config)
        assert gc.isenabled() is enabled
    finally:
        gc.enable() if was else gc.disable()
