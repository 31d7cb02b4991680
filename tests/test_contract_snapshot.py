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
