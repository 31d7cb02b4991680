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


def _covered(state: CbatchState) -> list[str]:
    """The clauses a generated example judges: every one but those with workloads of their own."""
    return [cid for cid in state.clauses if cid not in ("invalid_input_refused", "deterministic")]


class _Examples:
    """What the generated examples of one test judged: the clauses that reached a verdict, the clause that
    failed, and why examples judged nothing (the implementation declined their settings)."""

    def __init__(self) -> None:
        self.tried = 0
        self.judged: set[str] = set()
        self.failed = ""
        self.declined: dict[str, None] = {}

    def check(self, state: CbatchState, workload: tuple[list[dict[str, Any]], dict[str, Any]], tag: str) -> None:
        """Judge every report clause on one generated example; a failure fails the test."""
        trace, config = workload[0], state.workload_config(workload[1])
        judge = state.judge
        self.tried += 1
        for cid in _covered(state):
            result = judge.judge(cid, trace, config)
            if result.status == "skip":
                if cid == "completes":
                    self.declined.setdefault(result.reason)  # this generated config needs a capability it lacks
                    return
                continue
            self.judged.add(cid)
            if result.status == "fail":
                self.failed = cid
                fail_clause(state, cid, f"generated-{tag}", trace, config, result, shrink=False)

    def record(self, state: CbatchState, node: pytest.Item) -> None:
        """Hand the clauses the examples cover, those they judged and the one that failed to the end-of-run
        summary."""
        node.user_properties += [("cbatch_covered", ",".join(_covered(state))),
                                 ("cbatch_judged", ",".join(sorted(self.judged))), ("cbatch_failed", self.failed)]

    def require_judged(self) -> None:
        """Skip, saying why, when no example reached a verdict: a test that judged nothing is not a pass."""
        if not self.judged:
            why = "; ".join(list(self.declined)[:3]) or "no example ran"
            pytest.skip(f"not judged: the implementation declined all {self.tried} generated examples ({why})")


def _run_examples(strategy: Any, state: CbatchState, request: pytest.FixtureRequest, tag: str) -> None:
    examples = _Examples()

    @given(workload=strategy)
    def run(workload: tuple[list[dict[str, Any]], dict[str, Any]]) -> None:
        examples.check(state, workload, tag)

    try:
        run()
    finally:
        examples.record(state, request.node)
    examples.require_judged()


def test_generated_traces(cbatch_state: CbatchState, request: pytest.FixtureRequest) -> None:
    """Every report clause on hypothesis-generated traces and configs (reserve admission)."""
    _run_examples(strategies.workloads(), cbatch_state, request, "reserve")


def test_generated_traces_preemption(cbatch_state: CbatchState, request: pytest.FixtureRequest) -> None:
    """Every report clause on generated traces under optimistic admission on a tight pool (preemption,
    preemption during recompute, cancels of preempted requests)."""
    optimistic = cbatch_state.workload_config({**BASE_CONFIG, "admission": "optimistic"})
    reason = cbatch_state.impl.unsupported_reason(optimistic)
    if reason:
        pytest.skip(reason)
    _run_examples(strategies.preemption_workloads(), cbatch_state, request, "optimistic")
