"""Strict validation of workload traces and scheduler configs (standard library only).

A trace is a sequence of JSON objects, one per line in a JSONL file:

    {"time": 0, "event": "arrival", "id": "a", "prompt_tokens": 8, "output_tokens": 4}
    {"time": 2, "event": "cancel", "id": "a"}

Times are nonnegative integers, lengths positive integers, ids non-empty
strings unique across the trace; a cancel must name a request whose arrival
comes earlier in the trace at or before the cancel's time.  Unknown fields and
booleans standing in for integers are refused.  Every error is a ValueError
whose message starts with where it is (``trace[3]`` or ``file.jsonl line 4``)
and names the field.
"""

from __future__ import annotations

import json
from typing import Any, Iterable, Mapping, Sequence

__all__ = ["TRACE_FIELDS", "CONFIG_CHOICES", "validate_trace", "validate_config", "load_trace"]

TRACE_FIELDS: dict[str, tuple[str, ...]] = {
    "arrival": ("time", "event", "id", "prompt_tokens", "output_tokens"),
    "cancel": ("time", "event", "id"),
}

# name -> minimum for integer settings; a tuple of allowed values for the others
CONFIG_CHOICES: dict[str, Any] = {
    "capacity": 1,
    "block_size": 1,
    "token_budget": 1,
    "max_active": 1,
    "prefill_chunk": 1,
    "release_delay": 0,
    "policy": ("continuous", "serial"),
    "admission": ("reserve", "optimistic"),
}


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_line(line: Any, where: str) -> dict[str, Any]:
    if not isinstance(line, Mapping):
        raise ValueError(f"{where}: expected a JSON object, got {type(line).__name__}")
    kind = line.get("event")
    if not isinstance(kind, str) or kind not in TRACE_FIELDS:
        raise ValueError(f"{where}: event: must be 'arrival' or 'cancel', got {kind!r}")
    fields = TRACE_FIELDS[kind]
    unknown = sorted(set(line) - set(fields), key=str)
    if unknown:
        raise ValueError(f"{where}: unknown field {unknown[0]!r} in a {kind} line (allowed: {', '.join(fields)})")
    for name in fields:
        if name not in line:
            raise ValueError(f"{where}: {name}: missing from a {kind} line")
    if not _is_int(line["time"]) or line["time"] < 0:
        raise ValueError(f"{where}: time: must be a nonnegative integer, got {line['time']!r}")
    if not isinstance(line["id"], str) or not line["id"]:
        raise ValueError(f"{where}: id: must be a non-empty string, got {line['id']!r}")
    for name in ("prompt_tokens", "output_tokens"):
        if name in fields and (not _is_int(line[name]) or line[name] < 1):
            raise ValueError(f"{where}: {name}: must be a positive integer, got {line[name]!r}")
    return {name: line[name] for name in fields}


def validate_trace(
    events: Iterable[Mapping[str, Any]], labels: Sequence[str] | None = None
) -> list[dict[str, Any]]:
    """Check a trace and return fresh copies of its lines, stably sorted by time.

    ``labels`` optionally names where each line came from (for messages);
    the default is ``trace[i]``.  Raises ValueError on the first bad line.
    """
    if isinstance(events, (str, bytes, Mapping)):
        raise ValueError(f"trace: expected a sequence of event objects, got {type(events).__name__}")
    try:
        lines = list(events)
    except TypeError:
        raise ValueError(f"trace: expected a sequence of event objects, got {type(events).__name__}") from None
    checked = []
    for i, line in enumerate(lines):
        where = labels[i] if labels is not None else f"trace[{i}]"
        clean = _check_line(line, where)
        checked.append((clean["time"], i, clean, where))
    checked.sort(key=lambda item: (item[0], item[1]))
    arrived: dict[str, int] = {}
    out = []
    for _, _, line, where in checked:
        rid = line["id"]
        if line["event"] == "arrival":
            if rid in arrived:
                raise ValueError(f"{where}: id: duplicate request id {rid!r} (ids must be unique in a trace)")
            arrived[rid] = line["time"]
        elif rid not in arrived:
            raise ValueError(f"{where}: id: cancel names {rid!r}, which has no arrival at or before time {line['time']}")
        out.append(line)
    return out


def validate_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """Check scheduler settings; return a plain dict.  Unknown keys are refused."""
    unknown = sorted(set(config) - set(CONFIG_CHOICES))
    if unknown:
        raise ValueError(f"config: unknown setting {unknown[0]!r} (known: {', '.join(CONFIG_CHOICES)})")
    for name, rule in CONFIG_CHOICES.items():
        if name not in config:
            continue
        value = config[name]
        if isinstance(rule, tuple):
            if value not in rule or not isinstance(value, str):
                raise ValueError(f"config: {name}: must be one of {', '.join(rule)}, got {value!r}")
        elif not _is_int(value) or value < rule:
            kind = "positive" if rule == 1 else "nonnegative"
            raise ValueError(f"config: {name}: must be a {kind} integer, got {value!r}")
    return dict(config)


def load_trace(path: str) -> list[dict[str, Any]]:
    """Read and validate a JSONL workload; errors name the file and line number."""
    lines: list[Any] = []
    labels: list[str] = []
    with open(path, "rb") as fh:
        for number, raw in enumerate(fh, start=1):
            where = f"{path} line {number}"
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise ValueError(f"{where}: not UTF-8 text (byte {exc.start + 1})") from None
            if not text.strip():
                continue
            try:
                lines.append(json.loads(text))
            except json.JSONDecodeError as exc:
                raise ValueError(f"{where}: invalid JSON: {exc.msg} (column {exc.colno})") from None
            labels.append(where)
    return validate_trace(lines, labels)
