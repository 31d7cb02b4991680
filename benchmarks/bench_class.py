"""Benchmark: a class of N submissions graded with ``--jobs`` on one machine and on a local Ray cluster.

The class is ``examples/grading/make_class.py``'s fixed mix (correct and buggy
folders, a one-file correct one, one that loops forever, one that calls
``os._exit``, one that crashes on import), N submissions in turn.  Each way
runs ``cbatch grade`` as a user would (a subprocess; the Ray one with ``--ray
auto``, a local cluster of ``--jobs`` CPUs started by the run and counted in
its time, inside a network namespace of loopback only, which needs root).
Prints, for each way: the wall time, submissions per minute, and the cost of
one submission: the mean time one submission holds a worker (results.json's
execution_time) overall and per kind, which is what sizing a cluster needs:
a class takes about N times that mean divided by the workers.  It also checks that both ways gave the same verdicts,
and prints the machine's load, since a shared machine slows every figure.
Run from a checkout: ``python benchmarks/bench_class.py --n 14 --jobs 2``.
"""

from __future__ import annotations

import argparse
import csv
import importlib.util
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_NAMESPACE = ["unshare", "--net", "--pid", "--fork", "--mount-proc", "sh", "-c", 'ip link set lo up && exec "$@"', "-"]


def _make_class():
    spec = importlib.util.spec_from_file_location("cbatch_make_class", ROOT / "examples" / "grading" / "make_class.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run(label: str, argv: list[str], out: Path, n: int, mix: tuple[str, ...]) -> dict[str, list[str]]:
    load, start = os.getloadavg()[0], time.monotonic()
    proc = subprocess.run(argv, capture_output=True, text=True)
    wall = time.monotonic() - start
    if proc.returncode:
        sys.exit(f"{label}: cbatch grade exited {proc.returncode}\n{proc.stderr[-3000:]}")
    with open(out / "summary.csv", newline="", encoding="utf-8") as fh:
        table = list(csv.DictReader(fh))
    held: dict[str, list[float]] = defaultdict(list)
    for row in table:
        held[row["submission"].split("_", 1)[1]].append(float(row["execution_time"]))
    every = [t for times in held.values() for t in times]
    print(f"{label}: {n} submissions in {wall:.1f} s = {n / wall * 60:.1f} submissions/min "
          f"(load average {load:.1f} at the start, {os.getloadavg()[0]:.1f} at the end)")
    print(f"  one submission holds a worker {sum(every) / len(every):.1f} s on average "
          f"({sum(every) / wall:.2f} workers busy on average over the run)")
    print("  by kind (mean s): " + ", ".join(f"{kind} {sum(held[kind]) / len(held[kind]):.1f}"
                                              for kind in mix if held[kind]))
    return {row["submission"]: [v for k, v in row.items() if k != "execution_time"] for row in table}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=14, help="submissions in the class (default 14: the mix twice)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="worker processes or Ray CPUs")
    parser.add_argument("--rubric", help="rubric TOML (default: the shipped default rubric)")
    parser.add_argument("--no-ray", action="store_true", help="one machine only")
    args = parser.parse_args()
    module = _make_class()
    print(f"machine: {os.cpu_count()} CPUs, {os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.0f} "
          f"GiB, {platform.platform()}; rubric: {args.rubric or 'the default rubric'}; --jobs {args.jobs}")
    with tempfile.TemporaryDirectory(prefix="cbatch-class-") as tmp:
        subs = Path(tmp) / "subs"
        module.make_class(subs, args.n)
        grade = [sys.executable, "-m", "pytest_cbatch.cli", "grade", str(subs), "--jobs", str(args.jobs), "--quiet"]
        grade += ["--rubric", args.rubric] if args.rubric else []
        local = _run("one machine", [*grade, "--out", str(Path(tmp) / "local")], Path(tmp) / "local", args.n,
                     module.MIX)
        if args.no_ray:
            return
        if os.geteuid() != 0 or shutil.which("unshare") is None:
            print("Ray: skipped (a local cluster runs in a loopback-only network namespace here, which needs root)")
            return
        ray = _run("local Ray cluster (its start-up included)",
                   [*_NAMESPACE, *grade, "--out", str(Path(tmp) / "ray"), "--ray", "auto"], Path(tmp) / "ray",
                   args.n, module.MIX)
        print("verdicts: " + ("the same both ways" if ray == local else "DIFFERENT between the two ways"))


if __name__ == "__main__":
    main()
