"""Grading one submission: every clause judged in this (trusted) process on the sandboxed submission's runs.

``grade_submission(submission, rubric, plan, out_dir)`` returns a
``SubmissionResult`` with one test per contract clause (it passes when it
passes on every workload it ran on), one per lifecycle clause and one per
numeric check and dtype, as far as the rubric's ``parts`` include them: the
same tests (``rubric_tests``) for every submission, so every total is the same;
a test the submission cannot answer scores 0 and says why.  A failed test's output holds the explanation, the
minimal trace and a replay command that works from the student's folder; the
failing trace is written next to results.json.  Hidden workloads count like
the others, but when the rubric marks them hidden, student-visible output
names only how many failed; their details go to ``hidden-failures.txt``
beside results.json, for the instructor.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ..explain import explain_failure, trace_jsonl
from ..impls import Implementation, ImplementationError
from ..runner import ALL_CLAUSES, ClauseResult, Judge, shrink_trace
from ..sandbox import IsolatedImplementation, LoadSpec
from .plan import Case, Plan
from .results import SubmissionResult, TestResult
from .rubric import Rubric

__all__ = ["Submission", "apply_rubric", "grade_implementation", "grade_submission", "rubric_tests", "unjudged"]

_SHOWN_LABELS = 8
_NOTES_LIMIT = 4000


@dataclass(frozen=True)
class Submission:
    """A submission: its name (file stem or folder name), where it lives and what the sandbox imports."""

    name: str
    path: str
    load: LoadSpec


@dataclass
class _Tally:
    ran: int = 0
    skipped: list[str] = field(default_factory=list)
    failed: list[tuple[Case, ClauseResult]] = field(default_factory=list)


def grade_submission(submission: Submission, rubric: Rubric, plan: Plan, out_dir: Path,
                     sandbox: str = "auto") -> SubmissionResult:
    """Grade ``submission``; writes failing traces (and hidden-failures.txt) under ``out_dir``.

    ``sandbox`` is the sandbox mode (``auto``, ``bwrap`` or ``process``).  The
    result holds exactly ``rubric_tests(rubric)``, whatever the submission did.
    """
    start = time.monotonic()
    notes = [f"submission {submission.name}: graded by pytest-cbatch in an isolated child process "
             f"({rubric.limits.describe()})", plan.generation]
    try:
        impl = IsolatedImplementation(submission.name, submission.load, rubric.limits,
                                      label=f"submission {submission.name!r}", mode=sandbox)
    except ImplementationError as exc:
        message = str(exc).split(": ", 1)[-1]
        tests = unjudged(rubric, f"the submission could not be loaded:\n{message}")
        return _finish(submission.name, rubric, tests, notes + [f"could not load the submission: {message}"], start)
    notes[0] += (", contained by bubblewrap" if impl.sandbox.mode == "bwrap"
                 else ", NOT contained (no bubblewrap on the grading machine)")
    try:
        return grade_implementation(impl, submission.name, rubric, plan, out_dir, notes, start)
    finally:
        impl.close()


def grade_implementation(impl: Implementation, name: str, rubric: Rubric, plan: Plan, out_dir: Path,
                         notes: list[str] | None = None, start: float | None = None) -> SubmissionResult:
    """Grade an already loaded implementation (the sandboxed one of ``grade_submission``, or any other).

    Only ``grade_submission`` keeps the grader safe from the code it grades;
    this is the judging it shares with, e.g., an in-process baseline.
    """
    start = time.monotonic() if start is None else start
    notes = [f"{name}: graded by pytest-cbatch", plan.generation] if notes is None else notes
    source = getattr(impl, "sources", {}).get("simulate", name)
    replay_spec = source if ":" in source else f"{source}:simulate"  # the student runs it from their folder
    hidden_log: list[str] = []
    tests: list[TestResult] = []
    if "scheduler" in rubric.parts and impl.fn is None:
        absent = "this submission has no simulate (the published layout defines it in scheduler_sim.py)"
        tests += [TestResult(f"contract.{c}", False, "", tags=["contract"], unjudged=absent) for c in ALL_CLAUSES]
    elif "scheduler" in rubric.parts:
        tests += _contract_tests(Judge(impl), plan, replay_spec, out_dir, hidden_log)
    if "lifecycle" in rubric.parts:
        tests += _lifecycle_tests(impl, rubric, notes)
    if "numerics" in rubric.parts:
        tests += _numeric_tests(impl, rubric, notes)
    if hidden_log:
        (out_dir / "hidden-failures.txt").write_text("\n\n".join(hidden_log) + "\n", encoding="utf-8")
    return _finish(name, rubric, tests, notes, start)


def _finish(name: str, rubric: Rubric, tests: list[TestResult], notes: list[str], start: float) -> SubmissionResult:
    expected = rubric_tests(rubric)
    assert [t.name for t in tests] == expected, "every submission of a run is graded on the same tests"
    apply_rubric(tests, rubric)
    result = SubmissionResult(name, tests, "", time.monotonic() - start,
                              extra={"seed": rubric.seed, "rubric": Path(rubric.source).name})
    failed = [t.name for t in tests if not t.passed and t.max_score]
    notes.append(f"score {result.score:g} / {result.max_score:g}"
                 + (f"; failed: {', '.join(failed)}" if failed else "; every test passed"))
    result.output = "\n".join(notes)
    return result


def rubric_tests(rubric: Rubric) -> list[str]:
    """The tests of every submission graded under ``rubric`` on this machine, in order.

    ``[grading].parts`` selects the parts; numeric checks count where the
    rubric asks for them and torch is installed (the same for every submission).
    """
    from ..lifecycle import LIFECYCLE_CLAUSES

    names: list[str] = []
    if "scheduler" in rubric.parts:
        names += [f"contract.{c}" for c in ALL_CLAUSES]
    if "lifecycle" in rubric.parts:
        names += list(LIFECYCLE_CLAUSES)
    if "numerics" in rubric.parts:
        names += _numeric_names(rubric)
    return names


def apply_rubric(tests: list[TestResult], rubric: Rubric) -> None:
    """Give each test its points and visibility; a test not judged says why and what it cost."""
    for test in tests:
        rule = rubric.rule_for(test.name)
        test.max_score, test.visibility = rule.points, rule.visibility
        if test.unjudged is not None:
            test.output = f"not judged: {test.unjudged}\n(0 of {rule.points:g} points)"


def unjudged(rubric: Rubric, reason: str) -> list[TestResult]:
    """Every test of ``rubric``, not judged for ``reason`` (a submission that could not be graded at all)."""
    return [TestResult(name, False, "", tags=[name.split(".")[0]], unjudged=reason) for name in rubric_tests(rubric)]


# ------------------------------------------------------------------ contract


def _contract_tests(judge: Judge, plan: Plan, spec: str, out_dir: Path, hidden_log: list[str]) -> list[TestResult]:
    tallies = {cid: _Tally() for cid in ALL_CLAUSES}
    for case in plan.cases:
        for cid in ALL_CLAUSES:
            if cid == "invalid_input_refused" or (cid == "deterministic" and case.kind == "generated"):
                continue
            _count(tallies[cid], case, judge.judge(cid, list(case.trace), case.config))
        judge.forget()  # a report lives while its workload is judged, not for the rest of the part
    for case in plan.invalid:
        _count(tallies["invalid_input_refused"], case, judge.judge_refusal(list(case.trace), case.config))
    return [_clause_test(judge, cid, tallies[cid], plan, spec, out_dir, hidden_log) for cid in ALL_CLAUSES]


def _count(tally: _Tally, case: Case, result: ClauseResult) -> None:
    if result.status == "skip":
        tally.skipped.append(result.reason)
        return
    tally.ran += 1
    if result.status == "fail":  # the report stays only where a failure will be explained (see _clause_test)
        explained = case.kind == "hidden" or all(c.kind == "hidden" for c, _ in tally.failed)
        tally.failed.append((case, result if explained else replace(result, report=None)))


def _clause_test(judge: Judge, cid: str, tally: _Tally, plan: Plan, spec: str, out_dir: Path,
                 hidden_log: list[str]) -> TestResult:
    name = f"contract.{cid}"
    tags = ["contract"]
    if not tally.ran:
        reason = tally.skipped[0] if tally.skipped else "no workload applies"
        return TestResult(name, False, "", tags=tags, unjudged=f"skipped on every workload ({reason})")
    kinds = f"of {len(plan.invalid)} invalid inputs" if cid == "invalid_input_refused" else _kinds(tally, plan)
    if not tally.failed:
        return TestResult(name, True, f"passed on all {tally.ran} workloads it ran on ({kinds})", tags=tags)
    shown = [(c, r) for c, r in tally.failed if c.kind != "hidden" or plan.hidden_visible]
    withheld = len(tally.failed) - len(shown)
    labels = [c.label for c, _ in shown[:_SHOWN_LABELS]]
    more = len(shown) - len(labels)
    lines = [f"failed on {len(tally.failed)} of {tally.ran} workloads it ran on ({kinds}): "
             + ", ".join(labels) + (f" and {more} more" if more else "")
             + (f"{'; plus ' if labels else ''}{withheld} hidden workload(s), details withheld" if withheld else "")]
    if shown:
        lines.append(_explain(judge, cid, *shown[0], spec, out_dir))
    for case, result in tally.failed:
        if case.kind == "hidden" and not plan.hidden_visible:
            hidden_log.append(_explain(judge, cid, case, result, spec, out_dir, write=False))
    return TestResult(name, False, "\n".join(lines), tags=tags)


def _kinds(tally: _Tally, plan: Plan) -> str:
    counts = plan.counts()
    parts = [f"{counts['fixed']} fixed", f"{counts['generated']} generated"]
    if counts["hidden"]:
        parts.append(f"{counts['hidden']} hidden")
    if tally.skipped:
        parts.append(f"{len(tally.skipped)} skipped")
    return "of " + ", ".join(parts)


def _explain(judge: Judge, cid: str, case: Case, result: ClauseResult, spec: str, out_dir: Path,
             write: bool = True) -> str:
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
                           config=case.config, report=result.report, trace_path=filename, shrunk_from=original)
    return text + (f"\n  (the trace above is {filename}, saved beside results.json: put it in your folder and "
                   f"run the replay command there)" if write else "")


# ----------------------------------------------------------------- lifecycle


def _lifecycle_tests(impl: Implementation, rubric: Rubric, notes: list[str]) -> list[TestResult]:
    from ..lifecycle import LIFECYCLE_CLAUSES, PART_CLAUSES, PARTS, missing_parts

    namespace = impl.namespace
    merged: dict[str, tuple[str, str]] = {}
    missing = missing_parts(namespace)
    for part in PARTS:
        if part in missing:
            notes.append(f"lifecycle {part}: not graded: {missing[part]}")
            continue
        for cid, (status, message) in _part_verdicts(part, impl, rubric.lifecycle_examples, notes).items():
            old = merged.get(cid)
            if old is None or _RANK[status] > _RANK[old[0]]:
                merged[cid] = (status, f"[{part}] {message}".rstrip())
    tests = []
    for cid in LIFECYCLE_CLAUSES:
        if cid not in merged:  # every part that judges it is absent from this submission
            parts = [p for p in PARTS if cid in PART_CLAUSES[p]]
            tests.append(TestResult(cid, False, "", tags=["lifecycle"], unjudged=_absent(parts, namespace)))
            continue
        status, message = merged[cid]
        if status == "skip":
            reason = message.replace("not judged: ", "", 1)
            tests.append(TestResult(cid, False, "", tags=["lifecycle"], unjudged=reason))
            continue
        text = {"pass": "passed", "fail": "failed", "error": "not judged (the run broke down)"}[status]
        tests.append(TestResult(cid, status == "pass", f"{text}: {message}" if message else text, tags=["lifecycle"]))
    return tests


_RANK = {"skip": 0, "pass": 1, "fail": 2, "error": 3}
_HOME_FILE = {"PagedKV": "scheduler_sim.py", "RecomputeRequest": "scheduler_faults.py",
              "TransferManager": "scheduler_faults.py"}


def _absent(parts: list[str], namespace: Any) -> str:
    """Which classes the submission lacks for ``parts``, and the file of the published layout that holds them."""
    from ..lifecycle import PARTS

    wanted = dict.fromkeys(n for p in parts for n in ("PagedKV", PARTS[p]))
    absent = [n for n in wanted if not callable(getattr(namespace, n, None))]
    where = "; ".join(f"{n} (the published layout defines it in {_HOME_FILE[n]})" for n in absent)
    return (f"this submission has no {where}, which the lifecycle "
            f"part{'s' if len(parts) > 1 else ''} {', '.join(parts)} need"
            f"{'' if len(parts) > 1 else 's'}. A course whose assignment has no lifecycle part leaves it out "
            f"of the rubric: [grading] parts = [\"scheduler\"] (or gives lifecycle.* 0 points)")


def _part_verdicts(part: str, impl: Implementation, examples: int, notes: list[str]) -> dict[str, tuple[str, str]]:
    """{clause: (status, message)} for one lifecycle part: ``lifecycle_verdicts`` under the grading settings.

    A sandboxed submission's child runs each search ahead (``sandbox.search``), streaming its requests
    and answers while the grader judges the same search; should the child's record ever differ, the
    part is judged again over the live channel, one request at a time, and the notes say so.
    """
    from hypothesis import HealthCheck
    from hypothesis import settings as Settings

    from ..sandbox import lifecycle_verdicts_of

    settings = Settings(max_examples=max(examples, 1), derandomize=True, database=None, deadline=None,
                        print_blob=False, suppress_health_check=list(HealthCheck))
    verdicts, note = lifecycle_verdicts_of(impl, part, settings)
    if note:
        notes.append(note)
    return {cid: (verdict.status, verdict.message[:_NOTES_LIMIT]) for cid, verdict in verdicts.items()}


# ------------------------------------------------------------------ numerics


def _numeric_names(rubric: Rubric) -> list[str]:
    if rubric.numerics == "off":
        return []
    try:
        from ..gpu_checks.checks import SCHEDULE_CHECKS
    except ImportError:  # no torch: left out for every submission alike
        return []
    return [f"numerics.{check}.{dtype}" for dtype in rubric.numerics_dtypes for check in SCHEDULE_CHECKS]


def _numeric_tests(impl: Implementation, rubric: Rubric, notes: list[str]) -> list[TestResult]:
    names = _numeric_names(rubric)
    if not names:
        notes.append("numeric checks: off in the rubric" if rubric.numerics == "off"
                     else "numeric checks: skipped, torch is not installed")
        return []
    from ..gpu_checks.checks import SCHEDULE_CHECKS, run_schedule_checks
    from ..gpu_checks.schedules import SUITE_WORKLOADS
    from ..reference.scheduler_sim import demo_trace
    from ..workloads import BASE_CONFIG

    workloads = {"demo": (demo_trace(), dict(BASE_CONFIG)),
                 **{name: (list(w.trace), w.config) for name, w in SUITE_WORKLOADS.items()}}
    found: dict[str, list[str]] = {name: [] for name in names}
    passed: dict[str, bool] = dict.fromkeys(names, True)
    for dtype in rubric.numerics_dtypes:
        keys = [f"numerics.{check}.{dtype}" for check in SCHEDULE_CHECKS]
        for wname in rubric.numerics_workloads:
            trace, config = workloads[wname]
            outcome = impl.run(trace, config)
            failure = None
            if outcome.report is None:
                failure = f"{wname}: no report ({outcome.unsupported or outcome.refused or outcome.stopped or outcome.broken})"
            else:
                try:
                    results = run_schedule_checks(trace, outcome.report, dtype=dtype, device="cpu", preset="tiny",
                                                  block_size=config["block_size"], workload=wname)
                except Exception as exc:  # the report cannot be executed (ScheduleError and kin): the checks fail
                    failure = f"{wname}: the report cannot be executed: {type(exc).__name__}: {exc}"
                else:
                    for r in results:
                        key = f"numerics.{r.name}.{dtype}"
                        passed[key] = passed[key] and r.passed
                        found[key].append(r.summary())
            if failure is not None:
                for key in keys:
                    passed[key] = False
                    found[key].append(failure)
    notes.append(f"numeric checks: {', '.join(rubric.numerics_dtypes)} on {', '.join(rubric.numerics_workloads)} "
                 f"(tiny preset, CPU)")
    return [TestResult(key, passed[key], "\n".join(found[key]), tags=["numerics"]) for key in names]
