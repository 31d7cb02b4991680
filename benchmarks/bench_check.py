"""Benchmark: checking a large report (schema + every clause) against ``json.loads`` of it.

Target: at most 1.2x the time of ``json.loads``.  Prints both times (each the
best of ``--repeat``, alternating, so a busy machine slows both alike) and the
ratio, measured in one run.  Run from a checkout: ``python benchmarks/bench_check.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import time

from pytest_cbatch.contract import check_report
from pytest_cbatch.reference.scheduler_sim import simulate
from pytest_cbatch.reference.scheduler_sim import validate_trace
from pytest_cbatch.schemas import validator_backend
from workload import BENCH_CONFIG, large_trace


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--admission", choices=["reserve", "optimistic"], default="reserve")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    trace = validate_trace(large_trace(args.requests))
    config = dict(BENCH_CONFIG)
    if args.admission == "optimistic":
        config["admission"] = "optimistic"
    text = json.dumps(simulate(trace, **config))
    loads_s = check_s = float("inf")
    events = 0
    for _ in range(args.repeat):
        start = time.perf_counter()
        report = json.loads(text)
        loads_s = min(loads_s, time.perf_counter() - start)
        start = time.perf_counter()
        violations = check_report(report, trace, config)
        check_s = min(check_s, time.perf_counter() - start)
        events = len(report["events"])
        del report
    print(f"machine: {os.cpu_count()} cores, load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    print(f"report: {args.requests} requests, {events} events, {len(text) / 1e6:.1f} MB, "
          f"admission {args.admission}, schema validator {validator_backend()}")
    print(f"json.loads          {loads_s:8.3f} s")
    print(f"check_report        {check_s:8.3f} s   {check_s / loads_s:.2f}x json.loads (target <= 1.2x), "
          f"{len(violations)} violations")


if __name__ == "__main__":
    main()
