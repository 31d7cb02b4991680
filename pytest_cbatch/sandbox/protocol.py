"""The sandbox's wire protocol: the one module both sides of the pipe share, and the grader's boundary.

Standard library only, and nothing else of the sandbox: the child imports it
before the submission, and every byte the child writes reaches the grader
through ``ReplyReader``.

Framing.  Each message is one JSON line (UTF-8).  The grader writes requests
``{"op": ..., "drop": [handles], ...}``; the child writes replies, and a
search's lines, which it may group as ``{"batch": [line, ...]}``.  A reply
line is untrusted: ``ReplyReader`` refuses, before decoding it, a line longer
than its byte limit (``reply_mb``), nested deeper than ``MAX_DEPTH`` arrays and
objects, or holding more than ``MAX_CONTAINERS`` of them (a line of ``{},{},``
costs the decoder some 25 bytes of memory per byte); a line that is not
UTF-8, not JSON or not an object, or that the decoder cannot finish
(RecursionError, MemoryError), is refused too.  Each refusal is a
``SandboxFailure`` of kind ``garbage`` naming the limit: it fails that call of
that submission, never the grader.

Replies.  ``{"ok": value}`` (a ``getattr`` reply may add ``"snap"``, ``"plain"``
or ``"method"``), ``{"raised": {type, builtin, message, stack}}`` (``raised``),
``{"exited": code}`` (``exited``), ``{"unsupported": message}``, ``{"memory":
message}``, ``{"broken": message}`` (a program's output that is no report); the
first line describes what the child loaded (``{"ok": {...}}``) or says
``{"load_failed": ...}``.  Between replies the child may write lines that are
none: ``{"kit": {...}}`` (the guard's report of a use of the kit's code) and
``{"stack": text}`` (where a long call is).

Values.  JSON with tags: ``{"$tuple": [...]}``, ``{"$set": [...]}``,
``{"$dict": [[key, value], ...]}``, and ``{"$handle": n, "$type": name}`` for
any other object, which stays in the child (``encode``, ``decode``); a reply
marked ``raw`` carries a value that is JSON as it stands (``native_copy``).

A search's lines.  For a search run ahead by the child (``child_search``,
judged by ``search``): ``{"ex": n}`` as each example starts, ``{"seg": [name,
kwargs]}`` per step, and per request one line: ``{"g": [handle, name, value,
flags]}`` for a read whose reply is only a value, ``{"g": [handle, name,
reply]}`` for any other read, ``{"c": [handle, method, args, kwargs, reply]}``
for a method call, ``{"rec": [request, reply]}`` for the rest
(``request_line``, ``reply_to``); the search's reply ends them.
"""

from __future__ import annotations

import builtins
import collections
import collections.abc
import json
import numbers
import random
from typing import Any, Callable

__all__ = ["MAX_CONTAINERS", "MAX_DEPTH", "ReplyReader", "SandboxFailure", "bound_problem", "decode",
           "describe_line", "encode", "encode_line", "exited", "json_default", "native_copy", "of_example",
           "plain_only", "raised", "read_line", "read_reply", "reply_to", "request_line", "search_settings",
           "settings_document"]

MAX_DEPTH = 64
"""Arrays and objects one reply line may nest (a tagged value takes two levels per level of its own)."""
MAX_CONTAINERS = 1 << 20
"""Arrays and objects one reply line may hold in all (brackets inside strings count too: a bound, not a count):
some 200 MiB decoded at most.  The largest report of the kit's workloads holds 15,000; a search's batch line,
a few thousand."""


class SandboxFailure(Exception):
    """A call did not produce a reply; ``kind`` is one of timeout, died, flood, garbage, breaker, load."""

    def __init__(self, kind: str, message: str, stack: str = "") -> None:
        super().__init__(message)
        self.kind = kind
        self.stack = stack  # a timeout's: the submission's stack shortly before its limit (``child.StopWatch``)


# --------------------------------------------------------------------- framing


class ReplyReader:
    """The grader's reader of the child's reply pipe: bytes in (``feed``), bounded replies out (``pop``)."""

    def __init__(self, label: str, max_bytes: int, limit_name: str = "limit reply_mb",
                 aside: Callable[[dict[str, Any]], bool] | None = None) -> None:
        """``aside(line)`` sees each line first (not a batch's lines) and says whether it took it: a line that
        is no reply (the guard's ``{"kit": ...}``, a ``{"stack": ...}``)."""
        self.label, self.max_bytes, self.limit_name, self.aside = label, max_bytes, limit_name, aside
        self._buffer = bytearray()
        self._searched = 0          # bytes of the buffer known to hold no newline
        self._ready: collections.deque[dict[str, Any]] = collections.deque()

    def __bool__(self) -> bool:
        """Whether a reply is ready."""
        return bool(self._ready)

    def pop(self) -> dict[str, Any]:
        return self._ready.popleft()

    def feed(self, data: bytes) -> None:
        """Add bytes read from the pipe; decode the lines they complete (raise SandboxFailure for a bad one)."""
        self._buffer += data
        end = self._buffer.rfind(b"\n", self._searched)
        if end < 0:
            self._searched = len(self._buffer)
            if self._searched > self.max_bytes:
                raise self._refused(f"a reply line longer than {self.max_bytes >> 20} MiB ({self.limit_name}) "
                                    f"that does not end", self._buffer)
            return
        lines = bytes(self._buffer[:end]).split(b"\n")
        del self._buffer[: end + 1]
        self._searched = 0
        for line in lines:
            self._add(self._decode(line))
        if len(self._buffer) > self.max_bytes:
            raise self._refused(f"a reply line longer than {self.max_bytes >> 20} MiB ({self.limit_name})",
                                self._buffer)

    def _add(self, reply: dict[str, Any]) -> None:
        if self.aside is not None and self.aside(reply):
            return
        batch = reply.get("batch")
        if batch is None:
            self._ready.append(reply)
        elif isinstance(batch, list) and all(type(line) is dict for line in batch):
            self._ready.extend(batch)
        else:
            raise self._refused("a batch that is not a list of replies", repr(batch).encode())

    def _decode(self, line: bytes) -> dict[str, Any]:
        if len(line) > self.max_bytes:
            raise self._refused(f"a reply line of {len(line)} bytes, over {self.max_bytes >> 20} MiB "
                                f"({self.limit_name})", line)
        problem = bound_problem(line)
        if problem:
            raise self._refused(f"a reply line {problem}", line)
        try:
            reply = json.loads(line.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise self._refused(f"garbage ({exc})", line) from None
        except RecursionError:
            raise self._refused("a reply line too deeply nested to decode", line) from None
        except MemoryError:
            raise self._refused(f"a reply line of {len(line)} bytes that did not fit in memory when decoded",
                                line) from None
        if type(reply) is not dict:
            raise self._refused("a reply that is not an object", line)
        return reply

    def _refused(self, what: str, line: bytes | bytearray) -> SandboxFailure:
        return SandboxFailure("garbage", f"the {self.label} wrote {what} on its reply channel, which only the kit's "
                                         f"side of the child writes (it began {bytes(line[:80])!r})")


_NOT_STRUCTURE = bytes(b for b in range(256) if b not in b'"[]{}')
_ONE_KIND = bytes.maketrans(b"{}", b"[]")  # for depth, an object is an array


def bound_problem(line: bytes) -> str | None:
    """Why ``line`` may not be decoded (more than MAX_CONTAINERS arrays and objects, or nested deeper than
    MAX_DEPTH), or None.  A scan at the speed of ``bytes`` methods (a few percent of decoding the line): no
    value is built."""
    opened = line.count(b"[") + line.count(b"{")
    if opened > MAX_CONTAINERS:
        return f"with more than {MAX_CONTAINERS} arrays and objects (the protocol's MAX_CONTAINERS)"
    if opened <= MAX_DEPTH:
        return None
    brackets = _structure(line)
    for _ in range(MAX_DEPTH):  # each pass takes away the innermost level, and only that
        if not brackets:
            return None
        shorter = brackets.replace(b"[]", b"")
        if len(shorter) == len(brackets):
            return None  # unbalanced: not JSON, which the decoder says (its RecursionError is caught)
        brackets = shorter
    return f"nested deeper than {MAX_DEPTH} arrays and objects (the protocol's MAX_DEPTH)" if brackets else None


def _structure(line: bytes) -> bytes:
    """The brackets of JSON ``line`` outside its strings, as ``[`` and ``]``.  Backslashes occur only in
    strings, where the lexer pairs them from the left as ``replace`` does; then every quote left opens or
    closes a string."""
    if b"\\" in line:
        line = line.replace(b"\\\\", b"").replace(b'\\"', b"")
    kept = line.translate(_ONE_KIND, _NOT_STRUCTURE).replace(b'""', b"")  # most strings hold no bracket
    return b"".join(kept.split(b'"')[::2]) if b'"' in kept else kept


def encode_line(message: dict[str, Any], default: Callable[[Any], Any] | None = None) -> bytes:
    """One message as its line (``default``: ``json.dumps``'s fallback for values that are not JSON)."""
    return json.dumps(message, default=default).encode() + b"\n"


# ---------------------------------------------------------------------- values

_PLAIN = (type(None), bool, int, float, str)


def encode(value: Any, handle: Callable[[Any], dict[str, Any]]) -> Any:
    """Tagged JSON for ``value``; ``handle(obj)`` encodes an object that is not plain data."""
    kind = type(value)
    if kind in _PLAIN:  # the common cases first: the ABC checks below are slow
        return value
    if kind is list:
        return [encode(v, handle) for v in value]
    if kind is dict:
        return {"$dict": [[encode(k, handle), encode(v, handle)] for k, v in value.items()]}
    if kind is tuple:
        return {"$tuple": [encode(v, handle) for v in value]}
    if kind is set or kind is frozenset:
        return {"$set": [encode(v, handle) for v in value]}
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    if isinstance(value, tuple):
        return {"$tuple": [encode(v, handle) for v in value]}
    if isinstance(value, (list, collections.deque, range)):
        return [encode(v, handle) for v in value]
    if isinstance(value, collections.abc.Set):
        return {"$set": [encode(v, handle) for v in value]}
    if isinstance(value, collections.abc.Mapping):
        return {"$dict": [[encode(k, handle), encode(v, handle)] for k, v in value.items()]}
    return handle(value)


def decode(value: Any, handle: Callable[[dict[str, Any]], Any]) -> Any:
    """The inverse of ``encode``; ``handle(tag)`` turns a ``$handle`` tag into an object."""
    kind = type(value)
    if kind is list:
        return [v if type(v) in _PLAIN else decode(v, handle) for v in value]
    if kind is not dict:
        return value
    if "$tuple" in value:
        return tuple(decode(v, handle) for v in value["$tuple"])
    if "$set" in value:
        return {decode(v, handle) for v in value["$set"]}
    if "$dict" in value:
        return {decode(k, handle): decode(v, handle) for k, v in value["$dict"]}
    if "$handle" in value:
        return handle(value)
    raise ValueError(f"untagged object in RPC value: {sorted(value)[:5]}")


def plain_only(obj: Any) -> dict[str, Any]:
    """The ``handle`` of values that must be plain data (a lifecycle step's arguments): refuses any object."""
    raise TypeError(f"a lifecycle step's arguments are plain data, not {type(obj).__name__}")


class _NotNative(Exception):
    pass


def native_copy(value: Any) -> tuple[bool, Any]:
    """``(True, a copy of value)`` when ``value`` is JSON as it stands and comes back from it unchanged:
    None, bools, ints, floats, strings, and lists and string-keyed dicts of them; else ``(False, None)``."""
    try:
        return True, _copy(value)
    except _NotNative:
        return False, None


def _copy(value: Any) -> Any:
    kind = type(value)
    if kind in _PLAIN:
        return value
    if kind is list:
        return [item if type(item) in _PLAIN else _copy(item) for item in value]
    if kind is dict:
        out = {}
        for key, item in value.items():
            if type(key) is not str:
                raise _NotNative
            out[key] = item if type(item) in _PLAIN else _copy(item)
        return out
    raise _NotNative


def json_default(obj: Any) -> Any:
    """json.dumps fallback for a report: numbers as numbers, anything else as a visible marker."""
    if isinstance(obj, numbers.Integral):
        return int(obj)
    if isinstance(obj, numbers.Real):
        return float(obj)
    if isinstance(obj, (tuple, set, frozenset)):
        return list(obj)
    return f"<not JSON: {type(obj).__name__}>"


# --------------------------------------------------------------------- replies


def exited(exc: SystemExit) -> dict[str, Any]:
    """The reply that says the submission raised SystemExit."""
    return {"exited": exc.code if isinstance(exc.code, int) or exc.code is None else str(exc.code)}


def raised(exc: BaseException, stack: str = "") -> dict[str, Any]:
    """The reply that says the submission raised ``exc``: its type, the built-in it derives from, its message,
    and ``stack``, its traceback (``child.own_stack``), if any."""
    base = next((c for c in type(exc).__mro__ if getattr(builtins, c.__name__, None) is c), Exception)
    out = {"type": type(exc).__name__, "builtin": base.__name__, "message": str(exc)[:2000]}
    return {"raised": {**out, "stack": stack} if stack else out}


# ------------------------------------------------------------ a search's lines

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


def of_example(line: dict[str, Any]) -> bool:
    """Whether ``line`` is a step or a request of an example (not a search's final reply)."""
    return "seg" in line or "g" in line or "c" in line or "rec" in line


def describe_line(line: dict[str, Any]) -> str:
    """A search's line as a message names it: a step, a request, an error or the line itself (shortened)."""
    if "seg" in line:
        return f"step {line['seg'][0] if isinstance(line['seg'], list) and line['seg'] else line['seg']!r}"
    if "rec" in line:
        return f"request {line['rec'][0]!r:.200}" if isinstance(line["rec"], list) and line["rec"] else "a request"
    if "g" in line:
        return f"a read of {line['g'][1]!r:.200}" if isinstance(line["g"], list) and len(line["g"]) > 2 else "a read"
    if "c" in line:
        return f"a call of {line['c'][1]!r:.200}" if isinstance(line["c"], list) and len(line["c"]) > 2 else "a call"
    if "raised" in line:
        from .. import untrusted  # the grader's side only: the child never describes a line

        found = line["raised"]
        return (f"an error: {untrusted.line(found.get('type'), 80)}: {untrusted.line(found.get('message'), 500)}"
                if isinstance(found, dict) else "an error")
    return f"{line!r:.200}"


# ------------------------------------------------------- a search's settings


def settings_document(settings: Any) -> dict[str, Any]:
    """The document of Hypothesis ``settings`` that the grader sends to begin a search (``search_settings``
    reads it), with a fresh seed unless derandomized."""
    return {"max_examples": settings.max_examples, "stateful_step_count": settings.stateful_step_count,
            "derandomize": settings.derandomize, "phases": [phase.name for phase in settings.phases],
            "suppress_health_check": [check.name for check in settings.suppress_health_check],
            "seed": None if settings.derandomize else random.getrandbits(64)}


def search_settings(doc: dict[str, Any], *, shrink: bool) -> tuple[Any, int | None]:
    """The settings both sides run one search under, from ``settings_document``'s document, and its seed
    (None: derandomized).  The child shrinks, the grader does not; neither has a database, a deadline or a
    health check that depends on time.  Hypothesis is imported here: only lifecycle searches need it."""
    from hypothesis import HealthCheck, Phase, Verbosity
    from hypothesis import settings as Settings

    phases = [Phase[name] for name in doc["phases"] if shrink or name != Phase.shrink.name]
    checks = {HealthCheck[name] for name in doc["suppress_health_check"]} | {HealthCheck.too_slow}
    settings = Settings(max_examples=doc["max_examples"], stateful_step_count=doc["stateful_step_count"],
                        derandomize=doc["derandomize"], phases=phases, suppress_health_check=sorted(checks, key=str),
                        database=None, deadline=None, report_multiple_bugs=False, verbosity=Verbosity.quiet,
                        print_blob=False)
    return settings, doc["seed"]
