"""The ``cbatch`` command.

    cbatch simulate [options]                 run the reference scheduler (see --help)
    cbatch check --impl SPEC [--trace T] ...  run an implementation and check every clause
    cbatch check --report R.json [--trace T]  check a recorded report
    cbatch explain --impl SPEC [--trace T] --html OUT   draw a run as an HTML page (--lifecycle PART: a part)
    cbatch schema [NAME]                      list the schemas, or print one
    cbatch clauses                            the contract clause table
    cbatch impls                              installed implementations
    cbatch gpu [options]                      batched-vs-unbatched logits checks (needs torch)
    cbatch expect --from-junit R.xml [-o F]   write an expected-failures file from a run's failures
    cbatch grade SUBMISSIONS --out OUT        grade student submissions (Gradescope results.json, summary.csv)
    cbatch serve [--port N] [--backend ...]   the embedded OpenAI-compatible server (needs the live extra)
    cbatch load --concurrency 1 2 4 ...       load sweep with vLLM bench serve's metrics (live extra)
    cbatch invariance --max-batch N           batch-invariance sweep over HTTP (live extra)

``cbatch check`` exits 0 only when every clause it judged holds and it judged one, 1 when one is
violated or nothing was judged, and 2 on bad input (unreadable files, invalid trace, unknown SPEC or
setting, a limit that is not a finite number >= 0).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, Sequence

from .words import counted

__all__ = ["main"]


def _simulate(argv: list[str]) -> int:
    from .reference.scheduler_sim import main as sim_main

    return sim_main(argv, prog="cbatch simulate")


_CHECK_DESCRIPTION = (
    "Check a scheduler against the contract: run an implementation on a trace (--impl), or check a report "
    "recorded elsewhere (--report). Exit 0 when every clause judged holds, 1 when one is violated or nothing was "
    "judged, 2 on bad input.")
_EXPLAIN_DESCRIPTION = (
    "Draw one checked run as a self-contained HTML page (--html OUT, required): a lane per request, the KV pages, "
    "each violation marked. The run is cbatch check's: an implementation on a trace (--impl) or a recorded report "
    "(--report), with the same options; the clauses are judged and printed as cbatch check prints them, with the "
    "same exit status.")
_EXPLAIN_EPILOG = (
    "A lifecycle part instead: cbatch explain --impl SPEC --lifecycle PART --html OUT [--examples N] "
    "[--timeout SECONDS] judges PART (allocator, recompute or transfer) and draws each failing clause's steps "
    "(see cbatch explain --lifecycle PART --help).")


def _check_parser(prog: str = "cbatch check") -> argparse.ArgumentParser:
    """The options of ``cbatch check``; for ``cbatch explain`` (``prog``), its own description and a required
    ``--html``."""
    from .bounded import DEFAULT_MEMORY_MIB, DEFAULT_SECONDS
    from .reference.scheduler_sim import DEFAULT_CONFIG

    explain = prog == "cbatch explain"
    parser = argparse.ArgumentParser(
        prog=prog, formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        description=_EXPLAIN_DESCRIPTION if explain else _CHECK_DESCRIPTION, epilog=_EXPLAIN_EPILOG if explain else None)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--impl", metavar="SPEC", help="run this implementation (same SPEC forms as --cbatch-impl)")
    source.add_argument("--report", metavar="JSON", help="check a recorded report instead of running anything "
                                                         "(needs --trace unless it is a report of the demo trace)")
    parser.add_argument("--trace", metavar="JSONL", help="the workload (with --impl, default: the built-in demo trace)")
    parser.add_argument("--clause", action="append", metavar="ID", help="check only these clauses (repeatable)")
    parser.add_argument("--course", action="store_true",
                        help="also check clause course_results: the exact results the course states and its "
                             "published simulator gives, under reserve admission (for a course assignment; an "
                             "engine's policy differs by design)")
    parser.add_argument("--timeout", type=_limit("--timeout", "seconds"), default=DEFAULT_SECONDS, metavar="SECONDS",
                        help="time limit of one run of the implementation (in process or exec:); 0: none")
    parser.add_argument("--memory", type=_limit("--memory", "MiB"), default=DEFAULT_MEMORY_MIB, metavar="MIB",
                        help="how much one in-process run may grow this process's memory, in MiB; 0: no limit")
    parser.add_argument("--tick-seconds", type=float, default=0.05, metavar="SECONDS",
                        help="seconds per trace tick against an http:// live server")
    parser.add_argument("--model", metavar="NAME",
                        help="the model an http:// live server is asked for (default: the one /v1/models lists; "
                             "needed when it lists none or several)")
    for name in ("capacity", "block_size", "token_budget", "max_active", "prefill_chunk", "release_delay"):
        parser.add_argument("--" + name.replace("_", "-"), dest=name, type=int, metavar="N",
                            help=f"default {DEFAULT_CONFIG[name]} (with --report: the report's own config)")
    parser.add_argument("--policy", choices=["continuous", "serial"], help="default continuous")
    parser.add_argument("--admission", choices=["reserve", "optimistic"], help="default reserve")
    parser.add_argument("--config-json", metavar="JSON", help="settings as a JSON object, over the flags, passed "
                        "as they are (with --clause invalid_input_refused: an invalid config to be refused; "
                        "otherwise an unknown setting is a usage error)")
    parser.add_argument("--honour-claims", action="store_true",
                        help="with --report: the report comes from a live server's client or an engine adapter "
                             "registered with the kit, so its 'observed', 'time_unit' and 'server.ignore_eos' "
                             "narrow what is judged (without it they are schema_valid violations and every clause "
                             "is judged)")
    if explain:
        parser.add_argument("--html", metavar="OUT", required=True, help="the page to write (open it in a browser)")
    else:
        parser.add_argument("--html", metavar="OUT", help="also draw the run as a self-contained HTML page: a lane "
                            "per request, the KV pages, each violation marked (cbatch explain does only that)")
    return parser


def _limit(option: str, unit: str) -> Any:
    """An argparse type for a limit: a finite number >= 0 (see ``bounded.parse_limit``)."""
    from .bounded import parse_limit

    def parse(text: str) -> float:
        try:
            return parse_limit(text, option, unit)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return parse


def _raw_trace(path: str) -> list[Any]:
    """The JSONL lines of ``path`` as they are, unvalidated: the input of an invalid_input_refused replay."""
    with open(path, encoding="utf-8") as fh:
        lines = [line for line in fh if line.strip()]
    from .plain import loads

    try:
        return [loads(line) for line in lines]
    except ValueError as exc:
        raise ValueError(f"{path}: not JSON lines: {exc}") from None


def _check_refusal(args: argparse.Namespace, impl: Any, config: dict[str, Any]) -> int:
    """Replay of clause invalid_input_refused: the implementation must refuse this (invalid) input."""
    from .reference.scheduler_sim import demo_trace
    from .explain import stack_lines
    from .runner import Judge

    trace = _raw_trace(args.trace) if args.trace else demo_trace()
    print(f"trace: {args.trace or 'the built-in demo trace'} ({counted(len(trace), 'line')}, not validated: "
          f"invalid input is the point)")
    result = Judge(impl).judge_refusal(trace, config)
    for v in result.violations:
        print(v)
    for line in stack_lines(result.stack, result.stopped):
        print(line)
    if result.status == "skip":
        print(f"skip  invalid_input_refused: {result.reason}")
        print("FAILED: nothing judged: the implementation did not answer the invalid input")
        return 1
    if result.status == "fail":
        print("FAILED: 1 of 1 clauses violated: invalid_input_refused")
        return 1
    print(f"OK: the invalid input was refused ({result.reason})")
    return 0


def _invalid_setting(config: dict[str, Any]) -> str | None:
    """What makes ``config`` invalid by the trace format (a setting with a fraction, below its minimum, of
    an unknown choice), or None."""
    from .reference.scheduler_sim import validate_config

    try:
        validate_config(config)
    except ValueError as exc:
        return str(exc)
    return None


def _report_trace_mismatch(report: dict[str, Any], trace: Sequence[dict[str, Any]]) -> str | None:
    """Why ``report`` is not a report of ``trace`` (its requests are other ids), or None."""
    requests = report.get("requests")
    if not isinstance(requests, dict):
        return None  # schema_valid says what is wrong with it
    ids = {line["id"] for line in trace if line["event"] == "arrival"}
    extra, missing = sorted(set(requests) - ids), sorted(ids - set(requests))
    if not extra and not missing:
        return None

    def few(names: list[str]) -> str:
        return ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")

    parts = [f"has {len(extra)} request id(s) the trace never sends ({few(extra)})" if extra else "",
             f"lacks {len(missing)} of the trace's ({few(missing)})" if missing else ""]
    return "the report " + " and ".join(p for p in parts if p)


def _check(argv: list[str], prog: str = "cbatch check") -> int:
    from .contract import CLAUSES, check_report, clause_ids, out_of_scope, unobservable
    from .explain import stack_lines, timeline
    from .impls import ImplementationError, resolve_impl
    from .contract import CLAIMS
    from .plain import NotPlain, loads, plain
    from .reference.scheduler_sim import CONFIG_CHOICES, demo_trace, load_trace, validate_trace
    from .runner import ALL_CLAUSES, OPT_IN_CLAUSES, Judge, judged_clauses
    from .spelling import unknown_name
    from .workloads import BASE_CONFIG

    parser = _check_parser(prog)
    args = parser.parse_args(argv)
    wanted = args.clause or None
    opt_in = OPT_IN_CLAUSES if args.course else ()
    unknown = [c for c in wanted or () if c not in judged_clauses(OPT_IN_CLAUSES)]
    if unknown:
        print(f"error: unknown clause {unknown[0]!r}; known: {', '.join(clause_ids(OPT_IN_CLAUSES))}",
              file=sys.stderr)
        return 2
    given = {k: getattr(args, k) for k in (*BASE_CONFIG, "admission") if getattr(args, k) is not None}
    if args.config_json:
        try:
            extra = loads(args.config_json)
        except NotPlain as exc:
            print(f"error: --config-json: {exc.problem if not exc.path else exc}", file=sys.stderr)
            return 2
        if not isinstance(extra, dict):
            print("error: --config-json: a JSON object of settings, e.g. '{\"capacity\": 0}'", file=sys.stderr)
            return 2
        given.update(extra)
    try:
        plain(given)
    except NotPlain as exc:
        print(f"error: setting {exc.path[1:]}: {exc.problem}", file=sys.stderr)
        return 2
    if wanted and "invalid_input_refused" in wanted and (len(set(wanted)) > 1 or args.report):
        print("error: --clause invalid_input_refused is checked alone, with --impl (its input is invalid on "
              "purpose)", file=sys.stderr)
        return 2
    unknown_key = next((k for k in given if k not in CONFIG_CHOICES), None)
    if unknown_key is not None and not (wanted and "invalid_input_refused" in wanted):
        print(f"error: --config-json: {unknown_name('setting', unknown_key, CONFIG_CHOICES)}", file=sys.stderr)
        return 2
    if args.honour_claims and not args.report:
        print("error: --honour-claims is for --report; with --impl the implementation's kind decides",
              file=sys.stderr)
        return 2
    refusal = bool(wanted and "invalid_input_refused" in wanted)
    invalid = None if refusal or args.report else _invalid_setting({**BASE_CONFIG, **given})
    if invalid:  # as invalid_input_refused judges it: a refusal is the answer, never "no report for a valid workload"
        print(f"note: {invalid}; the trace format calls that config invalid, so this run is judged as clause "
              f"invalid_input_refused (the implementation must refuse it)")
    skipped: dict[str, list[str]] = {}
    stack, stopped = "", False
    try:
        if refusal or invalid:
            if args.html:
                print("note: no picture of invalid_input_refused: its input is refused before any schedule exists")
            return _check_refusal(args, resolve_impl(args.impl, bounds=_check_bounds(args, argv),
                                                     tick_seconds=args.tick_seconds, model=args.model,
                                                     option="--impl"),
                                  {**BASE_CONFIG, **given})
        trace = load_trace(args.trace) if args.trace else validate_trace(demo_trace())
        trace_name = f"{args.trace} ({counted(len(trace), 'line')})" if args.trace else \
            f"the built-in demo trace ({counted(len(trace), 'line')}; cbatch simulate prints its report)"
        if args.report:
            try:
                with open(args.report, "rb") as fh:
                    report = loads(fh.read())
            except ValueError as exc:  # not UTF-8, not JSON, or not plain, bounded data (NotPlain)
                raise ValueError(f"{args.report}: not a JSON report: {exc}") from None
            if not isinstance(report, dict):
                raise ValueError(f"{args.report}: a report is a JSON object, got {type(report).__name__}")
            mismatch = _report_trace_mismatch(report, trace)
            if mismatch:
                hint = ("give --trace T.jsonl, the trace the report was made from" if not args.trace else
                        "is it the trace the report was made from?")
                raise ValueError(f"{args.report} is not a report of {trace_name}: {mismatch}; {hint}")
            print(f"trace: {trace_name}")
            given = {**_recorded_settings(report), **given}   # the flags' default: the report's own config
            honoured = CLAIMS if args.honour_claims else frozenset()
            violations = check_report(report, trace, given, clauses=wanted, opt_in=opt_in, honoured=honoured,
                                      claimant=f"a recorded report ({args.report}) unless --honour-claims says "
                                               f"where it comes from")
            checked = []
            for cid in wanted or clause_ids(opt_in):
                if cid not in CLAUSES:
                    continue
                hidden = unobservable(cid, report, honoured) or out_of_scope(cid, given)
                if hidden:
                    skipped.setdefault(hidden, []).append(cid)
                else:
                    checked.append(cid)
        else:
            impl = resolve_impl(args.impl, bounds=_check_bounds(args, argv), tick_seconds=args.tick_seconds,
                                model=args.model, option="--impl")
            print(f"trace: {trace_name}")
            config = {**BASE_CONFIG, **given}
            judge = Judge(impl)
            violations, checked, report = [], [], None
            for cid in wanted or judged_clauses(opt_in):
                if cid == "invalid_input_refused":
                    continue
                result = judge.judge(cid, trace, config)
                if result.status == "skip":
                    skipped.setdefault(result.reason, []).append(cid)
                    continue
                checked.append(cid)
                violations += result.violations
                stack, stopped = stack or result.stack, stopped or result.stopped
                report = result.report or report
    except (OSError, ValueError, ImplementationError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    failed = sorted({v.clause for v in violations})
    if args.html:
        print(_draw(args.html, argv, trace, report, violations, checked))
    for v in violations:
        print(v)
    for line in stack_lines(stack, stopped):
        print(line)
    if violations and isinstance(report, dict):
        involved = list(dict.fromkeys(v.request for v in violations if v.request))[:4]
        for rid in involved:
            print("  " + timeline(report, rid))
    for reason, clauses in skipped.items():  # one line per reason: a crash does not bury itself under 32 skips
        print(f"skip  {clauses[0]}: {reason}" if len(clauses) == 1 else
              f"skip  {len(clauses)} clauses ({_few(clauses)}): {reason}")
    unjudged = [c for c in wanted or ALL_CLAUSES if c not in checked and not any(c in v for v in skipped.values())]
    if unjudged:  # not run by this command at all: say so, so the counts add up to the contract's
        print(f"not judged from a recorded report: {', '.join(unjudged)} (they run the implementation: use --impl)"
              if args.report else f"not judged in this run: {', '.join(unjudged)} (its input is invalid on purpose: "
                                  f"check it alone with --clause invalid_input_refused)")
    scope = (f"of the {len(wanted)} clauses asked for" if wanted else f"of the contract's {len(ALL_CLAUSES)} clauses"
             + (f" and {len(opt_in)} opt-in: {', '.join(opt_in)}" if opt_in else ""))
    if failed:
        print(f"FAILED: {len(failed)} of the {len(checked)} clauses judged ({scope}) violated: {', '.join(failed)}")
        return 1
    if not checked:
        print(f"FAILED: nothing judged: none {scope} was judged on this trace (the skip lines above say why); "
              f"a run that judged nothing proves nothing")
        return 1
    print(f"OK: all {len(checked)} clauses judged ({scope}) hold")
    return 0


def _recorded_settings(report: dict[str, Any]) -> dict[str, Any]:
    """The valid scheduler settings a recorded report's config names (what ``--report`` checks it against
    where no flag says otherwise); schema_valid judges the others."""
    from .reference.scheduler_sim import validate_config

    config = report.get("config")
    out = {}
    for key, value in config.items() if isinstance(config, dict) else ():
        try:
            out.update(validate_config({key: value}))
        except ValueError:
            continue
    return out
def _draw(out: str, argv: Sequence[str], trace: Sequence[dict[str, Any]], report: Any,
          violations: Sequence[Any], checked: Sequence[str]) -> str:
    """Write the page of one checked run to ``out``; the line that names it."""
    import shlex

    from .picture import schedule_page

    failed = sorted({v.clause for v in violations})
    statement = (f"{len(failed)} of {len(checked)} clauses violated: {', '.join(failed)}" if failed else
                 f"all {len(checked)} clauses checked hold")
    rest = [a for i, a in enumerate(argv) if a != "--html" and not a.startswith("--html=")
            and (i == 0 or argv[i - 1] != "--html")]
    page = schedule_page(heading=f"cbatch explain: {statement}", lead=f"{counted(len(trace), 'trace line')}, {statement}",
                         report=report if isinstance(report, dict) else None, violations=violations, trace=trace,
                         replay="cbatch check " + " ".join(shlex.quote(a) for a in rest))
    with open(out, "w", encoding="utf-8") as fh:
        fh.write(page)
    return f"picture: {os.path.abspath(out)} (open it in a browser)"


def _explain(argv: list[str]) -> int:
    """``cbatch explain``: ``cbatch check --html OUT`` for a trace, or a lifecycle part's page (``--lifecycle``)."""
    if "--lifecycle" in argv or any(a.startswith("--lifecycle=") for a in argv):
        return _explain_lifecycle(argv)
    if not any(a == "--html" or a.startswith("--html=") for a in argv) and not {"-h", "--help"} & set(argv):
        print("error: cbatch explain needs --html OUT (the page to write); cbatch check prints the text alone",
              file=sys.stderr)
        return 2
    return _check(argv, prog="cbatch explain")


def _explain_lifecycle(argv: list[str]) -> int:
    import shlex

    from .impls import ImplementationError, resolve_impl
    from .lifecycle import PARTS, lifecycle_verdicts, missing_parts
    from .picture import lifecycle_page

    parser = argparse.ArgumentParser(prog="cbatch explain --lifecycle",
                                     description="Judge one lifecycle part and draw its failing clauses' step "
                                                 "scripts (the failing step marked, the pool after each step).")
    parser.add_argument("--impl", metavar="SPEC", required=True, help="the implementation (as --cbatch-impl)")
    parser.add_argument("--lifecycle", metavar="PART", required=True, choices=list(PARTS), help="the part to judge")
    parser.add_argument("--html", metavar="OUT", required=True, help="the page to write")
    parser.add_argument("--timeout", type=float, default=60.0, metavar="SECONDS",
                        help="time limit of one example's calls into the implementation; 0: none")
    parser.add_argument("--examples", type=int, default=100, metavar="N",
                        help="Hypothesis examples per search (derandomized, as the ci profile)")
    args = parser.parse_args(argv)
    try:
        impl = resolve_impl(args.impl, option="--impl")
    except ImplementationError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    missing = missing_parts(impl.namespace).get(args.lifecycle)
    if missing:
        print(f"error: lifecycle {args.lifecycle}: {missing}", file=sys.stderr)
        return 2
    from hypothesis import settings

    from .bounded import Bounds

    profile = settings(max_examples=max(1, args.examples), derandomize=True, database=None, deadline=None)
    verdicts = lifecycle_verdicts(args.lifecycle, impl.namespace, profile,
                                  bounds=Bounds(seconds=args.timeout, time_option="--timeout"))
    failed = [(cid, v.message, v.steps) for cid, v in verdicts.items() if v.status == "fail"]
    rerun = "cbatch explain " + " ".join(shlex.quote(a) for a in ("--impl", args.impl, "--lifecycle", args.lifecycle,
                                                                   "--examples", str(args.examples), "--html", args.html))
    with open(args.html, "w", encoding="utf-8") as fh:
        fh.write(lifecycle_page(heading=f"lifecycle {args.lifecycle}: {len(failed)} of {len(verdicts)} clauses "
                                        f"fail with {args.impl}", failures=failed, rerun=rerun))
    for cid, v in verdicts.items():
        print(f"{v.status:5} {cid}" + (f": {v.message.splitlines()[0]}" if v.status != "pass" else ""))
    print(f"picture: {os.path.abspath(args.html)} (open it in a browser)")
    return 1 if failed or any(v.status == "error" for v in verdicts.values()) else 0


def _check_bounds(args: argparse.Namespace, argv: Sequence[str]) -> Any:
    """The limits of ``cbatch check``'s runs; those the user left at their default may be the module's own."""
    from .bounded import Bounds

    left = frozenset(field for flag, field in (("--timeout", "seconds"), ("--memory", "memory_mib"))
                     if not any(a == flag or a.startswith(flag + "=") for a in argv))
    return Bounds(seconds=args.timeout, memory_mib=args.memory, time_option="--timeout", memory_option="--memory",
                  defaults=left)


def _few(names: Sequence[str], n: int = 3) -> str:
    return ", ".join(names[:n]) + (f", ... {len(names) - n} more" if len(names) > n else "")


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
    """The clause table of docs/contract.md (markdown), generated from the registry so the two never drift."""
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
    parser.add_argument("--markdown", action="store_true", help="the markdown table of docs/contract.md, with admits and why")
    args = parser.parse_args(argv)
    if args.markdown:
        sys.stdout.write(clause_table())
        return 0
    default = [c for c in CLAUSES.values() if not c.opt_in]
    opt_in = [c for c in CLAUSES.values() if c.opt_in]
    contract = 1 + len(default) + len(RUNNER_CLAUSES)
    print(f"# {contract + len(opt_in)} clauses: the contract's {contract} (completes, {len(default)} judged on the "
          f"report, {len(RUNNER_CLAUSES)} that watch the implementation itself)"
          + (f", then {len(opt_in)} opt-in, judged only when asked for" if opt_in else ""))
    print(f"completes: {COMPLETES_STATEMENT}")
    for c in default + list(RUNNER_CLAUSES.values()) + opt_in:
        print(f"{c.id}: {c.statement}" + (" (opt-in)" if c.opt_in else ""))
        if c.id == "course_results":
            from .contract.course import PUBLISHED_SCHEDULE

            print("  the published simulator's schedule, rule by rule:")
            for n, rule in enumerate(PUBLISHED_SCHEDULE, 1):
                print(f"  {n}. {rule}")
    return 0


def _impls(argv: list[str]) -> int:
    from importlib.metadata import entry_points

    from .impls import KIND_GROUP, ImplementationError, available_impls, available_kinds

    parser = argparse.ArgumentParser(prog="cbatch impls", description="List installed implementations.")
    parser.add_argument("--kinds", action="store_true",
                        help=f"list the SPEC forms instead: the kinds registered in {KIND_GROUP}, in the order "
                             f"they are asked")
    if not parser.parse_args(argv).kinds:
        for name, target in sorted(available_impls().items()):
            print(f"{name} = {target}")
        return 0
    try:
        kinds = available_kinds()
    except ImplementationError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    targets = {ep.name: ep.value for ep in entry_points(group=KIND_GROUP)}
    for name, kind in kinds:
        print(f"{kind.order:>4} {name} = {targets[name]}" + (f"  ({kind.form})" if kind.form else ""))
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


COMMANDS: dict[str, tuple[Any, str]] = {
    "simulate": (_simulate, "run the reference scheduler on a trace and print its report"),
    "check": (_check, "check an implementation (--impl) or a recorded report (--report) against the contract"),
    "explain": (_explain, "draw a run (cbatch check's options, --html OUT) or a lifecycle part (--lifecycle PART) "
                          "as an HTML page"),
    "schema": (_schema, "list the JSON schemas, or print one"),
    "clauses": (_clauses, "print the contract clause table"),
    "impls": (_impls, "list the installed implementations (entry points)"),
    "gpu": (_gpu, "batched-vs-unbatched logits checks on a real transformer (needs torch)"),
    "grade": (_grade, "grade student submissions (Gradescope results.json, summary.csv)"),
    "expect": (_expect, "write an expected-failures file from a run's JUnit XML"),
    "serve": (_live("serve"), "serve the reference scheduler over an OpenAI-compatible API (live extra)"),
    "load": (_live("load"), "load sweep against a server, with vLLM bench serve's metrics (live extra)"),
    "invariance": (_live("invariance"), "batch-invariance sweep over HTTP (live extra)"),
}


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("pytest-cbatch")
    except PackageNotFoundError:
        return "unknown (not installed)"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="cbatch", description="Conformance kit for continuous-batching LLM schedulers.",
        epilog="Run 'cbatch COMMAND --help' for a command's options. The pytest plugin: "
               "pytest --cbatch-impl=SPEC (pytest --help, section pytest-cbatch).")
    parser.add_argument("--version", action="version", version=f"cbatch (pytest-cbatch) {_version()}")
    commands = parser.add_subparsers(title="commands", metavar="COMMAND")
    for name, (_, summary) in COMMANDS.items():
        commands.add_parser(name, help=summary, add_help=False)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``cbatch`` console script: exit 0 on success, 1 on a finding, 2 on bad usage."""
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        if not args:
            _parser().print_help(sys.stderr)
            return 2
        if args[0] not in COMMANDS:
            try:
                _parser().parse_args(args[:1])  # -h, --version, or argparse's error naming the commands
            except SystemExit as exc:
                return int(exc.code or 0)
            return 2
        return int(COMMANDS[args[0]][0](args[1:]))
    except BrokenPipeError:  # the reader went away (cbatch clauses | head -1): not an error of ours
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # so the interpreter's final flush does not fail again
        return 0


if __name__ == "__main__":
    sys.exit(main())
