"""A submission's contract part in grading: one test per clause, judged on the plan's workloads.

``Contract`` judges the visible workloads and the invalid inputs first (``visible``), the hidden ones
last (``finish``), so that nothing a student sees is judged after a hidden workload; a ``_Tally`` per
clause puts every workload in exactly one count, so each test's line adds up, and the rubric's
``optional`` settings decide which declined workloads cost nothing.  ``grading.evaluate`` calls it.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path

from ..explain import explain_failure, replay_command, trace_jsonl
from ..runner import ClauseResult, Judge, shrink_trace
from ..support import matching
from .plan import HIDDEN_TEST, Case, Plan
from .results import TestResult

__all__ = ["Contract"]

_SHOWN_LABELS = 8
_EXPLAINED_HIDDEN = 8  # hidden failures explained in full (with a shrunk trace) in hidden-failures.txt


@dataclass
class _Tally:
    """What one clause saw on the workloads of a plan; every workload lands in exactly one count, so ``ran``
    plus the others is ``sum(kinds.values())``."""

    kinds: Counter[str] = field(default_factory=Counter)   # every workload the clause was asked on, by kind
    ran: int = 0
    skipped: list[str] = field(default_factory=list)   # outside the clause's scope for the workload's settings
    optional: list[tuple[Case, ClauseResult]] = field(default_factory=list)   # declined, optional in the rubric
    declined: list[tuple[Case, ClauseResult]] = field(default_factory=list)   # declined otherwise: not passed
    not_run: list[tuple[Case, ClauseResult]] = field(default_factory=list)    # never run (a limit): not passed
    failed: list[tuple[Case, ClauseResult]] = field(default_factory=list)
    withheld: int = 0    # hidden workloads the rubric hides from students: counted apart, never shown
    hidden_ran: int = 0  # of those, the ones the clause was judged on or counts against
    hidden_failed: list[tuple[Case, ClauseResult]] = field(default_factory=list)   # failed or not judged there
    # Not judged because the submission failed there (no report, an unreadable one) or its report hid what
    # the clause needs: never a pass.
    blocked: list[tuple[Case, ClauseResult]] = field(default_factory=list)


class Contract:
    """The contract part of one submission, judged in two phases so that nothing a student sees is judged
    after a hidden workload: ``visible()`` (every other workload, the invalid inputs, and, when the hidden
    workloads score apart, the clause tests themselves, shrinking included), later ``finish()`` (the hidden
    workloads, then the tests).  A hidden workload that hangs or uses up the submission's time can then
    change no visible test.  ``judges``: ``visible`` judges every case but the hidden ones, ``hidden`` those.
    """

    def __init__(self, judges: dict[str, Judge], clauses: tuple[str, ...], plan: Plan, spec: str,
                 out_dir: Path, optional: tuple[str, ...] = ()) -> None:
        """``optional``: the rubric's settings whose workloads may be declined."""
        self.judges, self.clauses, self.plan, self.spec, self.out_dir = judges, clauses, plan, spec, out_dir
        self.optional = optional
        self.declines: dict[str, set[str]] = {}   # the settings of a decline -> the workloads declined for them
        self.tallies = {cid: _Tally() for cid in clauses}
        self.apart = _Tally()  # the hidden workloads, when they score in HIDDEN_TEST alone
        self.hidden_log: list[str] = []
        self.tests: list[TestResult] = []

    def visible(self) -> None:
        self._judge([c for c in self.plan.cases if c.kind != "hidden"])
        for case in self.plan.invalid:
            result = self.judges["visible"].judge_refusal(list(case.trace), case.config)
            _count(self.tallies["invalid_input_refused"], case, result, self.optional)
            self._declined(case, result)
        if self.plan.hidden_outcome:
            self.tests = [self._clause_test(cid) for cid in self.clauses]

    def finish(self) -> list[TestResult]:
        self._judge([c for c in self.plan.cases if c.kind == "hidden"])
        if self.plan.hidden_outcome:
            return self.tests + [_hidden_test(self.judges["hidden"], self.apart, self.spec, self.out_dir,
                                              self.hidden_log)]
        return [self._clause_test(cid) for cid in self.clauses]

    def flags(self) -> list[str]:
        """What the submission declined, for summary.csv: each set of settings and how many workloads."""
        return [f"declined: {setting} ({len(labels)} workload{'s' if len(labels) != 1 else ''})"
                for setting, labels in sorted(self.declines.items())]

    def _declined(self, case: Case, result: ClauseResult) -> None:
        if result.declined:
            self.declines.setdefault(", ".join(result.declined), set()).add(case.label)

    def _clause_test(self, cid: str) -> TestResult:
        return _clause_test(self.judges, cid, self.tallies[cid], self.plan, self.spec, self.out_dir, self.hidden_log)

    def _judge(self, cases: list[Case]) -> None:
        for case in cases:
            judge = self.judges["hidden" if case.kind == "hidden" else "visible"]
            withheld = case.kind == "hidden" and not self.plan.hidden_visible
            for cid in self.clauses:
                if cid == "invalid_input_refused" or (cid == "deterministic" and case.kind == "generated"):
                    continue
                result = judge.judge(cid, list(case.trace), case.config)
                _count(self.apart if withheld and self.plan.hidden_outcome else self.tallies[cid], case, result,
                       self.optional, withheld)
                self._declined(case, result)
            judge.forget()  # a report lives while its workload is judged, not for the rest of the part


def _hidden_test(judge: Judge, tally: _Tally, spec: str, out_dir: Path, hidden_log: list[str]) -> TestResult:
    """``HIDDEN_TEST``: passed when every clause held on every hidden workload.  All a student learns of the
    hidden workloads is this one outcome; which failed, which clause, how and how many go to the
    instructor's hidden-failures.txt."""
    for number, (case, result) in enumerate(tally.hidden_failed):
        explained = result.status == "fail" and number < _EXPLAINED_HIDDEN  # each explanation shrinks a trace
        hidden_log.append(_explain(judge, result.clause, case, result, spec, out_dir, write=False)[0] if explained
                          else f"[{result.clause}] {case.label}: {result.status}: "
                               f"{result.reason or '; '.join(v.message for v in result.violations[:3])}")
    if tally.hidden_failed:
        return TestResult(HIDDEN_TEST, False, "failed: the submission failed the contract on the hidden workloads "
                          "(which, how and how often is withheld; the course staff have the details)", tags=["hidden"])
    return TestResult(HIDDEN_TEST, True, "passed: every clause held on every hidden workload", tags=["hidden"])


def _count(tally: _Tally, case: Case, result: ClauseResult, optional: tuple[str, ...], withheld: bool = False) -> None:
    """Add ``result``; a ``withheld`` case (hidden from students) counts apart, so no visible count depends on it.

    A skip the submission caused is never a pass: it failed ``completes`` or ``schema_valid`` there, or its
    report hid what the clause needs (``blocked``), the workload was never run (``not_run``), or it declined
    the workload as unsupported and the rubric does not make one of its settings optional (``declined``)."""
    tally.kinds[case.kind] += 1
    excused = bool(result.declined) and bool(matching(case.config, optional))
    if withheld:
        tally.withheld += 1
        if result.status == "skip" and (excused or not (result.declined or result.blocked_by or result.unobservable
                                                         or result.not_run)):
            return
        tally.hidden_ran += 1
        if result.status != "pass":
            tally.hidden_failed.append((case, result))
        return
    kept = replace(result, report=None)
    if result.not_run:
        tally.not_run.append((case, kept))
    elif result.declined:
        (tally.optional if excused else tally.declined).append((case, kept))
    elif result.status == "skip" and (result.blocked_by or result.unobservable):
        tally.blocked.append((case, kept))
    elif result.status == "skip":
        tally.skipped.append(result.reason)
    else:
        tally.ran += 1
        if result.status == "fail":  # the report stays only where the failure will be explained (_clause_test)
            tally.failed.append((case, kept if tally.failed else result))


def _clause_test(judges: dict[str, Judge], cid: str, tally: _Tally, plan: Plan, spec: str, out_dir: Path,
                 hidden_log: list[str]) -> TestResult:
    """The clause's test.  What hidden workloads contribute to its student-visible output, when the rubric
    hides them, is only whether any failed it: never which, how many, their skips or their messages."""
    name = f"contract.{cid}"
    tags = ["contract"]
    against = tally.blocked or tally.declined or tally.not_run
    if not tally.ran and not against and not tally.hidden_ran:
        reason = (tally.skipped[0] if tally.skipped else tally.optional[0][1].reason if tally.optional
                  else "no workload applies")
        return TestResult(name, False, "", tags=tags, unjudged=f"skipped on every workload ({reason})")
    for case, result in tally.hidden_failed:
        hidden_log.append(_explain(judges["hidden"], cid, case, result, spec, out_dir, write=False)[0]
                          if result.status == "fail" else f"[{cid}] {case.label}: not judged: {result.reason}")
    kinds = _kinds(tally)
    if not tally.failed and not against and not tally.hidden_failed:
        return TestResult(name, True, f"passed on all {tally.ran} workloads it ran on ({kinds})"
                          + (f"; none of the {tally.withheld} hidden workloads failed it" if tally.withheld else "")
                          + _optional_line(tally), tags=tags)
    lines = [_blocked_line(cid, tally, plan)] if tally.blocked else []
    lines += [_declined_line(cid, tally.declined, plan, "declined as unsupported",
                             "only the rubric's [grading] optional makes a setting optional; support is declared "
                             "as settings, the same for every trace")] if tally.declined else []
    lines += [_declined_line(cid, tally.not_run, plan, "never run", tally.not_run[0][1].violations[0].message
                             if tally.not_run[0][1].violations else tally.not_run[0][1].reason)] \
        if tally.not_run else []
    if tally.failed:
        lines.append(f"failed on {len(tally.failed)} of {tally.ran} workloads it ran on ({kinds}): "
                     + _labels(tally.failed, 0))
    elif tally.ran:
        lines.append(f"passed on the {tally.ran} workloads it ran on ({kinds})")
    else:
        lines.append(f"ran on no workload ({kinds})")
    if tally.hidden_failed:
        lines.append("it also failed on hidden workloads (which and how many is withheld)")
    picture = None
    if tally.failed:
        first_case = tally.failed[0][0]
        text, picture = _explain(judges["hidden" if first_case.kind == "hidden" else "visible"], cid,
                                 *tally.failed[0], spec, out_dir)
        lines.append(text)
    return TestResult(name, False, "\n".join(lines) + _optional_line(tally), tags=tags, picture=picture)


def _declined_line(cid: str, cases: list[tuple[Case, ClauseResult]], plan: Plan, what: str, why: str) -> str:
    """Why workloads the clause never saw, declined or not run, count against it."""
    settings = sorted({s for _, r in cases for s in r.declined})
    shown = [(c, r) for c, r in cases if c.kind != "hidden" or plan.hidden_visible]
    return (f"not passed: {cid} was not judged on {len(cases)} workload(s) {what}"
            + (f" (settings {', '.join(settings)})" if settings else "")
            + f": {_labels(shown, len(cases) - len(shown))}; they count as not passed ({why})")


def _optional_line(tally: _Tally) -> str:
    if not tally.optional:
        return ""
    settings = sorted({s for _, r in tally.optional for s in r.declined})
    return (f"\n{len(tally.optional)} workload(s) declined as unsupported do not count: the rubric makes "
            f"{', '.join(settings)} optional ([grading] optional): {_labels(tally.optional, 0)}")


def _labels(shown: list[tuple[Case, ClauseResult]], withheld: int) -> str:
    """The first workloads' labels, then how many more, and how many hidden ones are withheld."""
    labels = [c.label for c, _ in shown[:_SHOWN_LABELS]]
    more = len(shown) - len(labels)
    return (", ".join(labels) + (f" and {more} more" if more else "")
            + (f"{'; plus ' if labels else ''}{withheld} hidden workload(s), details withheld" if withheld else ""))


def _blocked_line(cid: str, tally: _Tally, plan: Plan) -> str:
    """Why the workloads the clause never saw count against it: the clause the submission failed there."""
    by: dict[str, list[tuple[Case, ClauseResult]]] = {}
    for case, result in tally.blocked:
        by.setdefault(result.blocked_by or "an unobservable report", []).append((case, result))
    parts = []
    for cause, cases in by.items():
        shown = [(c, r) for c, r in cases if c.kind != "hidden" or plan.hidden_visible]
        what = (f"the submission failed {cause} there" if cause in ("completes", "schema_valid")
                else "its report did not show what the clause needs (it declared the events it observes)")
        parts.append(f"{len(cases)} workload(s) because {what}: {_labels(shown, len(cases) - len(shown))}")
    return (f"not passed: {cid} could not be judged on " + "; on ".join(parts)
            + " (a workload the submission failed is not one its clauses passed)")


def _kinds(tally: _Tally) -> str:
    """The workloads the clause was asked on, by kind, and where those it did not run on went: the counts add
    up to the total."""
    order = ("fixed", "generated", "hidden", "invalid")
    total = sum(tally.kinds.values())
    kinds = ", ".join(f"{tally.kinds[k]} {k}" for k in order if tally.kinds[k])
    others = [(len(tally.skipped), "outside the clause's scope"),
              (len(tally.optional), "declined but optional in the rubric"),
              (len(tally.declined), "declined and counted as not passed"),
              (len(tally.blocked), "not judged and counted as not passed"),
              (len(tally.not_run), "not run and counted as not passed"),
              (tally.withheld, "hidden and judged apart")]
    rest = ", ".join(f"{n} {what}" for n, what in others if n)
    return f"of {total} workloads: {kinds}" + (f"; besides those it ran on: {rest}" if rest else "")


def _explain(judge: Judge, cid: str, case: Case, result: ClauseResult, spec: str, out_dir: Path,
             write: bool = True) -> tuple[str, str | None]:
    """The failure's text and, when it is written for the student (``write``) and its workload is not
    hidden, its picture as an HTML fragment (the page itself is written beside the trace)."""
    trace, original = [dict(line) for line in case.trace], len(case.trace)
    if cid != "invalid_input_refused" and not ((out := judge.run(trace, case.config).outcome).broken or out.stopped):
        smaller = shrink_trace(judge, cid, trace, case.config, max_runs=40)
        retry = judge.judge(cid, smaller, case.config) if len(smaller) < len(trace) else None
        if retry is not None and retry.status == "fail":
            trace, result = smaller, retry
    filename = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in f"{cid}-{case.label}.jsonl")
    if write:
        (out_dir / filename).write_text(trace_jsonl(trace), encoding="utf-8")
    judge.forget()  # the runs of the shrinking above
    text = explain_failure(spec=spec, clause=cid, workload=case.label, violations=result.violations, trace=trace,
                           config=case.config, report=result.report, trace_path=filename, shrunk_from=original,
                           stack=result.stack, stopped=result.stopped)
    text += (f"\n  (the trace above is {filename}, saved beside results.json: put it in your folder and "
             f"run the replay command there)" if write else "")
    if not write or case.kind == "hidden":  # a hidden workload is never drawn for the student
        return text, None
    from ..picture import failure_page, schedule_fragment

    replay = replay_command(spec, filename, case.config, cid)
    page = failure_page(spec=spec, clause=cid, workload=case.label, violations=result.violations, trace=trace,
                        report=result.report, replay=replay, text=text)
    (out_dir / filename.replace(".jsonl", ".html")).write_text(page, encoding="utf-8")
    return text, schedule_fragment(result.report, result.violations)
