"""Benchmark: schema validation of the large workload report against ``json.loads``.

Simulates ``large_trace(--requests)`` with ``BENCH_CONFIG`` and prints the
report's size, the time ``json.loads`` takes to parse it, and the validation
time of each available backend with its ratio to ``json.loads`` (target: well
under 1).  jsonschema-rs validates the whole report.  Plain jsonschema is far
too slow for that, so it validates a prefix of the events (``--prefix``, 5% by
default) and the full time is extrapolated linearly; the output says so.  With
jsonschema-rs it also times explaining an error near the end of the report
(jsonschema then descends only into the elements jsonschema-rs rejects).
Run from a checkout: ``python benchmarks/bench_schema.py``.
"""

from __future__ import annotations

import argparse
import json

from pytest_cbatch.reference.scheduler_sim import simulate
from pytest_cbatch.schemas import schema_issues, validator_backend
from workload import BENCH_CONFIG, best_of, large_trace



def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--prefix", type=float, default=0.05, help="share of events plain jsonschema validates")
    args = parser.parse_args()

    text = json.dumps(simulate(large_trace(args.requests), **BENCH_CONFIG))
    loads_s, report = best_of(args.repeat, lambda: json.loads(text))
    events = len(report["events"])
    print(f"report: {args.requests} requests, {events} events, {len(text) / 1e6:.1f} MB of JSON")
    print(f"{'json.loads':<34}{loads_s:>9.3f} s")

    def row(label: str, seconds: float) -> None:
        print(f"{label:<34}{seconds:>9.3f} s{seconds / loads_s:>8.2f}x json.loads")

    if validator_backend() == "jsonschema-rs":
        rs_s, issues = best_of(args.repeat, lambda: schema_issues(report, "report", backend="jsonschema-rs"))
        assert issues == [], issues
        row("jsonschema-rs, full report", rs_s)
        late = events - 2
        broken = {**report, "events": [*report["events"][:late], {**report["events"][late], "time": True},
                                       *report["events"][late + 1:]]}
        fail_s, issues = best_of(args.repeat, lambda: schema_issues(broken, "report", backend="jsonschema-rs"))
        assert [issue.path for issue in issues] == [f"/events/{late}/time"], issues
        row("jsonschema-rs, explain a late error", fail_s)
    else:
        print("jsonschema-rs: not installed (pip install jsonschema-rs)")

    kept = max(1, round(events * args.prefix))
    prefix = {**report, "events": report["events"][:kept]}
    py_s, issues = best_of(1, lambda: schema_issues(prefix, "report", backend="jsonschema"))
    assert issues == [], issues
    print(f"{'jsonschema, first ' + f'{kept} events':<34}{py_s:>9.3f} s  (measured on {args.prefix:.0%} of the events)")
    row("jsonschema, full (extrapolated)", py_s * events / kept)

if __name__ == "__main__":
    main()
