"""Benchmark: a failing lifecycle part against the whole passing suite, as a user runs them.

Runs, each as its own ``pytest`` process under the default (ci) profile: the
whole conformance suite on the reference (every contract clause on every
workload, the three lifecycle parts, numerics), then ``-k 'test_lifecycle and
PART'`` on each one-bug variant of ``lifecycle_bugs``.  Prints each time, its
ratio to the passing suite, the failing clauses and the longest replay.
Target: a failing part reports within 30 s on 2 cores.  ``--in-process`` also
times ``lifecycle_verdicts`` directly, without pytest's start-up.
Run from a checkout: ``python benchmarks/bench_lifecycle.py``.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from lifecycle_bugs import BUGS

HERE = Path(__file__).resolve().parent


def pytest_run(*args: str) -> tuple[float, str]:
    """Seconds and output of one ``pytest`` process in this folder (no cache, quiet)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")]))}
    start = time.perf_counter()
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
                          *args], cwd=HERE, env=env, capture_output=True, text=True, timeout=3600)
    return time.perf_counter() - start, run.stdout + run.stderr


def summary(output: str) -> str:
    found = re.findall(r"^=* ?(\d+ (?:passed|failed).*?)(?: =*)?$", output, re.M)
    return found[-1] if found else output.strip().splitlines()[-1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bugs", nargs="*", default=sorted(BUGS), choices=sorted(BUGS))
    parser.add_argument("--in-process", action="store_true", help="also time lifecycle_verdicts without pytest")
    args = parser.parse_args()
    print(f"machine: {os.cpu_count()} cores, load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    suite_s, out = pytest_run("--cbatch-impl=reference")
    print(f"{'passing suite (reference)':<34}{suite_s:8.1f} s          {summary(out)}")
    for name in args.bugs:
        _, part = BUGS[name]
        seconds, out = pytest_run(f"--cbatch-impl=lifecycle_bugs:{name}", "-k", f"test_lifecycle and {part}")
        clauses = sorted(set(re.findall(r"^\[(lifecycle\.\w+)\] (?!skip: |error: )", out, re.M)))
        replays = [len(block.splitlines()) for block in re.findall(r"replay \(runnable Python.*?\n((?:    .*\n)+)", out)]
        print(f"{name + ' (' + part + ')':<34}{seconds:8.1f} s {seconds / suite_s:6.2f}x  {summary(out)}; "
              f"{', '.join(clauses) or 'no clause failed'}; longest replay {max(replays, default=0)} lines")
    if args.in_process:
        from hypothesis import settings

        from pytest_cbatch.lifecycle import lifecycle_verdicts

        ci = settings(max_examples=100, derandomize=True, database=None, stateful_step_count=50)  # cbatch-ci
        for name in args.bugs:
            namespace, part = BUGS[name]
            start = time.perf_counter()
            verdicts = lifecycle_verdicts(part, namespace, ci)
            failed = sorted(cid for cid, v in verdicts.items() if v.status == "fail")
            print(f"in process: {name:<24}{time.perf_counter() - start:8.1f} s  {', '.join(failed)}")
    print(f"load average after: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
