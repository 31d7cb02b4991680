"""Benchmark: checking a large report (schema + every clause) against ``json.loads`` of it, per workload shape.

Target: at most 1.2x the time of ``json.loads`` on every shape (see
``workload.SHAPES``).  For each shape it prints the report's events and size,
both times (each the best of ``--repeat``; the two alternate, so a busy
machine slows both alike) and their ratio, measured in one run, in wall time
and in CPU time, after one line naming the machine.  ``--shape NAME`` runs one shape.  Run from a
checkout: ``python benchmarks/bench_check.py``.
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
from workload import SHAPES, Shape

TARGET = 1.2


def measure(shape: Shape, requests: int, repeat: int) -> float:
    """Print one shape's figures; return check_report's ratio to json.loads."""
    trace = validate_trace(shape.trace(requests, 0))
    config = shape.config()
    text = json.dumps(simulate(trace, **config))
    loads = Best()
    check = Best()
    events = 0
    violations: list = []
    for _ in range(repeat):
        with loads:
            report = json.loads(text)
        with check:
            violations = check_report(report, trace, config)
        events = len(report["events"])
        del report
    ratio = check.wall / loads.wall
    print(f"{shape.name}: {shape.summary}")
    print(f"  {requests} requests, {events} events, {len(text) / 1e6:.1f} MB, "
          f"admission {config.get('admission', 'reserve')}, capacity {config['capacity']}")
    print(f"  json.loads    {loads.wall:8.3f} s   (CPU {loads.cpu:.3f} s)")
    print(f"  check_report  {check.wall:8.3f} s   (CPU {check.cpu:.3f} s)   {ratio:.2f}x json.loads "
          f"(CPU {check.cpu / loads.cpu:.2f}x; {'within' if ratio <= TARGET else 'OVER'} target <= {TARGET}x), "
          f"{len(violations)} violations")
    return ratio


class Best:
    """The shortest wall and CPU (process) times of the timed blocks, each its own minimum.

    On a machine other processes load, wall time counts the waits for a
    core; CPU time does not, so its ratio moves less from run to run.
    """

    def __init__(self) -> None:
        self.wall = self.cpu = float("inf")

    def __enter__(self) -> None:
        self._wall, self._cpu = time.perf_counter(), time.process_time()

    def __exit__(self, *exc: object) -> None:
        self.wall = min(self.wall, time.perf_counter() - self._wall)
        self.cpu = min(self.cpu, time.process_time() - self._cpu)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=list(SHAPES), action="append",
                        help="run only this shape (repeatable); default: every shape")
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    print(f"machine: {os.cpu_count()} cores, load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}, "
          f"schema validator {validator_backend()}")
    ratios = {name: measure(SHAPES[name], args.requests, args.repeat) for name in args.shape or SHAPES}
    print(f"load average after: {' '.join(f'{x:.1f}' for x in os.getloadavg())}; worst ratio "
          f"{max(ratios.values()):.2f}x ({max(ratios, key=ratios.__getitem__)})")


if __name__ == "__main__":
    main()
