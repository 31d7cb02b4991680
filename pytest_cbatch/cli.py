"""The ``cbatch`` command.

    cbatch simulate [options]                 run the reference scheduler (see --help)
    cbatch check --impl SPEC [--trace T] ...  run an implementation and check every clause
    cbatch check --report R.json [--trace T]  check a recorded report
    cbatch schema [NAME]                      list the schemas, or print one
    cbatch clauses                            the contract clause table
    cbatch impls                              installed implementations
    cbatch gpu [options]                      batched-vs-unbatched logits checks (needs torch)
    cbatch expect --from-junit R.xml [-o F]   write an expected-failures file from a run's failures
    cbatch grade SUBMISSIONS --out OUT        grade student submissions (Gradescope results.json, summary.csv)
    cbatch serve [--port N] [--backend ...]   the embedded OpenAI-compatible server (needs the live extra)
    cbatch load --concurrency 1 2 4 ...       load sweep with vLLM bench serve's metrics (live extra)
    cbatch invariance --max-batch N           batch-invariance sweep over HTTP (live extra)

``cbatch check`` exits 0 only when every clause holds, 1 when one is violated,
and 2 on bad input (unreadable files, invalid trace, unknown SPEC).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Sequence

__all__ = ["main"]


def _simulate(argv: list[str]) -> int:
    from .reference.scheduler_sim import main as sim_main

    return sim_main(argv, prog="cbatch simulate")


def _check_parser() -> argparse.ArgumentParser:
    from .reference.scheduler_sim import DEFAULT_CONFIG

    parser = argparse.ArgumentParser(prog="cbatch check", description="Check a scheduler against the contract.")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--impl", metavar="SPEC", help="run this implementation (same SPEC forms as --cbatch-impl)")
    source.add_argument("--report", metavar="JSON", help="check a recorded report instead of running anything")
    parser.add_argument("--trace", metavar="JSONL", help="the workload (default: the built-in demo trace)")
    parser.add_argument("--clause", action="append", metavar="ID", help="check only these clauses (repeatable)")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds per run of an exec: implementation")
    parser.add_argument("--tick-seconds", type=float, default=0.05,
                        help="seconds per trace tick against an http:// live server (default 0.05)")
    for name in ("capacity", "block_size", "token_budget", "max_active", "prefill_chunk", "release_delay"):
        parser.add_argument("--" + name.replace("_", "-"), dest=name, type=int, metavar="N",
                            help=f"default {DEFAULT_CONFIG[name]} (with --report: the report's own config)")
    parser.add_argument("--policy", choices=["continuous", "serial"])
    parser.add_argument("--admission", choices=["reserve", "optimistic"])
    return parser


def _check(argv: list[str]) -> int:
    from .contract import CLAUSES, check_report, clause_ids, unobservable
    from .explain import timeline
    from .impls import ImplementationError, resolve_impl
    from .reference.scheduler_sim import demo_trace, load_trace, validate_trace
    from .runner import ALL_CLAUSES, Judge
    from .workloads import BASE_CONFIG

    args = _check_parser().parse_args(argv)
    wanted = args.clause or None
    unknown = [c for c in wanted or () if c not in ALL_CLAUSES]
    if unknown:
        print(f"error: unknown clause {unknown[0]!r}; known: {', '.join(clause_ids())}", file=sys.stderr)
        return 2
    given = {k: getattr(args, k) for k in (*BASE_CONFIG, "admission") if getattr(args, k) is not None}
    try:
        trace = load_trace(args.trace) if args.trace else validate_trace(demo_trace())
        if args.report:
            try:
                with open(args.report, encoding="utf-8") as fh:
                    report = json.load(fh)
            except ValueError as exc:  # invalid JSON or not UTF-8
                raise ValueError(f"{args.report}: not a JSON report: {exc}") from None
            if not isinstance(report, dict):
                raise ValueError(f"{args.report}: a report is a JSON object, got {type(report).__name__}")
            violations = check_report(report, trace, given, clauses=wanted)
            checked = []
            for cid in wanted or clause_ids():
                if cid not in CLAUSES:
                    continue
                hidden = unobservable(cid, report)
                if hidden:
                    print(f"skip  {cid}: {hidden}")
                else:
                    checked.append(cid)
        else:
            impl = resolve_impl(args.impl, timeout=args.timeout, tick_seconds=args.tick_seconds)
            config = {**BASE_CONFIG, **given}
            judge = Judge(impl)
            violations, checked, report = [], [], None
            for cid in wanted or ALL_CLAUSES:
                if cid == "invalid_input_refused":
                    continue
                result = judge.judge(cid, trace, config)
                if result.status == "skip":
                    print(f"skip  {cid}: {result.reason}")
                    continue
                checked.append(cid)
                violations += result.violations
                report = result.report or report
    except (OSError, ValueError, ImplementationError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    failed = sorted({v.clause for v in violations})
    for v in violations:
        print(v)
    if violations and isinstance(report, dict):
        involved = list(dict.fromkeys(v.request for v in violations if v.request))[:4]
        for rid in involved:
            print("  " + timeline(report, rid))
    if failed:
        print(f"FAILED: {len(failed)} of {len(checked)} clauses violated: {', '.join(failed)}")
        return 1
    print(f"OK: all {len(checked)} clauses hold")
    return 0


def _schema(argv: list[str]) -> int:
    from .schemas import SCHEMA_NAMES, load_schema

    parser = argparse.ArgumentParser(prog="cbatch schema", description="List the schemas or print one.")
    parser.add_argument("name", nargs="?", help="one of: " + ", ".join(SCHEMA_NAMES))
    args = parser.parse_args(argv)
    if args.name is None:
        print("\n".join(SCHEMA_NAMES))
        return 0
    try:
        print(json.dumps(load_schema(args.name), indent=2))
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


def clause_table() -> str:
    """The README's clause table (markdown), generated from the registry so the two never drift."""
    from .contract import CLAUSES, RUNNER_CLAUSES
    from .runner import COMPLETES_STATEMENT

    def cell(text: str) -> str:
        return text.replace("|", "\\|") or "—"

    rows = ["| id | statement | admits (legitimate choices it allows) | why |", "|---|---|---|---|",
            f"| `completes` | {COMPLETES_STATEMENT} | — | Everything else is judged on the report; a crash or a refusal "
            f"of valid input fails here, once. |"]
    for c in list(CLAUSES.values()) + list(RUNNER_CLAUSES.values()):
        rows.append(f"| `{c.id}` | {cell(c.statement)} | {cell(c.admits)} | {cell(c.why)} |")
    return "\n".join(rows) + "\n"


def _clauses(argv: list[str]) -> int:
    from .contract import CLAUSES, RUNNER_CLAUSES
    from .runner import COMPLETES_STATEMENT

    parser = argparse.ArgumentParser(prog="cbatch clauses", description="Print the contract clause table.")
    parser.add_argument("--markdown", action="store_true", help="the README's markdown table, with admits and why")
    args = parser.parse_args(argv)
    if args.markdown:
        sys.stdout.write(clause_table())
        return 0
    print(f"completes: {COMPLETES_STATEMENT}")
    for c in list(CLAUSES.values()) + list(RUNNER_CLAUSES.values()):
        print(f"{c.id}: {c.statement}")
    return 0


def _impls(argv: list[str]) -> int:
    from .impls import available_impls

    argparse.ArgumentParser(prog="cbatch impls", description="List installed implementations.").parse_args(argv)
    for name, target in sorted(available_impls().items()):
        print(f"{name} = {target}")
    return 0


def _gpu(argv: list[str]) -> int:
    try:
        from .gpu_checks.cli import main as gpu_main
    except ImportError as exc:
        print(f"error: cbatch gpu needs torch ({exc}); pip install 'pytest-cbatch[gpu]'", file=sys.stderr)
        return 2
    return gpu_main(argv, prog="cbatch gpu")


def _grade(argv: list[str]) -> int:
    from .grading.driver import main as grade_main

    return grade_main(argv)


def _expect(argv: list[str]) -> int:
    from .expect import ExpectError, entries_from_junit, render_toml

    parser = argparse.ArgumentParser(prog="cbatch expect",
                                     description="Write an expected-failures file (--cbatch-expect) from a run.")
    parser.add_argument("--from-junit", metavar="XML", required=True,
                        help="JUnit XML of a pytest --cbatch-impl run (pytest --junitxml=...)")
    parser.add_argument("-o", "--output", metavar="TOML", help="write here instead of stdout")
    parser.add_argument("--strict", action="store_true", help="write strict = true into the file")
    args = parser.parse_args(argv)
    try:
        entries = entries_from_junit(args.from_junit)
    except ExpectError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    text = render_toml(entries, source=args.from_junit, strict=args.strict)
    if args.output:
        with open(args.output, "w", encoding="utf-8") as fh:
            fh.write(text)
        print(f"{len(entries)} expected failure(s) -> {args.output}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


def _live(name: str) -> Any:
    """A live-server command, imported only when used (a missing extra is one clear error)."""

    def run(argv: list[str]) -> int:
        try:
            from .live import cli as live_cli
        except ImportError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        return getattr(live_cli, f"{name}_main")(argv)

    return run


COMMANDS: dict[str, Any] = {
    "simulate": _simulate, "check": _check, "schema": _schema, "clauses": _clauses, "impls": _impls, "gpu": _gpu,
    "grade": _grade, "expect": _expect,
    "serve": _live("serve"), "load": _live("load"), "invariance": _live("invariance"),
}


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``cbatch`` console script."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0 if args else 2
    command = COMMANDS.get(args[0])
    if command is None:
        print(f"error: unknown command {args[0]!r}; one of: {', '.join(COMMANDS)}", file=sys.stderr)
        return 2
    return int(command(args[1:]))


if __name__ == "__main__":
    sys.exit(main())
