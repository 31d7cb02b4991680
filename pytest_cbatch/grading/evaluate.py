"""Grading one submission: every clause judged in this (trusted) process on the sandboxed submission's runs.

``grade_submission(submission, rubric, plan, out_dir)`` returns a
``SubmissionResult`` with one test per contract clause (it passes when it
passes on every workload it ran on and every workload was one it ran on, but
those outside the clause's scope and those it declined as unsupported that the
rubric's ``[grading] optional`` names a setting of: a workload where the
submission failed ``completes`` or ``schema_valid``, whose report hid what the
clause needs, that was never run, or that it declined otherwise counts as not
passed; summary.csv's flags name every setting it declined), one per lifecycle clause and one per
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import untrusted
from ..impls import BrokenOutput, Implementation, ImplementationError
from ..runner import OPT_IN_CLAUSES, Judge, judged_clauses
from ..sandbox import IsolatedImplementation, KitGuard, LoadSpec
from ..sandbox.limits import Deadline
from .contract_part import Contract
from .plan import HIDDEN_TEST, Plan
from .results import SubmissionResult, TestResult
from .rubric import Rubric

__all__ = ["Submission", "apply_rubric", "contract_clauses", "grade_implementation", "grade_submission", "rubric_tests",
           "unjudged"]

_NOTES_LIMIT = 4000


@dataclass(frozen=True)
class Submission:
    """A submission: its name (file stem or folder name), where it lives and what the sandbox imports."""

    name: str
    path: str
    load: LoadSpec
    problem: str | None = None   # why it cannot be graded at all (a broken manifest), or None
    refused: str | None = None   # why it is graded 0 without running (e.g. it is a symbolic link)


def grade_submission(submission: Submission, rubric: Rubric, plan: Plan, out_dir: Path,
                     sandbox: str = "auto") -> SubmissionResult:
    """Grade ``submission``; writes failing traces (and hidden-failures.txt) under ``out_dir``.

    ``sandbox`` is the sandbox mode (``auto``, ``bwrap`` or ``process``).  The
    result holds exactly ``rubric_tests(rubric)``, whatever the submission did.
    """
    start = time.monotonic()
    notes = [f"submission {submission.name}: graded by pytest-cbatch in an isolated child process "
             f"({rubric.limits.describe()})", plan.generation]
    if submission.refused is not None:
        return _refuse(submission.name, rubric, plan, notes, start, submission.refused, [submission.refused])
    problem = submission.problem or _program_problem(submission, rubric)
    if problem:
        tests = unjudged(rubric, f"the submission could not be graded: {problem}", plan)
        return _finish(submission.name, rubric, tests, notes + [f"could not grade the submission: {problem}"], start,
                       plan=plan)
    guard = KitGuard(refuse=rubric.kit_imports == "refuse")
    deadline = Deadline(rubric.limits.submission_seconds)  # every child of it, and the grader's work, together
    try:
        impl = _isolated(submission, rubric, sandbox, guard, deadline)
    except ImplementationError as exc:
        if guard.found:
            return _kit_used(submission.name, rubric, plan, notes, start, guard, [])
        message = str(exc).split(": ", 1)[-1]
        tests = unjudged(rubric, f"the submission could not be loaded:\n{message}", plan)
        return _finish(submission.name, rubric, tests, notes + [f"could not load the submission: {message}"], start,
                       plan=plan)
    flags = [f"left out of the copy: {', '.join(impl.sandbox.left_out)}"] if impl.sandbox.left_out else []
    if guard.found and guard.refuse:  # a use at import time that the submission caught: no need to run it
        impl.close()
        return _kit_used(submission.name, rubric, plan, notes, start, guard, flags)
    notes[0] += (", contained by bubblewrap" if impl.sandbox.mode == "bwrap"
                 else ", NOT contained (no bubblewrap on the grading machine)")
    notes += flags
    hidden: Implementation | None = None
    try:
        if "scheduler" in rubric.parts and plan.counts()["hidden"] and not plan.hidden_visible:
            hidden = _hidden_child(submission, rubric, sandbox, guard, deadline)
        result = grade_implementation(impl, submission.name, rubric, plan, out_dir, notes, start, hidden=hidden)
    finally:
        impl.close()
        if hidden is not None:
            hidden.close()
    if guard.found and guard.refuse:
        return _kit_used(submission.name, rubric, plan, notes, start, guard, flags)
    flags += [f"uses the kit's code (allowed by the rubric): {use}" for use in guard.uses()]
    if flags:
        result.extra["flags"] = flags + result.extra.get("flags", [])
    return result


def _isolated(submission: Submission, rubric: Rubric, sandbox: str, guard: KitGuard, deadline: Deadline,
              role: str = "") -> IsolatedImplementation:
    return IsolatedImplementation(submission.name, submission.load, rubric.limits,
                                  label=f"submission {submission.name!r}{role}", mode=sandbox,
                                  runtimes=rubric.runtimes, guard=guard, deadline=deadline)


def _kit_used(name: str, rubric: Rubric, plan: Plan, notes: list[str], start: float, guard: KitGuard,
              flags: list[str]) -> SubmissionResult:
    """Every test 0: the submission used the kit's code, which the rubric refuses (``kit_imports``)."""
    uses = guard.uses()
    reason = (f"it uses the kit's own code, and the kit is what judges it (the reference is not a submission): "
              f"{'; '.join(uses)}. Remove that use and submit again; a course that allows it sets [grading] "
              f"kit_imports = \"allow\" in the rubric")
    return _refuse(name, rubric, plan, notes, start, reason, flags + [f"uses the kit's code: {use}" for use in uses])


class _Unavailable(Implementation):
    """Stands for a child that could not start: every run is broken, saying why."""

    def __init__(self, spec: str, why: str) -> None:
        self.spec, self.source, self.namespace, self.why = spec, "not started", None, why
        self.fn = None

    def _call(self, trace: list[dict[str, Any]], config: dict[str, Any]) -> dict[str, Any]:
        raise BrokenOutput(self.why)

    def close(self) -> None:
        pass


def _hidden_child(submission: Submission, rubric: Rubric, sandbox: str, guard: KitGuard,
                  deadline: Deadline) -> Implementation:
    """The submission once more, in a child of its own that runs only the hidden workloads.

    That child never answers a visible test, so nothing it saw (a hidden trace
    it remembers, prints or raises) can reach a student-visible output through
    a later visible call; its messages go only to hidden-failures.txt.
    """
    try:
        return _isolated(submission, rubric, sandbox, guard, deadline, " (hidden workloads)")
    except ImplementationError as exc:
        return _Unavailable(submission.name, f"the child for the hidden workloads could not start: {exc}")


def _refuse(name: str, rubric: Rubric, plan: Plan, notes: list[str], start: float, reason: str,
            flags: list[str]) -> SubmissionResult:
    """Every test 0, saying why the submission is refused (a link, an import of the kit)."""
    tests = unjudged(rubric, f"the submission is refused: {reason}", plan)
    return _finish(name, rubric, tests, notes + [f"refused: {reason}"], start, flags=flags, plan=plan)


def _program_problem(submission: Submission, rubric: Rubric) -> str | None:
    """Why a program submission's command cannot run in the sandbox (see ``manifest``), or None."""
    from .manifest import command_problem

    command = submission.load.command
    return command_problem(command, submission.path, rubric.runtimes) if command else None


def grade_implementation(impl: Implementation, name: str, rubric: Rubric, plan: Plan, out_dir: Path,
                         notes: list[str] | None = None, start: float | None = None,
                         hidden: Implementation | None = None) -> SubmissionResult:
    """Grade an already loaded implementation (the sandboxed one of ``grade_submission``, or any other).

    ``hidden``: what runs the hidden workloads (default ``impl`` itself); ``grade_submission`` gives a child
    of their own when they are hidden from students.  Only ``grade_submission`` keeps the grader safe from
    the code it grades; this is the judging it shares with, e.g., an in-process baseline.
    """
    start = time.monotonic() if start is None else start
    notes = [f"{name}: graded by pytest-cbatch", plan.generation] if notes is None else notes
    source = getattr(impl, "sources", {}).get("simulate", name)
    replay_spec = source if ":" in source else f"{source}:simulate"  # the student runs it from their folder
    tests: list[TestResult] = []
    contract: Contract | None = None
    declines: list[str] = []
    if "scheduler" in rubric.parts and impl.fn is None:
        absent = "this submission has no simulate (the published layout defines it in scheduler_sim.py)"
        tests += [TestResult(f"contract.{c}", False, "", tags=["contract"], unjudged=absent)
                  for c in contract_clauses(rubric)]
        if plan.hidden_outcome:
            tests.append(TestResult(HIDDEN_TEST, False, "", tags=["hidden"], unjudged=absent))
    elif "scheduler" in rubric.parts:
        judges = {"visible": Judge(impl), "hidden": Judge(impl if hidden is None else hidden)}
        contract = Contract(judges, contract_clauses(rubric), plan, replay_spec, out_dir, rubric.optional)
        contract.visible()
    others: list[TestResult] = []
    if "lifecycle" in rubric.parts:
        others += _lifecycle_tests(impl, rubric, notes)
    if "numerics" in rubric.parts:
        others += _numeric_tests(impl, rubric, notes)
    if contract is not None:  # the hidden workloads last of all (see Contract)
        tests += contract.finish()
        declines = contract.flags()
        if contract.hidden_log:  # the instructor's: it quotes the submission's own messages, made safe to write
            (out_dir / "hidden-failures.txt").write_text(
                untrusted.text("\n\n".join(contract.hidden_log), None) + "\n", encoding="utf-8")
    return _finish(name, rubric, tests + others, notes, start, flags=declines, plan=plan)


def _finish(name: str, rubric: Rubric, tests: list[TestResult], notes: list[str], start: float,
            flags: list[str] | None = None, plan: Plan | None = None) -> SubmissionResult:
    """The result of ``tests``; ``flags`` (what the instructor should look at) go to summary.csv's column."""
    expected = rubric_tests(rubric, plan)
    assert [t.name for t in tests] == expected, "every submission of a run is graded on the same tests"
    apply_rubric(tests, rubric)
    extra: dict[str, Any] = {"seed": rubric.seed, "rubric": Path(rubric.source).name}
    if flags:
        extra["flags"] = list(flags)
    result = SubmissionResult(name, tests, "", time.monotonic() - start, extra=extra)
    failed = [t.name for t in tests if not t.passed and t.max_score]
    verdict = (f"; failed: {', '.join(failed)}" if failed else "; every test passed" if result.max_score else
               "; no test here is worth any points (see the rubric's [tests] table)")
    notes.append(f"score {result.score:g} / {result.max_score:g}{verdict}")
    result.output = "\n".join(notes)
    return result


def rubric_tests(rubric: Rubric, plan: Plan | None = None) -> list[str]:
    """The tests of every submission graded under ``rubric`` (and ``plan``'s workloads) on this machine, in order.

    ``[grading].parts`` selects the parts; numeric checks count where the
    rubric asks for them and torch is installed (the same for every submission);
    ``HIDDEN_TEST`` where the plan's hidden workloads score apart (``[hidden] reveal = "outcome"``).
    """
    from ..lifecycle import LIFECYCLE_CLAUSES

    names: list[str] = []
    if "scheduler" in rubric.parts:
        names += [f"contract.{c}" for c in contract_clauses(rubric)]
        if plan is not None and plan.hidden_outcome:
            names.append(HIDDEN_TEST)
    if "lifecycle" in rubric.parts:
        names += list(LIFECYCLE_CLAUSES)
    if "numerics" in rubric.parts:
        names += _numeric_names(rubric)
    return names


def contract_clauses(rubric: Rubric) -> tuple[str, ...]:
    """The contract clauses graded under ``rubric``: course_results too when it says ``course = true``."""
    return judged_clauses(OPT_IN_CLAUSES if rubric.course else ())


def apply_rubric(tests: list[TestResult], rubric: Rubric) -> None:
    """Give each test its points and visibility; a test not judged says why and what it cost."""
    for test in tests:
        rule = rubric.rule_for(test.name)
        test.max_score, test.visibility = rule.points, rule.visibility
        if test.unjudged is not None:
            test.output = f"not judged: {test.unjudged}\n(0 of {rule.points:g} points)"


def unjudged(rubric: Rubric, reason: str, plan: Plan | None = None) -> list[TestResult]:
    """Every test of ``rubric`` (and ``plan``), not judged for ``reason`` (a submission that could not be
    graded at all)."""
    return [TestResult(name, False, "", tags=[name.split(".")[0]], unjudged=reason)
            for name in rubric_tests(rubric, plan)]


# ----------------------------------------------------------------- lifecycle


def _lifecycle_tests(impl: Implementation, rubric: Rubric, notes: list[str]) -> list[TestResult]:
    from ..lifecycle import LIFECYCLE_CLAUSES, PART_CLAUSES, PARTS, missing_parts

    namespace = impl.namespace
    merged: dict[str, tuple[str, str, tuple[tuple[str, Any], ...]]] = {}
    missing = missing_parts(namespace)
    for part in PARTS:
        if part in missing:
            notes.append(f"lifecycle {part}: not graded: {missing[part]}")
            continue
        for cid, (status, message, steps) in _part_verdicts(part, impl, rubric.lifecycle_examples, notes).items():
            old = merged.get(cid)
            if old is None or _RANK[status] > _RANK[old[0]]:
                merged[cid] = (status, f"[{part}] {message}".rstrip(), steps)
    tests = []
    program = getattr(impl, "sources", {}).get("simulate", "")   # "exec:COMMAND" for a program submission
    for cid in LIFECYCLE_CLAUSES:
        if cid not in merged:  # every part that judges it is absent from this submission
            parts = [p for p in PARTS if cid in PART_CLAUSES[p]]
            absent = _program_lacks(program) if program.startswith("exec:") else _absent(parts, namespace)
            tests.append(TestResult(cid, False, "", tags=["lifecycle"], unjudged=absent))
            continue
        status, message, steps = merged[cid]
        if status == "skip":
            reason = message.replace("not judged: ", "", 1)
            tests.append(TestResult(cid, False, "", tags=["lifecycle"], unjudged=reason))
            continue
        text = {"pass": "passed", "fail": "failed", "error": "not judged (the run broke down)"}[status]
        tests.append(TestResult(cid, status == "pass", f"{text}: {message}" if message else text, tags=["lifecycle"],
                                picture=_lifecycle_picture(cid, message, steps) if status == "fail" else None))
    return tests


def _lifecycle_picture(cid: str, message: str, steps: tuple[tuple[str, Any], ...]) -> str:
    """A failing lifecycle clause's steps, the failing one marked, the pool after each (an HTML fragment; the
    test's text follows it on Gradescope)."""
    from ..picture.lifecycle import lifecycle_section

    return lifecycle_section(cid, message.partition("] ")[2] if message.startswith("[") else message, steps,
                             with_text=False)


# A clause several parts judge is as bad as its worst part: a part that ran but never reached it (an earlier
# clause failed on every run) outranks a part where it passed, as a failed workload outranks a passed one.
_RANK = {"pass": 0, "skip": 1, "fail": 2, "error": 3}
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


def _program_lacks(program: str) -> str:
    return (f"this submission is a program ({program[len('exec:'):]!r}, from its cbatch.toml), which answers "
            f"simulate over stdin and stdout only: the lifecycle classes (PagedKV, RecomputeRequest, "
            f"TransferManager) are Python objects it cannot expose. A course that accepts other languages leaves "
            f"the lifecycle part out of the rubric: [grading] parts = [\"scheduler\"] (or gives lifecycle.* 0 "
            f"points)")


def _part_verdicts(part: str, impl: Implementation, examples: int,
                   notes: list[str]) -> dict[str, tuple[str, str, tuple[tuple[str, Any], ...]]]:
    """{clause: (status, message, steps)} for one lifecycle part: ``lifecycle_verdicts`` under the grading
    settings (``steps``: a failing clause's replay with the pool after each line, for its picture).

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
    return {cid: (verdict.status, verdict.message[:_NOTES_LIMIT], verdict.steps) for cid, verdict in verdicts.items()}


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
