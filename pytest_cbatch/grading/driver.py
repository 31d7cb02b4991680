"""``cbatch grade``: grade a folder of submissions (or one, on Gradescope) in parallel worker processes.

    cbatch grade SUBMISSIONS_DIR --out OUT [--rubric rubric.toml] [--traces DIR] [--jobs N] [--sandbox MODE]
                 [--shard I/N] [--ray ADDRESS|auto]
    cbatch grade merge OUT1 OUT2 ... --out OUT
    cbatch grade --gradescope [--rubric rubric.toml] [--traces DIR] [--sandbox MODE]

A submission is each ``.py`` file of SUBMISSIONS_DIR, or each folder holding
``scheduler_sim.py`` and/or ``scheduler_faults.py`` or any ``.py`` file, or a
manifest ``cbatch.toml`` naming a program in any language (``manifest``); its
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
required bubblewrap that cannot run).  ``OUT/grading.json`` is the run's
record (``shards``): ``--shard I/N`` grades only the submissions whose name
hashes to shard I of N, and ``merge`` joins such outputs after checking them.
``--ray`` grades each submission as a task on a Ray cluster (``ray_runner``);
progress goes to stderr (``progress``).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
import traceback
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Callable, Iterator, Sequence

from .. import untrusted
from ..sandbox import SANDBOX_MODES, LoadSpec, resolve_mode, submission_files
from ..sandbox import reaper
from ..sandbox.files import link_refusal
from .bundle import BundleError, pack
from .evaluate import Submission, apply_rubric, grade_submission, unjudged
from .manifest import MANIFEST, ManifestError, read_manifest
from .plan import Plan, build_plan
from .progress import HEARTBEAT_SECONDS, Progress
from .results import SubmissionResult, write_json, write_summary
from .rubric import Rubric, load_rubric
from .shards import RECORD, MergeError, RunRecord, kit_version, merge, parse_shard, plan_fingerprint, \
    rubric_fingerprint, shard_of

__all__ = ["discover", "grade_all", "main"]

GRADESCOPE_ROOT = "/autograder"
SUMMARY = "summary.csv"
OUTPUT_NAMES = (SUMMARY, RECORD)
"""What a run writes beside the submissions' folders: no submission is ever named so."""


def discover(folder: Path) -> list[Submission]:
    """The submissions in ``folder``, sorted by name; ValueError when two share a name.

    Every ``.py`` file and every folder not starting with ``.`` or ``_`` is a submission.  Its name is the
    kit's name for the file stem or folder name (``untrusted.name``: any bytes, never an output's name), so
    no name stops the class.  A submission that is a symbolic link (a ``.py`` file or a folder), or a
    folder whose only modules are links, is listed refused (``Submission.refused``); a folder with nothing
    to grade is listed with its problem: both are graded 0, saying why, and nothing is read through a link.
    """
    found: dict[str, Submission] = {}
    for entry in sorted(folder.iterdir()):
        if entry.name.startswith((".", "_")):
            continue
        if entry.is_symlink():
            if entry.suffix not in (".py", ""):
                continue
            sub = Submission(submission_name(entry.stem), str(entry), LoadSpec(str(entry)),
                             refused=link_refusal(untrusted.line(entry.name, 200)))
        elif entry.is_file() and entry.suffix == ".py":
            sub = Submission(submission_name(entry.stem), str(entry), _single_file(entry))
        elif entry.is_dir():
            sub = folder_submission(entry, submission_name(entry.name)) or _empty_folder(entry)
        else:
            continue
        if sub.name in found:
            raise ValueError(f"two submissions are named {sub.name!r}: "
                             f"{untrusted.line(found[sub.name].path)} and {untrusted.line(sub.path)}")
        found[sub.name] = sub
    return list(found.values())


def submission_name(raw: str) -> str:
    """The name a submission is graded under, from its file stem or folder name: ``untrusted.name``, kept
    apart from the outputs written beside the submissions' folders."""
    return untrusted.name(raw, reserved=OUTPUT_NAMES)


def folder_submission(folder: Path, name: str) -> Submission | None:
    """The submission a folder holds: a program named by its manifest (``cbatch.toml``; a broken one is a
    submission whose results say what is wrong), else its Python files (refused when they are all links);
    None when it holds neither."""
    if os.path.lexists(folder / MANIFEST):
        try:
            manifest = read_manifest(folder)
            return Submission(name, str(folder), LoadSpec(str(folder), command=manifest.command,
                                                          unsupported=manifest.unsupported))
        except ManifestError as exc:
            return Submission(name, str(folder), LoadSpec(str(folder)), problem=str(exc))
    files = submission_files(str(folder))
    if files:
        return Submission(name, str(folder), LoadSpec(str(folder), files))
    linked = _linked_modules(folder)
    return Submission(name, str(folder), LoadSpec(str(folder)), refused=link_refusal(", ".join(linked))) \
        if linked else None


def _empty_folder(folder: Path) -> Submission:
    """A folder of the class with nothing the kit grades: its row says so, and where a scheduler seems to be."""
    nested = sorted(p.parent.name for p in folder.glob(f"*/{MANIFEST}"))
    nested += sorted({p.parent.name for p in folder.glob("*/*.py")} - set(nested))
    hint = (f"; the folder {untrusted.line(nested[0], 80)}/ inside it holds one: hand in the files themselves, "
            f"not a folder around them" if nested else "")
    return Submission(submission_name(folder.name), str(folder), LoadSpec(str(folder)),
                      problem=f"no .py file or {MANIFEST} at the top of the submission{hint}")


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
    found = folder_submission(folder, "submission") if folder.is_dir() else None
    if found is None:
        raise ValueError(f"{folder}: no .py file or {MANIFEST} to grade")
    return found


def _grade_one(submission: Submission, rubric: Rubric, plan: Plan, out_dir: Path, sandbox: str) -> SubmissionResult:
    """Worker entry: grade one submission, turning a grader crash into a results.json that says so."""
    if out_dir.exists():
        shutil.rmtree(out_dir)
    out_dir.mkdir(parents=True)
    start = time.monotonic()
    before = frozenset(reaper.descendants()) if reaper.adopted() else frozenset()
    try:
        result = grade_submission(submission, rubric, plan, out_dir, sandbox)
        if reaper.adopted():  # a process the submission left behind (setsid, double fork) dies before its results
            reaper.sweep(spare=before)
    except Exception as exc:  # a grader bug must not cost the other submissions their results
        detail = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)[-4:])
        result = _grader_failure(submission.name, rubric, plan, f"{type(exc).__name__}: {exc}",
                                 time.monotonic() - start)
        result.output += "\n" + untrusted.text(detail)
    document = result.gradescope()
    issues = _schema_issues(document)
    if issues:
        raise RuntimeError(f"{submission.name}: results.json would not validate: {issues[0]}")
    write_json(out_dir / "results.json", document)
    return result


def _grader_failure(name: str, rubric: Rubric, plan: Plan, what: str, seconds: float) -> SubmissionResult:
    """Every test of the run at 0, saying the grader (not the submission) failed."""
    what = untrusted.text(what)
    tests = unjudged(rubric, f"the grader failed on this submission ({what}); report this to the course staff", plan)
    apply_rubric(tests, rubric)
    return SubmissionResult(name, tests, f"the grader failed on this submission ({what}); report this to the "
                            f"course staff", seconds, extra={"grader_error": True})


def _schema_issues(document: dict) -> list[str]:
    from ..schemas import schema_issues

    return [str(issue) for issue in schema_issues(document, "gradescope-results")]


def grade_all(submissions: Sequence[Submission], rubric: Rubric, plan: Plan, out: Path, jobs: int,
              progress: bool | Progress = True, sandbox: str = "auto",
              ray: str | None = None) -> list[SubmissionResult]:
    """Grade ``submissions`` in ``jobs`` worker processes, or on the Ray cluster ``ray``; write results and summary.

    ``sandbox``: the mode, best resolved once beforehand (``sandbox_mode``) so
    workers do not each warn; with ``ray``, the requested mode, which each
    worker resolves for itself.  Every submission gets its results.json, once.
    ``progress``: a ``Progress`` already started (``main`` starts it before the
    plan is drawn), or whether to print one.
    """
    out.mkdir(parents=True, exist_ok=True)
    tracker = progress if isinstance(progress, Progress) else _progress(len(submissions), jobs, ray, progress)
    if ray:
        from .ray_runner import grade_on_ray  # ray is imported only when asked for

        events = grade_on_ray(submissions, rubric, plan, out, sandbox, ray, jobs, _grade_one, discover)
    else:
        events = _in_pool(submissions, rubric, plan, out, jobs, sandbox)
    results: list[SubmissionResult] = []
    for event in events:
        if event is None:
            tracker.waiting()
            continue
        name, outcome = event
        if isinstance(outcome, Exception):
            outcome = _grader_failure(name, rubric, plan, f"{type(outcome).__name__}: {outcome}", 0.0)
            _write_result(out / name, outcome)
        results.append(outcome)
        tracker.finished(outcome)
    write_summary(out / SUMMARY, results)
    return results


def _progress(total: int, jobs: int, ray: str | None, enabled: bool) -> Progress:
    """A started ``Progress``: its first line says how many submissions are graded, and where."""
    where = (f"in {max(1, jobs)} worker process{'es' if jobs > 1 else ''}" if not ray
             else f"on a local Ray cluster of {max(1, jobs)} CPUs" if ray == "auto" else f"on the Ray cluster at {ray}")
    tracker = Progress(total, where, enabled=enabled)
    tracker.started()
    return tracker


def _in_pool(submissions: Sequence[Submission], rubric: Rubric, plan: Plan, out: Path, jobs: int, sandbox: str,
             grade_one: Callable[..., SubmissionResult] | None = None,
             ) -> Iterator[tuple[str, SubmissionResult | Exception] | None]:
    """Grade in local worker processes; yields as ``grade_on_ray`` does (a result or error per name, heartbeats).

    A worker that dies (killed for memory, say) breaks its pool, and every submission still pending there
    with it: those are graded again in a new pool, and the ones that were running when it broke, one
    worker each, so the one that kills a worker alone is the only one to get a grader failure.
    """
    work = grade_one or _grade_one
    queue, suspects, broken = list(submissions), [], dict.fromkeys((s.name for s in submissions), 0)
    while queue or suspects:
        alone = not queue  # only suspects are left: each in a pool of its own
        batch = queue if queue else [suspects.pop(0)]
        queue = []
        with ProcessPoolExecutor(max_workers=1 if alone else max(1, jobs), initializer=reaper.adopt_orphans) as pool:
            pending = {pool.submit(work, s, rubric, plan, out / s.name, sandbox): s for s in batch}
            running: set[Future] = set()
            quiet_since = time.monotonic()
            while pending:
                done, _ = wait(pending, timeout=1.0, return_when=FIRST_COMPLETED)
                if not done and time.monotonic() - quiet_since >= HEARTBEAT_SECONDS:
                    quiet_since = time.monotonic()
                    yield None
                for future in done:
                    quiet_since = time.monotonic()
                    submission = pending.pop(future)
                    try:
                        yield submission.name, future.result()
                    except BrokenProcessPool as exc:
                        broken[submission.name] += 1
                        if alone:
                            yield submission.name, RuntimeError(
                                f"the grader's worker process died while grading it ({exc}): killed for memory, "
                                f"most likely, by what the submission handed the grader")
                        elif future in running or broken[submission.name] > 1:
                            suspects.append(submission)
                        else:
                            queue.append(submission)
                    except Exception as exc:
                        yield submission.name, exc
                running = {f for f in pending if f.running()}
def _write_result(out_dir: Path, result: SubmissionResult) -> None:
    """A grader failure's results.json, in a folder emptied first (what a worker would have written is gone)."""
    if out_dir.exists():
        shutil.rmtree(out_dir)
    write_json(out_dir / "results.json", result.gradescope())


def _gradescope(submission: Submission, rubric: Rubric, plan: Plan, out: Path, sandbox: str) -> int:
    """Grade Gradescope's one submission into ``out/results.json``, which that submission must not reach.

    Grading runs only contained (bubblewrap: the submission sees neither ``out`` nor any process outside
    its own namespace); without it the kit refuses to write a verdict it cannot protect (exit 2, and a
    results.json saying why, written before any of the submission's code ran).  The verdict is written
    from memory once no process the submission started is left (``reaper``).
    """
    if sandbox != "bwrap":
        problem = ("the autograder cannot protect its results: bubblewrap does not run on this machine, so the "
                   "submission would run as a plain process able to rewrite results.json; the course staff "
                   "must install it in setup.sh (apt-get install -y bubblewrap), as the kit's example does")
        print(f"error: {problem}", file=sys.stderr)
        write_json(out / "results.json", _grader_failure(submission.name, rubric, plan, problem, 0.0).gradescope())
        return 2
    reaper.adopt_orphans()
    result = _grade_one(submission, rubric, plan, out / "_grading", sandbox)  # its own sweep makes it the last
    (out / "_grading" / "results.json").unlink(missing_ok=True)  # the verdict is the one in memory, not that file
    write_json(out / "results.json", result.gradescope())
    print(f"{result.score:g}/{result.max_score:g} -> {out / 'results.json'}")
    return 1 if result.extra.get("grader_error") else 0


def run_record(found: Sequence[Submission], graded: Sequence[Submission], rubric: Rubric, plan: Plan,
               shard: tuple[int, int] | None) -> RunRecord:
    """``grading.json`` of a run: what ``cbatch grade merge`` checks (see ``shards``)."""
    digests: dict[str, str] = {}
    for sub in found:
        try:
            digests[sub.name] = pack(sub).digest()
        except (BundleError, OSError) as exc:
            digests[sub.name] = f"unreadable: {exc}"
    return RunRecord(kit_version(), rubric_fingerprint(rubric), plan_fingerprint(plan), digests,
                     tuple(s.name for s in graded), f"{shard[0]}/{shard[1]}" if shard else None)


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
    parser.add_argument("--shard", metavar="I/N", help="grade only shard I of N (a stable split by a hash of each "
                        "submission's name); join the outputs with: cbatch grade merge OUT1 ... --out OUT")
    parser.add_argument("--ray", metavar="ADDRESS", help="grade each submission as a task on the Ray cluster at "
                        "ADDRESS (HOST:PORT), or 'auto' for a local cluster of --jobs CPUs (pytest-cbatch[ray])")
    parser.add_argument("--quiet", action="store_true", help="no progress lines")
    return parser


def merge_main(argv: Sequence[str]) -> int:
    """``cbatch grade merge OUT1 OUT2 ... --out OUT``: exit 0 when merged, 2 when refused (nothing written)."""
    parser = argparse.ArgumentParser(prog="cbatch grade merge", description="Join the outputs of cbatch grade "
                                     "--shard I/N into the output one run over the whole folder writes.")
    parser.add_argument("outputs", nargs="+", help="the shards' output folders")
    parser.add_argument("--out", required=True, help="the merged output folder (new or empty)")
    args = parser.parse_args(list(argv))
    try:
        record = merge([Path(o) for o in args.outputs], Path(args.out))
    except MergeError as exc:
        print(f"error: {untrusted.text(str(exc))}", file=sys.stderr)
        return 2
    print(f"{len(record.graded)} submissions from {len(args.outputs)} outputs -> {Path(args.out) / 'summary.csv'}")
    return 0


def sandbox_mode(requested: str | None, rubric: Rubric) -> str:
    """The mode to grade in (``bwrap`` or ``process``); prints the not-contained notice once; ValueError if refused.

    A rubric that requires bwrap cannot be relaxed from the command line.
    """
    mode, notice = resolve_mode(requested_mode(requested, rubric))
    if notice:
        print(notice, file=sys.stderr, flush=True)
    return mode


def requested_mode(requested: str | None, rubric: Rubric) -> str:
    """The sandbox mode asked for (``--sandbox``, else the rubric's); ValueError when it relaxes a required bwrap."""
    if rubric.sandbox == "bwrap" and requested not in (None, "bwrap"):
        raise ValueError(f"{rubric.source} requires sandbox = \"bwrap\"; --sandbox={requested} cannot relax it")
    return requested or rubric.sandbox


def main(argv: Sequence[str]) -> int:
    """Entry point of ``cbatch grade``."""
    if list(argv[:1]) == ["merge"]:
        return merge_main(argv[1:])
    args = build_parser().parse_args(list(argv))
    try:
        rubric = load_rubric(args.rubric)
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
        shard = parse_shard(args.shard) if args.shard else None
        if (shard or args.ray) and args.gradescope:
            raise ValueError("--shard and --ray grade a folder, not --gradescope")
        # On Ray each worker resolves the mode for itself (and refuses a required bwrap it lacks).
        sandbox = requested_mode(args.sandbox, rubric) if args.ray else sandbox_mode(args.sandbox, rubric)
        found = submissions
        if shard:
            submissions = [s for s in found if shard_of(s.name, shard[1]) == shard[0]]
        # The first progress line comes before the plan is drawn, which takes seconds under the default rubric.
        tracker = _progress(len(submissions), args.jobs, args.ray, not (args.quiet or args.gradescope))
        plan = build_plan(rubric, args.traces)
    except (OSError, ValueError) as exc:
        print(f"error: {untrusted.text(str(exc))}", file=sys.stderr)
        return 2
    if args.gradescope:
        return _gradescope(submissions[0], rubric, plan, out, sandbox)
    record = run_record(found, submissions, rubric, plan, shard)
    try:
        results = grade_all(submissions, rubric, plan, out, args.jobs, progress=tracker, sandbox=sandbox, ray=args.ray)
    except (OSError, ValueError) as exc:  # no cluster there, none can run a task, or no ray: nothing was graded
        print(f"error: {untrusted.text(str(exc))}", file=sys.stderr)
        return 2
    record.write(out)
    for result in sorted(results, key=lambda r: r.name):
        print(f"{result.name}: {result.score:g}/{result.max_score:g}")
    print(f"{len(results)} submissions -> {out / 'summary.csv'}")
    return 1 if any(r.extra.get("grader_error") for r in results) else 0
