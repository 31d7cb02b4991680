"""The lines of a searched lifecycle part (see ``search``): how the sandbox child writes each request with
its answer, and how the grader reads them back, checking that each is the request it makes.

Reads, the most requests by far, and method calls go short; the JSON the grader decodes is most of what a
searched part costs it beyond its own search: ``{"g": [handle, name, value, flags]}`` for a read whose reply
is only a value, ``{"g": [handle, name, reply]}`` for any other read, ``{"c": [handle, method, args, kwargs,
reply]}`` for a method call on an object, and ``{"rec": [request, reply]}`` for the rest (a mirrored step's
lines are all ``rec``).
"""

from __future__ import annotations

from typing import Any

__all__ = ["read_line", "read_reply", "reply_to", "request_line"]

_VALUE_ONLY = frozenset({"ok", "plain", "raw"})
_CALL_KEYS = frozenset({"op", "target", "method", "args", "kwargs"})


def read_line(handle: int, name: str, reply: dict[str, Any]) -> dict[str, Any]:
    """A search's line for a read: ``{"g": [handle, name, value, flags]}`` when the reply holds only a value
    (flags: 1 plain, 2 raw; ``read_reply`` reads it back), else ``{"g": [handle, name, reply]}``."""
    if reply.keys() <= _VALUE_ONLY and "ok" in reply:
        return {"g": [handle, name, reply["ok"], (1 if reply.get("plain") else 0) | (2 if reply.get("raw") else 0)]}
    return {"g": [handle, name, reply]}


def request_line(message: dict[str, Any], reply: dict[str, Any]) -> dict[str, Any]:
    """A search's line for a request: a read's as ``read_line``; a method call on an object as
    ``{"c": [handle, method, args, kwargs, reply]}``; any other as ``{"rec": [message, reply]}``."""
    if message["op"] == "getattr":
        return read_line(message["target"]["$handle"], message["name"], reply)
    if message["op"] == "call" and isinstance(message.get("method"), str) and message.keys() == _CALL_KEYS:
        return {"c": [message["target"]["$handle"], message["method"], message["args"], message["kwargs"], reply]}
    return {"rec": [message, reply]}


def read_reply(record: Any, handle: int, name: str) -> dict[str, Any] | None:
    """The reply in the read line ``{"g": record}`` (``read_line``) when it reads ``name`` of
    ``handle``, else None."""
    if not (isinstance(record, list) and len(record) in (3, 4) and record[0] == handle and record[1] == name):
        return None
    if len(record) == 3:
        return record[2] if isinstance(record[2], dict) else {}
    flags = record[3]
    if not isinstance(flags, int):
        return None
    reply = {"ok": record[2]}
    if flags & 1:
        reply["plain"] = True
    if flags & 2:
        reply["raw"] = True
    return reply


def reply_to(message: dict[str, Any], line: dict[str, Any]) -> dict[str, Any] | None:
    """The child's reply in ``line`` when it is the line of ``message`` in any form ``request_line``
    writes, else None."""
    if message["op"] == "getattr":  # the most requests by far
        return read_reply(line.get("g"), message["target"]["$handle"], message["name"])
    record = line.get("c")
    if record is not None:
        same = (isinstance(record, list) and len(record) == 5 and message["op"] == "call"
                and message.keys() == _CALL_KEYS and message["target"] == {"$handle": record[0]}
                and record[1] == message["method"] and record[2] == message["args"]
                and record[3] == message["kwargs"])
        return (record[4] if isinstance(record[4], dict) else {}) if same else None
    record = line.get("rec")
    if isinstance(record, list) and len(record) == 2 and record[0] == message:
        return record[1] if isinstance(record[1], dict) else {}
    return None
