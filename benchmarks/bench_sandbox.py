"""Benchmark: the ways a sandboxed lifecycle part is judged, and what a hostile submission costs the grader.

For each lifecycle part of the published reference, under the grading
settings (``--examples`` lifecycle examples, derandomized): the searched run
(the child runs the search ahead, the grader judges its lines; what grading
does) against the live channel (one request at a time, the fallback).  Then
``lifecycle_verdicts_of`` of the allocator part on submissions that force the
fallback: one that patches its copy of the kit (the child's lines differ from
the grader's run), one that exits on ``fork`` and one that hangs on ``fork``
(``call_seconds`` 2).  Best of ``--repeat`` runs each.
Run from a checkout: ``python benchmarks/bench_sandbox.py``.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from hypothesis import HealthCheck
from hypothesis import settings as Settings

from pytest_cbatch.lifecycle import PARTS, lifecycle_verdicts
from pytest_cbatch.sandbox import IsolatedImplementation, Limits, lifecycle_verdicts_of, load_spec_for

REFERENCE = "pytest_cbatch.reference.scheduler_faults"
_BASE = "from pytest_cbatch.reference.scheduler_faults import PagedKV as _PagedKV, RecomputeRequest, TransferManager\n"
HOSTILE = {
    "patches its kit": ("from pytest_cbatch.reference.scheduler_faults import PagedKV, RecomputeRequest, "
                        "TransferManager\nimport pytest_cbatch.lifecycle.machine as _machine\n"
                        "_machine.LifecycleMachine.check_views = lambda self, context: None\n"),
    "exits on fork": _BASE + "import sys\n\nclass PagedKV(_PagedKV):\n    def fork(self, source, target):\n"
                             "        sys.exit(3)\n",
    "hangs on fork": _BASE + "\nclass PagedKV(_PagedKV):\n    def fork(self, source, target):\n"
                             "        while True:\n            pass\n",
}


def best(repeat: int, run: Callable[[], Any]) -> tuple[float, Any]:
    times, result = [], None
    for _ in range(repeat):
        start = time.perf_counter()
        result = run()
        times.append(time.perf_counter() - start)
    return min(times), result


def statuses(verdicts: dict[str, Any]) -> str:
    """How many clauses have each status, and which failed."""
    counts = {status: sum(v.status == status for v in verdicts.values()) for status in ("pass", "fail", "error", "skip")}
    failed = sorted(cid.removeprefix("lifecycle.") for cid, v in verdicts.items() if v.status == "fail")
    return " ".join(f"{n} {status}" for status, n in counts.items() if n) + (f" ({', '.join(failed)})" if failed else "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=100, help="lifecycle examples per search (grading's 100)")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--sandbox", default="process", choices=("auto", "bwrap", "process"))
    parser.add_argument("--only", choices=("reference", "hostile"), help="run one half of the benchmark")
    args = parser.parse_args()
    settings = Settings(max_examples=args.examples, derandomize=True, database=None, deadline=None,
                        print_blob=False, suppress_health_check=list(HealthCheck))
    print(f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}; {args.examples} examples, best of "
          f"{args.repeat}; sandbox {args.sandbox}")
    impl = IsolatedImplementation(REFERENCE, load_spec_for(REFERENCE), Limits(), mode=args.sandbox)
    try:
        for part in PARTS if args.only != "hostile" else ():
            searched, (verdicts, _) = best(args.repeat, lambda: lifecycle_verdicts_of(impl, part, settings))
            live, _ = best(args.repeat, lambda: lifecycle_verdicts(part, impl.namespace, settings))
            print(f"reference {part:<10} searched {searched:6.2f} s   live channel {live:6.2f} s "
                  f"({live / searched:4.1f}x)   {statuses(verdicts)}")
    finally:
        impl.close()
    with tempfile.TemporaryDirectory(prefix="cbatch-bench-sandbox-") as tmp:
        for name, source in HOSTILE.items() if args.only != "reference" else ():
            path = Path(tmp) / f"{name.replace(' ', '_')}.py"
            path.write_text(source)
            impl = IsolatedImplementation(str(path), load_spec_for(str(path)), Limits(call_seconds=2),
                                          mode=args.sandbox)
            try:
                seconds, (verdicts, note) = best(args.repeat, lambda: lifecycle_verdicts_of(impl, "allocator",
                                                                                           settings))
            finally:
                impl.close()
            print(f"{name:<20} allocator {seconds:6.2f} s   {statuses(verdicts)}; "
                  f"{(note or 'no note')[:90]}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
