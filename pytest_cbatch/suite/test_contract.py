"""Conformance: every contract clause on every fixed workload, plus generated traces.

Test ids read ``test_contract[<clause>-<workload>]``; select with ``-k``.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given

from pytest_cbatch import strategies
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
    """test_contract's cases, with the opt-in clauses this run asked for (--cbatch-course)."""
    if metafunc.definition.originalname == "test_contract":
        metafunc.parametrize("clause,workload", contract_cases(judged_clauses(opted_clauses(metafunc.config))))


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


def _check_generated(state: CbatchState, workload: tuple[list[dict[str, Any]], dict[str, Any]], tag: str) -> None:
    trace, config = workload[0], state.workload_config(workload[1])
    judge = state.judge
    for cid in state.clauses:
        if cid in ("invalid_input_refused", "deterministic"):
            continue
        result = judge.judge(cid, trace, config)
        if result.status == "skip":
            if cid == "completes":
                return  # this generated config needs a capability the implementation lacks
            continue
        if result.status == "fail":
            fail_clause(state, cid, f"generated-{tag}", trace, config, result, shrink=False)


@given(workload=strategies.workloads())
def test_generated_traces(workload: tuple[list[dict[str, Any]], dict[str, Any]], cbatch_state: CbatchState) -> None:
    """Every report clause on hypothesis-generated traces and configs (reserve admission)."""
    _check_generated(cbatch_state, workload, "reserve")


@given(workload=strategies.preemption_workloads())
def test_generated_traces_preemption(workload: tuple[list[dict[str, Any]], dict[str, Any]],
                                     cbatch_state: CbatchState) -> None:
    """Every report clause on generated traces under optimistic admission on a tight pool (preemption,
    preemption during recompute, cancels of preempted requests)."""
    reason = cbatch_state.impl.unsupported_reason(cbatch_state.workload_config(workload[1]))
    if reason:
        pytest.skip(reason)
    _check_generated(cbatch_state, workload, "optimistic")
