"""The lifecycle machines accept the reference and catch every broken lifecycle by the expected clause.

The machines run directly under small derandomized settings, not through the
plugin, so these results do not depend on a Hypothesis profile.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from hypothesis import Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from pytest_cbatch.examples.broken_lifecycle import BROKEN
from pytest_cbatch.lifecycle import (
    LIFECYCLE_CLAUSES,
    MACHINES,
    PARTS,
    LifecycleViolation,
    lifecycle_settings,
    missing_parts,
)
from pytest_cbatch.reference import scheduler_faults

# No shrink phase: detection and the clause id are what is tested, and shrinking costs seconds per bug.
SETTINGS = lifecycle_settings(
    settings(max_examples=40, derandomize=True, database=None, deadline=None, print_blob=False,
             report_multiple_bugs=False, phases=(Phase.explicit, Phase.generate))
)


def broken_part(namespace: object) -> str:
    """The one part whose class the broken namespace replaces."""
    parts = [p for p, name in PARTS.items() if getattr(namespace, name) is not getattr(scheduler_faults, name)]
    assert len(parts) == 1, parts
    return parts[0]


def run_part(part: str, namespace: object) -> None:
    run_state_machine_as_test(MACHINES[part](namespace), settings=SETTINGS)


@pytest.mark.parametrize("part", list(PARTS))
def test_reference_conforms(part: str) -> None:
    run_part(part, scheduler_faults)


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_broken_lifecycle_is_caught_by_its_clause(name: str) -> None:
    namespace, clause = BROKEN[name]
    with pytest.raises(LifecycleViolation) as caught:
        run_part(broken_part(namespace), namespace)
    assert caught.value.clause == clause, str(caught.value)
    assert str(caught.value).startswith(f"[{clause}] ")


def test_falsifying_example_replays_as_python() -> None:
    """The note lines of a failure are a runnable script that reproduces it."""
    namespace, _ = BROKEN["second_cancel_raises"]
    with pytest.raises(LifecycleViolation) as caught:
        run_part("recompute", namespace)
    notes = getattr(caught.value, "__notes__", [])
    hypothesis_lines = ("Falsifying", "Failing", "state", "Draw ", "Explanation", " ")  # across versions
    *steps, failing = [line for note in notes for line in note.splitlines()
                       if line and not line.startswith(hypothesis_lines)]
    assert any(line.startswith("pool = PagedKV(") for line in steps)
    assert ".cancel()  # raised RuntimeError" in failing
    scope = {name: getattr(namespace, name) for name in PARTS.values()}
    exec("\n".join(steps), scope)
    with pytest.raises(RuntimeError, match="already cancelled"):
        exec(failing, scope)


def test_every_expected_clause_is_a_lifecycle_clause() -> None:
    assert {clause for _, clause in BROKEN.values()} <= set(LIFECYCLE_CLAUSES)
    for clause, statement in LIFECYCLE_CLAUSES.items():
        assert clause.startswith("lifecycle.") and statement and "\n" not in statement


def test_missing_parts_names_what_is_absent() -> None:
    assert missing_parts(scheduler_faults) == {}
    assert set(missing_parts(None)) == set(PARTS)
    only_pool = missing_parts(SimpleNamespace(PagedKV=scheduler_faults.PagedKV))
    assert set(only_pool) == {"recompute", "transfer"}
    assert "RecomputeRequest" in only_pool["recompute"] and "PagedKV" not in only_pool["recompute"]
