"""The kit catches every shipped broken scheduler with its intended clause, and passes the reference."""

from __future__ import annotations

import pytest

from pytest_cbatch.examples.broken_schedulers import BROKEN
from pytest_cbatch.impls import PythonImplementation
from pytest_cbatch.runner import ALL_CLAUSES, Judge
from pytest_cbatch.workloads import BASE_CONFIG, INVALID_INPUTS, WORKLOADS


def _failures(target, clause: str) -> list[str]:
    """Workloads (or invalid-input cases) on which ``clause`` fails for ``target``."""
    judge = Judge(PythonImplementation("broken", target, "test"))
    if clause == "invalid_input_refused":
        return [name for name, (trace, extra) in INVALID_INPUTS.items()
                if judge.judge_refusal(trace, {**BASE_CONFIG, **extra}).status == "fail"]
    return [name for name, w in WORKLOADS.items() if judge.judge(clause, list(w.trace), w.config).status == "fail"]


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_broken_scheduler_fails_its_clause(name: str) -> None:
    target, clause = BROKEN[name]
    assert _failures(target, clause), f"{name} should fail clause {clause} on some workload"


def test_every_clause_family_has_a_broken_scheduler() -> None:
    caught = {clause for _, clause in BROKEN.values()}
    assert len(caught) >= 18  # some clauses have two: a second bug where the first workloads saw it only narrowly


def test_reference_passes_every_clause_on_every_workload() -> None:
    from pytest_cbatch.reference.scheduler_sim import simulate

    judge = Judge(PythonImplementation("reference", simulate, "test"))
    for name, w in WORKLOADS.items():
        for clause in ALL_CLAUSES:
            if clause == "invalid_input_refused":
                continue
            result = judge.judge(clause, list(w.trace), w.config)
            assert result.status == "pass", (name, clause, result.violations, result.reason)
    for name, (trace, extra) in INVALID_INPUTS.items():
        assert judge.judge_refusal(trace, {**BASE_CONFIG, **extra}).status == "pass", name


# The depth workloads, each named for the bug it was written to catch by its own clause.
DEPTH = {
    "impossible_left_queued": "impossible_alone",
    "reuse_while_draining": "drain_reuse",
    "rejections_uncounted": "mixed_endings",
}


@pytest.mark.parametrize("name", sorted(DEPTH))
def test_depth_workload_fails_the_bug_by_its_own_clause(name: str) -> None:
    from pytest_cbatch.contract import check_report

    target, clause = BROKEN[name]
    w = WORKLOADS[DEPTH[name]]
    failed = {v.clause for v in check_report(target(list(w.trace), **w.config), list(w.trace), w.config)}
    assert clause in failed and "schema_valid" not in failed, failed


def test_summary_status_counts_are_judged_on_several_workloads() -> None:
    assert len(_failures(BROKEN["rejections_uncounted"][0], "terminal_exactly_once")) >= 3
