"""The killing test of the mutation campaign: the shipped conformance checks, stopping at the first failure.

Usage (from a checkout)::

    python benchmarks/mutation/kill.py sim PATH/scheduler_sim.py --traces TRACES.json
    python benchmarks/mutation/kill.py faults FOLDER

``sim`` judges a ``scheduler_sim.py`` through the kit's own ``Judge`` (the same
runs and ``check_report`` verdicts as ``pytest --cbatch-impl=FILE``): every
clause on every fixed workload of ``pytest_cbatch.workloads``, every invalid
input, then every clause on the fixed, seeded generated traces in TRACES.json
(written by ``campaign.py``).  ``faults`` judges the ``scheduler_faults.py`` of
FOLDER (with its ``scheduler_sim.py`` beside it, the course's layout) with the
lifecycle state machines of the recompute and transfer parts (those that can
reach the changed line) under the ci
profile's examples (derandomized), without shrinking, after a quick round of
fewer examples that kills most mutants sooner.

Exit status: 0 when everything passed (the mutant survived), 1 at the first
failing check (printed: clause and workload), 3 when the run used more than
``--budget`` seconds of CPU (a runaway: printed as ``timed out``).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from typing import Any, NoReturn

EXIT_KILLED = 1
EXIT_TIMED_OUT = 3
LIFECYCLE_PARTS = ("recompute", "transfer")
"""The lifecycle parts scheduler_faults.py implements (the allocator is scheduler_sim.py's PagedKV)."""


def _killed(what: str) -> NoReturn:
    print(f"killed: {what}", flush=True)
    sys.exit(EXIT_KILLED)


def _watchdog(seconds: int) -> None:
    """Give up after ``seconds`` of CPU time (not wall time, so a loaded machine does not turn a slow
    run into a timeout)."""
    def expire(signum: int, frame: Any) -> None:
        print(f"timed out: the checks used more than {seconds} s of CPU", flush=True)
        os._exit(EXIT_TIMED_OUT)  # the mutant may be looping inside code that swallows exceptions

    signal.signal(signal.SIGPROF, expire)
    signal.setitimer(signal.ITIMER_PROF, seconds)


def judge_sim(path: str, traces_path: str | None) -> None:
    """Every report and runner clause on the fixed workloads, the invalid inputs, then the generated traces."""
    from pytest_cbatch.impls import ImplementationError, resolve_impl
    from pytest_cbatch.runner import ALL_CLAUSES, Judge
    from pytest_cbatch.workloads import BASE_CONFIG, INVALID_INPUTS, WORKLOADS

    try:
        impl = resolve_impl(os.path.abspath(path))
    except ImplementationError as exc:
        _killed(f"the file does not load: {exc}")
    judge = Judge(impl)

    def check(clauses: tuple[str, ...], trace: list[dict[str, Any]], config: dict[str, Any], where: str) -> None:
        for cid in clauses:
            result = judge.judge(cid, trace, config)
            if result.status == "fail":
                _killed(f"{cid} on {where}: {result.violations[0].message if result.violations else ''}")
            if result.status == "skip" and cid == "completes":
                _killed(f"completes skipped on {where}: {result.reason}")

    report_clauses = tuple(c for c in ALL_CLAUSES if c != "invalid_input_refused")
    for name, w in WORKLOADS.items():
        check(report_clauses, list(w.trace), w.config, f"workload {name}")
    for name, (trace, overrides) in INVALID_INPUTS.items():
        result = judge.judge_refusal(trace, {**BASE_CONFIG, **overrides})
        if result.status != "pass":
            _killed(f"invalid_input_refused on {name}: {result.status}")
    if traces_path:
        with open(traces_path, encoding="utf-8") as fh:
            generated = json.load(fh)
        generated_clauses = tuple(c for c in report_clauses if c != "deterministic")  # as the suite's generated tests
        for i, (trace, config) in enumerate(generated):
            check(generated_clauses, trace, config, f"generated trace {i}")


def judge_faults(folder: str, max_examples: int, quick: int) -> None:
    """The recompute and transfer lifecycle machines, derandomized, no shrinking, stopping at the first failure.

    A quick round of ``quick`` examples per machine comes first (most mutants die in it), then the full
    ``max_examples``: a mutant survives only the full round.
    """
    from hypothesis import Phase, settings
    from hypothesis.stateful import run_state_machine_as_test

    from pytest_cbatch.impls import ImplementationError, resolve_impl
    from pytest_cbatch.lifecycle import MACHINES, lifecycle_settings, missing_parts

    try:
        namespace = resolve_impl(os.path.abspath(folder)).namespace
    except ImplementationError as exc:
        _killed(f"the folder does not load: {exc}")
    missing = missing_parts(namespace)
    parts = _parts_reaching_change(os.path.join(folder, "scheduler_faults.py"))
    for examples in dict.fromkeys(n for n in (quick, max_examples) if 0 < n <= max_examples):
        base = settings(max_examples=examples, derandomize=True, database=None, deadline=None,
                        phases=[Phase.explicit, Phase.generate], print_blob=False)
        for part in parts:
            if part in missing:
                _killed(f"lifecycle {part}: {missing[part]}")
            try:
                run_state_machine_as_test(MACHINES[part](namespace, frozenset()), settings=lifecycle_settings(base))
            except Exception as exc:  # a clause violation, or the implementation broke the machine itself
                first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
                _killed(f"lifecycle {part} ({examples} examples): {type(exc).__name__}: {first}")


def _parts_reaching_change(path: str) -> list[str]:
    """The lifecycle parts whose machine can reach the first line that differs from the shipped file.

    The recompute machine drives only PagedKV and RecomputeRequest, the transfer machine only PagedKV
    and TransferManager (with Transfer, ABORT_REASONS and _LIVE), so a change inside one of them
    leaves the other part exactly as it is on the shipped file, where it passes: not run.  A change
    anywhere else runs both.
    """
    import ast

    from pytest_cbatch.reference import scheduler_faults

    with open(scheduler_faults.__file__, encoding="utf-8") as fh:
        shipped = fh.read()
    with open(path, encoding="utf-8") as fh:
        judged = fh.read()
    changed = next((n for n, (a, b) in enumerate(zip(shipped.splitlines(), judged.splitlines()), 1) if a != b), 0)
    owner = {"RecomputeRequest": "recompute", "Transfer": "transfer", "TransferManager": "transfer",
             "ABORT_REASONS": "transfer", "_LIVE": "transfer"}
    for node in ast.parse(shipped).body:
        names = [node.name] if isinstance(node, ast.ClassDef) else [
            t.id for t in getattr(node, "targets", ()) if isinstance(t, ast.Name)]
        part = next((owner[n] for n in names if n in owner), None)
        if part and node.lineno <= changed <= (node.end_lineno or node.lineno):
            return [part]
    return list(LIFECYCLE_PARTS)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Run the conformance checks on one mutant; stop at the first failure.")
    sub = parser.add_subparsers(dest="target", required=True)
    sim = sub.add_parser("sim", help="judge a scheduler_sim.py (report and runner clauses)")
    sim.add_argument("path", help="the scheduler_sim.py to judge")
    sim.add_argument("--traces", metavar="JSON", help="the fixed generated traces: [[trace, config], ...]")
    faults = sub.add_parser("faults", help="judge the scheduler_faults.py of a folder (lifecycle clauses)")
    faults.add_argument("folder", help="a folder holding scheduler_faults.py and scheduler_sim.py")
    faults.add_argument("--max-examples", type=int, default=100, help="examples per machine (default: the ci profile's 100)")
    faults.add_argument("--quick", type=int, default=10, help="examples per machine in the quick first round (default 10)")
    for p in (sim, faults):
        p.add_argument("--budget", type=int, default=60, metavar="S", help="give up as timed out after S seconds of CPU time")
    args = parser.parse_args(argv)
    _watchdog(args.budget)
    if args.target == "sim":
        judge_sim(args.path, args.traces)
    else:
        judge_faults(args.folder, args.max_examples, args.quick)
    print("survived: every check passed", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
