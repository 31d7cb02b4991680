"""``cbatch grade``: grade a folder of submissions (or one, on Gradescope) in parallel worker processes.

    cbatch grade SUBMISSIONS_DIR --out OUT [--rubric rubric.toml] [--traces DIR] [--jobs N] [--sandbox MODE]
    cbatch grade --gradescope [--rubric rubric.toml] [--traces DIR] [--sandbox MODE]

A submission is each ``.py`` file of SUBMISSIONS_DIR, or each folder holding
``scheduler_sim.py`` and/or ``scheduler_faults.py`` or any ``.py`` file; its
name is the file stem or folder name.  Each gets ``OUT/<name>/results.json``
(Gradescope format, validated against schemas/gradescope-results.schema.json
before it is written) and a row of ``OUT/summary.csv``.  ``OUT/<name>/`` is
emptied first, so nothing of an earlier run survives.  A submission that
breaks the grader itself still gets a results.json saying so, and the run
goes on, every submission scored on the same tests.  The sandbox mode
(``--sandbox``, else the rubric's ``[grading].sandbox``) is resolved once,
before any submission runs: ``auto`` without a working bubblewrap prints
what is not contained.  Exit status: 0 when every submission was graded, 1
when the grader failed on one, 2 on bad input (rubric, traces, folders, a
required bubblewrap that cannot run).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
import traceback
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Sequence

from ..sandbox import SANDBOX_MODES, LoadSpec, resolve_mode, submission_files
from ..sandbox.files import link_refusal
from .evaluate import Submission, apply_rubric, grade_submission, unjudged
from .plan import Plan, build_plan
from .results import SubmissionResult, TestResult, write_json, write_summary
from .rubric import Rubric, load_rubric

__all__ = ["discover", "grade_all", "main"]

GRADESCOPE_ROOT = "/autograder"


def discover(folder: Path) -> list[Submission]:
    """The submissions in ``folder``, sorted by name; ValueError when two share a name.

    A submission that is a symbolic link (a ``.py`` file or a folder), or a
    folder whose only modules are links, is listed refused (``Submission.refused``):
    it is graded 0, saying why, and nothing is read through the link.
    """
    found: dict[str, Submission] = {}
    for entry in sorted(folder.iterdir()):
        if entry.name.startswith((".", "_")):
            continue
        if entry.is_symlink():
            if entry.suffix not in (".py", ""):
                continue
            sub = Submission(entry.stem, str(entry), LoadSpec(str(entry)), refused=link_refusal(entry.name))
        elif entry.is_file() and entry.suffix == ".py":
            sub = Submission(entry.stem, str(entry), _single_file(entry))
        elif entry.is_dir() and submission_files(str(entry)):
            sub = Submission(entry.name, str(entry), LoadSpec(str(entry), submission_files(str(entry))))
        elif entry.is_dir() and _linked_modules(entry):
            sub = Submission(entry.name, str(entry), LoadSpec(str(entry)),
                             refused=link_refusal(", ".join(_linked_modules(entry))))
        else:
            continue
        if sub.name in found:
            raise ValueError(f"two submissions are named {sub.name!r}: {found[sub.name].path} and {sub.path}")
        found[sub.name] = sub
    return list(found.values())


def _linked_modules(folder: Path) -> list[str]:
    """The ``.py`` entries of ``folder`` that are symbolic links (a folder of nothing else is refused)."""
    return sorted(p.name for p in folder.iterdir() if p.suffix == ".py" and p.is_symlink())


def _single_file(path: Path) -> LoadSpec:
    """A one-file submission is copied alone, so it cannot read the other students' files beside it."""
    return LoadSpec(str(path), (path.name,))


def gradescope_submission(root: Path) -> Submission:
    """The single submission Gradescope unpacks in ``root/submission`` (refused when it is a link)."""
    folder = root / "submission"
    if folder.is_symlink():
        return Submission("submission", str(folder), LoadSpec(str(folder)), refused=link_refusal(folder.name))
    files = submission_files(str(folder)) if folder.is_dir() else ()
    if not files and folder.is_dir() and _linked_modules(folder):
        return Submission("submission", str(folder), LoadSpec(str(folder)),
                          refused=link_refusal(", ".join(_linked_modules(folder))))
    if not files:
        raise ValueError(f"{folder}: no .py file to grade")
    return Submission("submission", str(folder), LoadSpec(str(folder), files))


def _grade_one(submission: Submission, rubric: Rubric, plan: Plan, out_dir: Path, sandbox: str) -> SubmissionResult:
    """Worker entry: grade one submission, turning a grader crash into a results.json that says so."""
    if out_dir.exists():
        shutil.rmtree(out_dir)
    out_dir.mkdir(parents=True)
    start = time.monotonic()
    try:
        result = grade_submission(submission, rubric, plan, out_dir, sandbox)
    except Exception as exc:  # a grader bug must not cost the other submissions their results
        detail = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)[-4:])
        result = _grader_failure(submission.name, rubric, f"{type(exc).__name__}: {exc}", time.monotonic() - start)
        result.output += "\n" + detail
    document = result.gradescope()
    issues = _schema_issues(document)
    if issues:
        raise RuntimeError(f"{submission.name}: results.json would not validate: {issues[0]}")
    write_json(out_dir / "results.json", document)
    return result


def _grader_failure(name: str, rubric: Rubric, what: str, seconds: float) -> SubmissionResult:
    """Every test of the run at 0, saying the grader (not the submission) failed."""
    tests = unjudged(rubric, f"the grader failed on this submission ({what}); report this to the course staff")
    apply_rubric(tests, rubric)
    return SubmissionResult(name, tests, f"the grader failed on this submission ({what}); report this to the "
                            f"course staff", seconds, extra={"grader_error": True})


def _schema_issues(document: dict) -> list[str]:
    from ..schemas import schema_issues

    return [str(issue) for issue in schema_issues(document, "gradescope-results")]


def grade_all(submissions: Sequence[Submission], rubric: Rubric, plan: Plan, out: Path, jobs: int,
              progress: bool = True, sandbox: str = "auto") -> list[SubmissionResult]:
    """Grade ``submissions`` in ``jobs`` worker processes; write results and ``out/summary.csv``.

    ``sandbox``: the mode, best resolved once beforehand (``sandbox_mode``) so workers do not each warn.
    """
    out.mkdir(parents=True, exist_ok=True)
    results: list[SubmissionResult] = []
    start = time.monotonic()
    with ProcessPoolExecutor(max_workers=max(1, jobs)) as pool:
        futures = {pool.submit(_grade_one, s, rubric, plan, out / s.name, sandbox): s for s in submissions}
        for done, future in enumerate(as_completed(futures), start=1):
            sub = futures[future]
            try:
                result = future.result()
            except Exception as exc:
                result = _grader_failure(sub.name, rubric, f"{type(exc).__name__}: {exc}", 0.0)
            results.append(result)
            if progress:
                _progress(done, len(submissions), result, time.monotonic() - start)
    write_summary(out / "summary.csv", results)
    return results


def _progress(done: int, total: int, result: SubmissionResult, elapsed: float) -> None:
    width = 24
    filled = width * done // max(total, 1)
    bar = "#" * filled + "." * (width - filled)
    print(f"[{bar}] {done}/{total} {result.name}: {result.score:g}/{result.max_score:g} "
          f"({result.execution_time:.1f} s; {elapsed:.0f} s elapsed)", file=sys.stderr, flush=True)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="cbatch grade", description="Grade scheduler submissions (Gradescope "
                                     "results.json per submission and a summary.csv).")
    parser.add_argument("submissions", nargs="?", help="folder of submissions (each .py file or subfolder)")
    parser.add_argument("--out", help="output folder (OUT/<name>/results.json, OUT/summary.csv)")
    parser.add_argument("--rubric", help="rubric TOML (default: the shipped default rubric)")
    parser.add_argument("--traces", help="folder of hidden workload files (JSONL, first line {\"config\": {...}})")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="worker processes (default: CPUs)")
    parser.add_argument("--gradescope", action="store_true",
                        help=f"grade {GRADESCOPE_ROOT}/submission into {GRADESCOPE_ROOT}/results/results.json")
    parser.add_argument("--gradescope-root", default=GRADESCOPE_ROOT, help=argparse.SUPPRESS)
    parser.add_argument("--sandbox", choices=SANDBOX_MODES, default=None,
                        help="auto: bubblewrap when it works here, else plain processes with a notice; bwrap: "
                             "required (grading fails without it); process: never (default: the rubric's "
                             "[grading].sandbox, shipped as auto)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    return parser


def sandbox_mode(requested: str | None, rubric: Rubric) -> str:
    """The mode to grade in (``bwrap`` or ``process``); prints the not-contained notice once; ValueError if refused.

    A rubric that requires bwrap cannot be relaxed from the command line.
    """
    if rubric.sandbox == "bwrap" and requested not in (None, "bwrap"):
        raise ValueError(f"{rubric.source} requires sandbox = \"bwrap\"; --sandbox={requested} cannot relax it")
    mode, notice = resolve_mode(requested or rubric.sandbox)
    if notice:
        print(notice, file=sys.stderr, flush=True)
    return mode


def main(argv: Sequence[str]) -> int:
    """Entry point of ``cbatch grade``."""
    args = build_parser().parse_args(list(argv))
    try:
        rubric = load_rubric(args.rubric)
        plan = build_plan(rubric, args.traces)
        if args.gradescope:
            root = Path(args.gradescope_root)
            submissions, out = [gradescope_submission(root)], root / "results"
        else:
            if not args.submissions or not args.out:
                raise ValueError("give SUBMISSIONS_DIR and --out OUT (or --gradescope)")
            folder = Path(args.submissions)
            if not folder.is_dir():
                raise ValueError(f"{folder} is not a folder")
            submissions, out = discover(folder), Path(args.out)
            if not submissions:
                raise ValueError(f"{folder}: no submission found (.py files or folders holding them)")
        sandbox = sandbox_mode(args.sandbox, rubric)
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.gradescope:
        result = _grade_one(submissions[0], rubric, plan, out / "_grading", sandbox)
        shutil.move(str(out / "_grading" / "results.json"), out / "results.json")
        print(f"{result.score:g}/{result.max_score:g} -> {out / 'results.json'}")
        return 1 if result.extra.get("grader_error") else 0
    results = grade_all(submissions, rubric, plan, out, args.jobs, progress=not args.quiet, sandbox=sandbox)
    for result in sorted(results, key=lambda r: r.name):
        print(f"{result.name}: {result.score:g}/{result.max_score:g}")
    print(f"{len(results)} submissions -> {out / 'summary.csv'}")
    return 1 if any(r.extra.get("grader_error") for r in results) else 0
