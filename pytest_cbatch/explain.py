"""Failure text for a person in a hurry: the clause, what broke where, the trace,
a compact timeline of the requests involved, and one command that replays it."""

from __future__ import annotations

import json
import shlex
from typing import Any, Mapping, Sequence

from . import untrusted
from .contract import CLAUSES, RUNNER_CLAUSES, Violation
from .words import counted

__all__ = ["explain_failure", "replay_command", "stack_lines", "timeline", "trace_jsonl", "clause_statement"]

MAX_VIOLATIONS = 8
MAX_TIMELINES = 4


def clause_statement(cid: str) -> str:
    from .runner import COMPLETES_STATEMENT

    found = CLAUSES.get(cid) or RUNNER_CLAUSES.get(cid)
    return found.statement if found else COMPLETES_STATEMENT


def trace_jsonl(trace: Sequence[Mapping[str, Any]]) -> str:
    """The trace as JSONL text, one compact object per line."""
    return "".join(json.dumps(dict(line)) + "\n" for line in trace)


def replay_command(spec: str, trace_path: str, config: Mapping[str, Any], clause: str | None = None) -> str:
    """The ``cbatch check`` command line that reruns this trace and config."""
    argv = ["cbatch", "check", "--impl", spec, "--trace", trace_path]
    if clause == "invalid_input_refused":  # the settings may be invalid on purpose: pass them as they are
        argv += ["--config-json", json.dumps(dict(config), separators=(",", ":"))]
    else:
        for key, value in config.items():
            argv += [f"--{key.replace('_', '-')}", str(value)]
    if clause:
        argv += ["--clause", clause]
    return " ".join(shlex.quote(a) for a in argv)


def timeline(report: Mapping[str, Any], rid: str, limit: int = 24) -> str:
    """One line of what happened to request ``rid``, runs of decode rows folded."""
    parts: list[str] = []
    decode_from: int | None = None
    decode_to = 0
    decode_n = 0

    def flush() -> None:
        nonlocal decode_from, decode_n
        if decode_from is not None:
            span = f"t={decode_from}" if decode_from == decode_to else f"t={decode_from}..{decode_to}"
            parts.append(f"{span} decode x{decode_n}")
            decode_from, decode_n = None, 0

    for ev in _objects(report.get("events") if isinstance(report, dict) else None):  # a report may fail its schema
        kind = ev.get("event")
        t = ev.get("time")
        if kind == "dispatch":
            for row in _objects(ev.get("work")):
                if row.get("id") != rid:
                    continue
                if row.get("phase") == "decode":
                    if decode_from is None:
                        decode_from = t
                    decode_to = t
                    decode_n += 1
                else:
                    flush()
                    parts.append(f"t={t} {row.get('phase')} {row.get('input_tokens')}")
        elif ev.get("id") == rid and kind not in ("token",):
            flush()
            extra = {k: v for k, v in ev.items() if k not in ("time", "event", "id")}
            detail = " " + " ".join(f"{k}={v}" for k, v in extra.items()) if extra else ""
            parts.append(f"t={t} {kind}{detail}")
        elif ev.get("id") == rid:
            flush()
            parts.append(f"t={t} token#{ev.get('output_index')}")
    flush()
    if len(parts) > limit:
        parts = parts[: limit // 2] + [f"... {len(parts) - limit} more ..."] + parts[-(limit // 2):]
    return f"{rid}: " + " | ".join(parts) if parts else f"{rid}: (no events)"


def _objects(items: Any) -> list[dict[str, Any]]:
    """The JSON objects in ``items`` when it is a list (a report that fails schema_valid still gets a timeline)."""
    return [item for item in items if isinstance(item, dict)] if isinstance(items, list) else []


def stack_lines(stack: str, stopped: bool) -> list[str]:
    """The implementation's traceback (a crash), its stack when it was stopped, or a program's stderr (a stack
    that starts with ``kinds.command.STDERR_HEADING``), under a title saying which, as indented lines."""
    from .kinds.command import STDERR_HEADING

    if not stack.strip():
        return []
    title = ("its stack when it was stopped (most recent call last):" if stopped
             else "traceback of the implementation (most recent call last):")
    if stack.startswith(STDERR_HEADING + "\n"):   # a program's refusal: its stderr, no Python traceback
        title, stack = STDERR_HEADING, stack[len(STDERR_HEADING) + 1:]
    return ["  " + title] + ["  " + line for line in stack.rstrip("\n").splitlines()]


def explain_failure(
    *,
    spec: str,
    clause: str,
    workload: str,
    violations: Sequence[Violation],
    trace: Sequence[Mapping[str, Any]],
    config: Mapping[str, Any],
    report: Mapping[str, Any] | None,
    trace_path: str,
    shrunk_from: int | None = None,
    replay_spec: str | None = None,
    stack: str = "",
    stopped: bool = False,
) -> str:
    """The full failure text: clause, violations, the implementation's stack, config, trace, timelines, replay.

    ``replay_spec`` is the SPEC the replay command names (a file's absolute path, say), default ``spec``;
    ``stack`` is the implementation's traceback, or its stack when it was ``stopped`` for a limit.
    """
    lines = [f"[{clause}] failed on workload {workload!r} with --cbatch-impl={spec}",
             f"  clause: {clause_statement(clause)}"]
    for v in violations[:MAX_VIOLATIONS]:
        lines.append(f"  - {v}")
    if len(violations) > MAX_VIOLATIONS:
        lines.append(f"  ... {len(violations) - MAX_VIOLATIONS} more")
    lines += stack_lines(stack, stopped)
    lines.append(f"config: {json.dumps(dict(config))}")
    note = f", shrunk from {shrunk_from} lines" if shrunk_from and shrunk_from != len(trace) else ""
    lines.append(f"trace ({counted(len(trace), 'line')}{note}):")
    lines += ["  " + line for line in trace_jsonl(trace).splitlines()]
    if report is not None:
        involved = [v.request for v in violations if v.request]
        ids = list(dict.fromkeys(involved)) or [line["id"] for line in trace if line["event"] == "arrival"]
        lines.append("timeline:")
        lines += ["  " + timeline(report, rid) for rid in ids[:MAX_TIMELINES]]
    lines.append("replay:")
    lines.append("  " + replay_command(replay_spec or spec, trace_path, config, clause))
    # Messages, ids and stacks quote the implementation: on a terminal its control characters are escaped.
    return untrusted.text("\n".join(lines), None)
