"""Conformance: every contract clause on every fixed workload, plus generated traces.

Test ids read ``test_contract[<clause>-<workload>]``, and for the generated traces
``test_generated_traces[<clause>]`` (reserve admission) and
``test_generated_traces_preemption[<clause>]`` (optimistic admission): each clause
on the same examples, failing and shrinking on its own; select with ``-k``.
"""

from __future__ import annotations

from typing import Any

import pytest

from pytest_cbatch import strategies
from pytest_cbatch.generated import GENERATED_SKIPPED, GeneratedExamples, judge_generated
from pytest_cbatch.plugin import CbatchState, fail_clause, opted_clauses
from pytest_cbatch.runner import judged_clauses
from pytest_cbatch.workloads import BASE_CONFIG, INVALID_INPUTS, WORKLOADS


def contract_cases(clauses: tuple[str, ...]) -> list[Any]:
    """test_contract's parameters: each of ``clauses`` on every fixed workload, and the invalid inputs."""
    return [
        pytest.param(cid, name, id=f"{cid}-{name}")
        for name in WORKLOADS
        for cid in clauses
        if cid != "invalid_input_refused"
    ] + [pytest.param("invalid_input_refused", name, id=f"invalid_input_refused-{name}") for name in INVALID_INPUTS]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """test_contract's cases, and the generated-trace tests' clauses, with the opt-in clauses this run asked
    for (--cbatch-course)."""
    clauses = judged_clauses(opted_clauses(metafunc.config))
    if metafunc.definition.originalname == "test_contract":
        metafunc.parametrize("clause,workload", contract_cases(clauses))
    elif metafunc.definition.get_closest_marker("cbatch_generated") is not None:
        metafunc.parametrize("clause", [cid for cid in clauses if cid not in GENERATED_SKIPPED])


def test_contract(clause: str, workload: str, cbatch_state: CbatchState, request: pytest.FixtureRequest) -> None:
    request.node.user_properties += [("cbatch_clause", clause), ("cbatch_workload", workload)]
    judge = cbatch_state.judge
    if clause == "invalid_input_refused":
        trace, overrides = INVALID_INPUTS[workload]
        result = judge.judge_refusal(trace, {**BASE_CONFIG, **overrides})
        config = {**BASE_CONFIG, **overrides}
    else:
        w = WORKLOADS[workload]
        trace, config = list(w.trace), cbatch_state.workload_config(w.config, explicit=w.overrides)
        result = judge.judge(clause, trace, config)
    if result.status == "skip":
        pytest.skip(result.reason)
    if result.status == "fail":
        fail_clause(cbatch_state, clause, workload, list(trace), config, result,
                    shrink=clause != "invalid_input_refused")


@pytest.fixture(scope="session")
def cbatch_generated_examples() -> GeneratedExamples:
    """The run's generated examples, drawn once and judged by every clause's generated test."""
    return GeneratedExamples()


@pytest.mark.cbatch_generated("generated-reserve")
def test_generated_traces(clause: str, cbatch_state: CbatchState, cbatch_generated_examples: GeneratedExamples,
                          request: pytest.FixtureRequest) -> None:
    """One report clause on hypothesis-generated traces and configs (reserve admission)."""
    request.node.user_properties += [("cbatch_clause", clause), ("cbatch_workload", "generated-reserve")]
    judge_generated(cbatch_state, request.node, cbatch_generated_examples, clause, "generated-reserve",
                    strategies.workloads())


@pytest.mark.cbatch_generated("generated-optimistic")
def test_generated_traces_preemption(clause: str, cbatch_state: CbatchState,
                                     cbatch_generated_examples: GeneratedExamples,
                                     request: pytest.FixtureRequest) -> None:
    """One report clause on generated traces under optimistic admission on a tight pool (preemption,
    preemption during recompute, cancels of preempted requests)."""
    request.node.user_properties += [("cbatch_clause", clause), ("cbatch_workload", "generated-optimistic")]
    judge_generated(cbatch_state, request.node, cbatch_generated_examples, clause, "generated-optimistic",
                    strategies.preemption_workloads(), preemption=True)
