"""Benchmark: grading one submission in the sandbox against the same grading in process.

Target: the sandboxed submission (``cbatch grade``'s path: a child process,
in bubblewrap when it works here) costs at most 2x the same suite judged on
the same submission imported into this process.  The submission is the
published two-file folder (the grading example's ``correct`` sample: the
course's ``scheduler_sim.py`` and ``scheduler_faults.py``); the rubric is the
default one unless ``--rubric`` says otherwise.  Each grading runs
``--repeat`` times (in process and sandboxed in turn) and the best of each
gives the ratio, since a shared machine adds noise of tens of percent to any
one run.  ``--pytest`` also times the shipped suite, ``pytest
--cbatch-impl=FOLDER``, in process and with ``--cbatch-isolate`` (the same
suite, sandboxed).  Prints each time and the ratios, measured in one run.
Run from a checkout: ``python benchmarks/bench_grading.py``.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from pytest_cbatch.grading.evaluate import Submission, grade_implementation, grade_submission
from pytest_cbatch.grading.plan import build_plan
from pytest_cbatch.grading.rubric import load_rubric
from pytest_cbatch.impls import resolve_impl
from pytest_cbatch.sandbox import LoadSpec, resolve_mode, submission_files

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "grading" / "make_samples.py"


def _published_folder(dest: Path) -> Path:
    spec = importlib.util.spec_from_file_location("cbatch_grading_make_samples", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.make_samples(dest, only=("correct",))[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rubric", help="rubric TOML (default: the shipped default rubric)")
    parser.add_argument("--lifecycle-examples", type=int, help="override the rubric's lifecycle_examples")
    parser.add_argument("--generated-examples", type=int, help="override the rubric's generated_examples")
    parser.add_argument("--sandbox", default="auto", choices=("auto", "bwrap", "process"))
    parser.add_argument("--repeat", type=int, default=3, help="gradings of each kind; the best counts (default 3)")
    parser.add_argument("--pytest", action="store_true",
                        help="also time pytest --cbatch-impl=FOLDER, in process and with --cbatch-isolate")
    args = parser.parse_args()
    rubric = load_rubric(args.rubric)
    overrides = {k: v for k, v in (("lifecycle_examples", args.lifecycle_examples),
                                   ("generated_examples", args.generated_examples)) if v is not None}
    rubric = replace(rubric, **overrides)
    plan = build_plan(rubric)
    mode, _notice = resolve_mode(args.sandbox)
    with tempfile.TemporaryDirectory(prefix="cbatch-bench-grading-") as tmp:
        folder = _published_folder(Path(tmp) / "submissions")
        out = Path(tmp) / "out"
        out.mkdir()

        submission = Submission("correct", str(folder), LoadSpec(str(folder), submission_files(str(folder))))
        local_times, boxed_times = [], []
        for _ in range(max(args.repeat, 1)):
            start = time.perf_counter()
            local = grade_implementation(resolve_impl(str(folder)), "correct", rubric, plan, out)
            local_times.append(time.perf_counter() - start)
            start = time.perf_counter()
            boxed = grade_submission(submission, rubric, plan, out, mode)
            boxed_times.append(time.perf_counter() - start)
        suite = {flag: _pytest_seconds(folder, tmp, flag) for flag in ("", "--cbatch-isolate")} if args.pytest else {}

    same = [(t.name, t.passed) for t in local.tests] == [(t.name, t.passed) for t in boxed.tests]
    local_s, boxed_s = min(local_times), min(boxed_times)
    print(f"submission: the published two-file folder; rubric {rubric.source}: {rubric.generated_examples} "
          f"generated traces per admission mode, {rubric.lifecycle_examples} lifecycle examples per part, "
          f"{len(boxed.tests)} tests; {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}")
    print(f"in process          {local_s:8.1f} s   score {local.score:g}/{local.max_score:g}   "
          f"(runs: {_seconds(local_times)})")
    print(f"sandboxed ({mode:7s}) {boxed_s:8.1f} s   score {boxed.score:g}/{boxed.max_score:g}   "
          f"{boxed_s / local_s:.2f}x in process (target <= 2x); verdicts {'the same' if same else 'DIFFER'}   "
          f"(runs: {_seconds(boxed_times)})")
    if suite:
        plain, isolated = suite[""], suite["--cbatch-isolate"]
        print(f"pytest --cbatch-impl {plain:7.1f} s   in process; sandboxed grading is {boxed_s / plain:.2f}x it")
        print(f"  --cbatch-isolate   {isolated:7.1f} s   the same suite sandboxed: {isolated / plain:.2f}x in process")


def _pytest_seconds(folder: Path, cwd: str, flag: str) -> float:
    command = [sys.executable, "-m", "pytest", f"--cbatch-impl={folder}", "-q", "-p", "no:cacheprovider",
               *filter(None, [flag])]
    start = time.perf_counter()
    subprocess.run(command, cwd=cwd, capture_output=True, check=False)
    return time.perf_counter() - start


def _seconds(times: list[float]) -> str:
    return ", ".join(f"{t:.1f}" for t in times)


if __name__ == "__main__":
    main()
