"""Benchmark: the reference simulator on a large trace.

Prints requests/s, events/s, the ratio of simulate time to ``json.dumps`` of its
own report (target <= 1.5) and the growth when the trace doubles (target ~2x).
Run from a checkout: ``python benchmarks/bench_simulate.py``.
"""

from __future__ import annotations

import argparse
import json

from pytest_cbatch.reference.scheduler_sim import simulate
from workload import BENCH_CONFIG, best_of, large_trace



def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    rows = []
    for admission in ("reserve", "optimistic"):
        for n in (args.requests, 2 * args.requests):
            trace = large_trace(n)
            sim_s, report = best_of(args.repeat, lambda: simulate(trace, admission=admission, **BENCH_CONFIG))
            dump_s, _ = best_of(args.repeat, lambda: json.dumps(report))
            rows.append((admission, n, len(report["events"]), sim_s, dump_s))
    print(f"{'admission':<11}{'requests':>9}{'events':>9}{'sim s':>8}{'req/s':>9}{'events/s':>10}{'sim/dumps':>10}")
    for admission, n, events, sim_s, dump_s in rows:
        print(f"{admission:<11}{n:>9}{events:>9}{sim_s:>8.3f}{n / sim_s:>9.0f}{events / sim_s:>10.0f}{sim_s / dump_s:>10.2f}")
    for admission in ("reserve", "optimistic"):
        small, big = [r for r in rows if r[0] == admission]
        print(f"{admission}: 2x trace -> {big[3] / small[3]:.2f}x time")


if __name__ == "__main__":
    main()
