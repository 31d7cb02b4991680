"""Running an implementation on a workload and judging each clause, without pytest.

``Judge`` caches one run (and one check) per workload, so every clause test of
a workload costs one simulation.  ``Judge.judge(clause, ...)`` returns a
``ClauseResult`` — pass, fail (with violations) or skip (with the reason) —
which the pytest layer and ``cbatch check`` both turn into their own output.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Collection, Mapping, Sequence

from .contract import (
    RUNNER_CLAUSES, Violation, check_report, claim_violations, clause_ids, opt_in_ids, out_of_scope, schema_kinds,
    unobservable,
)
from .impls import Implementation, RunOutcome

__all__ = ["ClauseResult", "Judge", "first_difference", "shrink_trace", "ALL_CLAUSES", "OPT_IN_CLAUSES",
           "judged_clauses"]

ALL_CLAUSES: tuple[str, ...] = ("completes",) + tuple(clause_ids())
"""Every clause judged by default, in order."""
OPT_IN_CLAUSES: tuple[str, ...] = tuple(opt_in_ids())
"""The clauses judged only when asked for (course_results: ``--cbatch-course``)."""


def judged_clauses(opt_in: Collection[str] = ()) -> tuple[str, ...]:
    """Every clause judged by default and the opt-in clauses named in ``opt_in``, in order."""
    return ("completes",) + tuple(clause_ids(opt_in))

COMPLETES_STATEMENT = "The implementation returns a report for every valid trace and config it supports."
NO_REPORT = "no report to check (see clause 'completes')"
SCHEMA_BLOCKED = "the report fails schema_valid, so this clause was not checked"


@dataclass
class ClauseResult:
    """The verdict of one clause on one workload."""

    clause: str
    status: str                      # "pass", "fail" or "skip"
    violations: list[Violation] = field(default_factory=list)
    reason: str = ""                 # why skipped
    report: dict[str, Any] | None = None
    unobservable: bool = False       # skipped because the report cannot show what the clause needs
    # Skipped because the submission failed this clause on the workload ("completes": no report;
    # "schema_valid": a report the clauses cannot read): not a capability, so grading counts it as not passed.
    blocked_by: str = ""
    stack: str = ""                  # the implementation's traceback (a crash) or its stack when it was stopped
    stopped: bool = False            # the run was stopped for a limit (time or memory): do not rerun it
    declined: tuple[str, ...] = ()   # skipped as unsupported: the settings it names (support.setting_text)
    not_run: bool = False            # the workload was never run (a limit on all the calls was used up)


@dataclass
class _Run:
    outcome: RunOutcome
    violations: list[Violation]   # of the clauses judged by default
    schema_ok: bool
    opted: dict[str, list[Violation]] = field(default_factory=dict)   # of each opt-in clause judged so far


class Judge:
    """Runs one implementation and judges clauses; caches a run per (trace, config).

    The report claims honoured (``contract.CLAIMS``) are those the implementation's kind declares
    (``Implementation.claims``), never those its reports make.
    """

    def __init__(self, impl: Implementation) -> None:
        self.impl = impl
        self.honoured: frozenset[str] = frozenset(getattr(impl, "claims", frozenset()))
        source = getattr(impl, "source", "")
        self.claimant: str = f"{impl.spec} ({source})" if source else impl.spec
        self._runs: dict[str, _Run] = {}

    def _key(self, trace: Sequence[Mapping[str, Any]], config: Mapping[str, Any]) -> str:
        return json.dumps([list(trace), dict(config)], sort_keys=True)

    def run(self, trace: Sequence[Mapping[str, Any]], config: Mapping[str, Any]) -> _Run:
        key = self._key(trace, config)
        if key not in self._runs:
            outcome = self.impl.run(trace, config)
            violations: list[Violation] = []
            claims: list[Violation] = []
            if outcome.report is not None:
                violations = check_report(outcome.report, trace, config, honoured=self.honoured,
                                          claimant=self.claimant)
                claims = claim_violations(outcome.report, self.honoured, self.claimant)
            # A claim the kind may not make fails schema_valid, yet the clauses were judged without it.
            schema_ok = all(v in claims for v in violations if v.clause == "schema_valid")
            self._runs[key] = _Run(outcome, violations, schema_ok)
        return self._runs[key]

    def forget(self) -> None:
        """Drop every cached run, and so its report: for a caller done with the workloads judged so far."""
        self._runs.clear()

    def judge(self, clause: str, trace: Sequence[Mapping[str, Any]], config: Mapping[str, Any]) -> ClauseResult:
        """Judge ``clause`` on the implementation's run of ``trace`` under ``config``."""
        if (clause not in ALL_CLAUSES and clause not in OPT_IN_CLAUSES) or clause == "invalid_input_refused":
            raise ValueError(f"unknown clause {clause!r} here (invalid_input_refused has its own check)")
        run = self.run(trace, config)
        out = run.outcome
        if out.unsupported:
            return ClauseResult(clause, "skip", reason=out.unsupported, declined=out.declined)
        if out.not_run:
            if clause != "completes":
                return ClauseResult(clause, "skip", reason=NO_REPORT, blocked_by="completes", not_run=True)
            return ClauseResult(clause, "fail", [Violation("completes", f"the workload was not run: {out.not_run}")],
                                not_run=True)
        if out.report is None:
            if clause != "completes":
                return ClauseResult(clause, "skip", reason=NO_REPORT, blocked_by="completes")
            if out.stopped:
                return ClauseResult(clause, "fail", [Violation("completes", f"the run was stopped: it {out.stopped}")],
                                    stack=out.stack, stopped=True)
            what = out.dodged or out.refused or out.broken or "no report"
            return ClauseResult(clause, "fail", [Violation("completes", f"no report for a valid workload: {what}")],
                                stack=out.stack)
        report = out.report
        if clause == "completes":
            return ClauseResult(clause, "pass", report=report)
        if clause == "input_not_mutated":
            found = [Violation(clause, f"the implementation mutated its input: {out.mutated}")] if out.mutated else []
            return ClauseResult(clause, "fail" if found else "pass", found, report=report)
        if not run.schema_ok and clause != "schema_valid":
            return ClauseResult(clause, "skip", reason=SCHEMA_BLOCKED, report=report, blocked_by="schema_valid")
        beyond = out_of_scope(clause, config)
        if beyond:
            return ClauseResult(clause, "skip", reason=beyond, report=report)
        hidden = unobservable(clause, report, self.honoured)
        if hidden is None and clause == "deterministic" and "time_unit" in self.honoured and \
                report.get("time_unit") == "seconds":
            hidden = ("not observable from this report: a live server's timings differ between runs, so "
                      "determinism is judged on engine reports only")
        if hidden:
            return ClauseResult(clause, "skip", reason=hidden, report=report, unobservable=True)
        if clause == "deterministic":
            again = self.impl.run(trace, config)
            if again.report is None:
                why = again.dodged or again.refused or again.broken or again.unsupported or again.not_run
                what = f"was stopped: it {again.stopped}" if again.stopped else f"gave no report: {why}"
                return ClauseResult(clause, "fail", [Violation(clause, f"the second run {what}")], report=report,
                                    stack=again.stack, stopped=bool(again.stopped))
            diff = first_difference(report, again.report)
            found = [Violation(clause, f"second run differs at {diff}")] if diff else []
            return ClauseResult(clause, "fail" if found else "pass", found, report=report)
        if clause in OPT_IN_CLAUSES:
            if clause not in run.opted:
                run.opted[clause] = check_report(report, trace, config, clauses=[clause])
            found = run.opted[clause]
        else:
            found = [v for v in run.violations if v.clause == clause]
        return ClauseResult(clause, "fail" if found else "pass", found, report=report)

    def judge_refusal(self, trace: Sequence[Mapping[str, Any]], config: Mapping[str, Any]) -> ClauseResult:
        """Clause invalid_input_refused on one invalid (trace, config) pair."""
        out = self.impl.run(trace, config)
        cid = "invalid_input_refused"
        if out.stopped:
            return ClauseResult(cid, "fail", [Violation(cid, f"the run on invalid input was stopped: it {out.stopped} "
                                                             f"(expected a refusal)")], stack=out.stack, stopped=True)
        if out.not_run:
            return ClauseResult(cid, "fail", [Violation(cid, f"the invalid input was not run: {out.not_run}")],
                                not_run=True)
        if out.refused or out.dodged:  # a decline of settings it supports raised on the input: a refusal
            return ClauseResult(cid, "pass", reason=out.refused or out.dodged or "")
        if out.unsupported:
            return ClauseResult(cid, "skip", reason=out.unsupported, declined=out.declined)
        if out.broken:  # a timeout, crash or garbage: say what happened, not that it "accepted" the input
            return ClauseResult(cid, "fail", [Violation(cid, f"invalid input not refused: {out.broken}")])
        return ClauseResult(cid, "fail", [Violation(cid, "invalid input accepted: the implementation returned a report")])


def first_difference(a: Any, b: Any, path: str = "") -> str | None:
    """JSON-pointer-like path and values of the first place two documents differ (as JSON: key order aside)."""
    if type(a) is not type(b):
        return f"{path or '/'}: {_brief(a)} vs {_brief(b)}"
    if isinstance(a, dict):
        for key in list(a) + [k for k in b if k not in a]:
            if key not in a or key not in b:
                return f"{path}/{key}: present in only one run"
            diff = first_difference(a[key], b[key], f"{path}/{key}")
            if diff:
                return diff
        return None  # JSON objects are unordered: keys in another order are the same document
    if isinstance(a, list):
        for i, (x, y) in enumerate(zip(a, b)):
            diff = first_difference(x, y, f"{path}/{i}")
            if diff:
                return diff
        if len(a) != len(b):
            return f"{path or '/'}: {len(a)} items vs {len(b)}"
        return None
    return None if a == b else f"{path or '/'}: {_brief(a)} vs {_brief(b)}"


def _brief(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 80 else text[:77] + "..."


def shrink_trace(
    judge: Judge, clause: str, trace: Sequence[Mapping[str, Any]], config: Mapping[str, Any], *, max_runs: int = 60
) -> list[dict[str, Any]]:
    """Greedily drop requests (with their cancels), then single cancels, while ``clause`` still fails.

    Returns the smallest failing trace found within ``max_runs`` extra runs
    (the original when nothing can go).  Clauses about the implementation
    itself (determinism, mutation) are not shrunk, and shrinking ends at the
    first candidate whose run was stopped for a limit.
    """
    current = [dict(line) for line in trace]
    if clause in RUNNER_CLAUSES:
        return current
    runs = 0

    # A schema failure keeps every distinct kind of issue while it shrinks, so no kind hides behind another.
    wanted = schema_kinds(judge.judge(clause, trace, config).violations) if clause == "schema_valid" else set()

    def still_fails(candidate: list[dict[str, Any]]) -> bool:
        nonlocal runs
        runs += 1
        if not candidate:
            return False
        if judge.run(candidate, config).outcome.stopped:  # a hang costs a whole limit per run: stop shrinking
            runs = max_runs
            return False
        result = judge.judge(clause, candidate, config)
        return result.status == "fail" and wanted <= schema_kinds(result.violations)

    for rid in [line["id"] for line in reversed(trace) if line["event"] == "arrival"]:
        if runs >= max_runs:
            break
        candidate = [line for line in current if line["id"] != rid]
        if len(candidate) < len(current) and still_fails(candidate):
            current = candidate
    for i in reversed(range(len(current))):
        if runs >= max_runs:
            break
        if current[i]["event"] == "cancel":
            candidate = current[:i] + current[i + 1:]
            if still_fails(candidate):
                current = candidate
    return current
