"""The trust boundary: whatever judged code hands back becomes plain, bounded data before the kit looks at it.

A report returned by ``simulate``, the JSON an ``exec:`` program prints, a value a lifecycle part
returns: each is untrusted.  ``plain(value)`` is the one function that turns such a value into data
the kit may compare, print and index without running a line of the implementation's code: a fresh
copy made of exact ``dict`` (``str`` keys), ``list`` (an exact ``tuple`` becomes one, as ``json.dumps``
writes it), ``str``, ``int``, ``float``, ``bool`` and ``None``, with

* integers within ``MAX_INT`` in magnitude (a 5,000-digit integer cannot even be printed),
* finite floats (JSON has no NaN or infinity),
* at most ``MAX_DEPTH`` levels of nesting,
* no subclass of any of those types and no other object: their ``__eq__``, ``__hash__``,
  ``__repr__`` or ``__iter__`` would run the implementation's code inside the kit.

Anything else raises ``NotPlain`` naming where (a JSON pointer) and what was found, described
without calling a method of the value.  ``plain(value, lifecycle=True)`` also admits what a
lifecycle part's published reads may hold: tuples, sets and frozensets, mapping keys of any of
those plain values (page ids, owners), objects that compare, hash and print as ``object`` does
(by identity: a page id of the implementation's own class), and subclasses of builtins (a
str-valued Enum, a named tuple), copied as their builtin part without running their code.

``loads(text)`` decodes JSON text through the same boundary; any text, however deep or odd,
ends in ``NotPlain`` or plain data.  ``describe(value)`` names any value safely, for messages;
``exception_text(exc)`` reads an implementation's exception as safely as it can be read.
"""

from __future__ import annotations

import gc
import json
import math
from typing import Any

__all__ = ["MAX_DEPTH", "MAX_INT", "NotPlain", "describe", "exception_text", "loads", "plain"]

MAX_DEPTH = 64
"""Deepest nesting accepted: a report is five levels deep; recursion in the kit stays far from Python's limit."""

MAX_INT = 2**63 - 1
"""Largest integer magnitude accepted (a signed 64-bit integer, what any scheduler's counters fit in)."""

_SCALARS = (str, bool, type(None))
_FLAT = frozenset({str, bool, type(None), int, float})
_NAME = type.__dict__["__name__"]  # a class's own name, past any metaclass property


class NotPlain(ValueError):
    """A value that is not plain, bounded data: ``path`` (a JSON pointer, ``""`` for the value itself)
    and ``problem`` say where and what."""

    def __init__(self, path: str, problem: str) -> None:
        super().__init__(f"{path}: {problem}" if path else problem)
        self.path, self.problem = path, problem


def describe(value: Any) -> str:
    """A short description of any value that runs none of its code: its repr for plain scalars,
    else its type's name."""
    kind = type(value)
    if kind is int:
        return repr(value) if abs(value) <= MAX_INT else f"an integer of {value.bit_length()} bits"
    if kind in (float, bool, type(None)):
        return repr(value)
    if kind is str:
        return repr(value) if len(value) <= 60 else repr(value[:57]) + "..."
    name = _NAME.__get__(kind)
    base = next((b for b in (bool, int, float, str, dict, list, tuple) if issubclass(kind, b)), None)
    what = f"a subclass of {_NAME.__get__(base)}" if base is not None and base is not kind else "an object"
    return f"{what} of type {name[:60]!r}"


def plain(value: Any, *, lifecycle: bool = False) -> Any:
    """A plain, bounded copy of ``value``, or ``NotPlain`` naming the first place it is not (see the module)."""
    enabled = gc.isenabled()
    gc.disable()  # the copy makes no cycles; collections during it would walk the whole report again and again
    try:
        return _copy(value, MAX_DEPTH, lifecycle)
    except _Bad as bad:
        raise NotPlain("".join("/" + part for part in reversed(bad.where)), bad.problem) from None
    finally:
        if enabled:
            gc.enable()


class _Bad(Exception):
    """NotPlain on its way up: the path is built only on this, the rare path (``where`` innermost first)."""

    def __init__(self, problem: str) -> None:
        self.problem, self.where = problem, []


def _copy(value: Any, depth: int, lifecycle: bool) -> Any:
    kind = type(value)
    if kind in _SCALARS:
        return value
    if kind is int:
        if -MAX_INT <= value <= MAX_INT:
            return value
        raise _Bad(f"{describe(value)}: integers beyond {MAX_INT} are not accepted")
    if kind is float:
        if math.isfinite(value):
            return value
        raise _Bad(f"{value!r} is not a JSON number")
    if depth <= 0:
        raise _Bad(f"nested deeper than {MAX_DEPTH} levels")
    if kind is list or kind is tuple:  # a tuple is an array, as json.dumps writes it (a list, outside lifecycle data)
        kind = tuple if lifecycle and kind is tuple else list
        if _flat(value):
            return kind(value)
        index = 0
        try:
            items = []
            for index, item in enumerate(value):
                items.append(_copy(item, depth - 1, lifecycle))
        except _Bad as bad:
            bad.where.append(str(index))
            raise
        return items if kind is list else tuple(items)
    if kind is dict:
        if set(map(type, value)) <= {str} and _flat(value.values()):
            return dict(value)
        out = {}
        key: Any = None
        try:
            for key, item in value.items():
                out[_key(key, lifecycle)] = _copy(item, depth - 1, lifecycle)
        except _Bad as bad:
            bad.where.append(_key_text(key))
            raise
        return out
    if lifecycle and kind in (set, frozenset):
        try:
            return kind(_key(item, lifecycle) for item in value)
        except _Bad as bad:
            bad.where.append("*")
            raise
    if lifecycle:
        base = _unwrapped(value, kind)
        if base is not _NOTHING:
            return _copy(base, depth, lifecycle)
        if _opaque(kind):
            return value
        raise _Bad(f"{describe(value)} whose methods (__eq__, __hash__, __repr__ ...) are its own code; the kit "
                   f"compares only plain data (numbers, strings, lists, tuples, sets, dicts) and objects it "
                   f"compares by identity")
    raise _Bad(f"{describe(value)}, expected JSON data")


_NOTHING = object()
_UNWRAP: tuple[tuple[type, Any], ...] = (
    (str, str.__str__), (int, int.__int__), (float, float.__float__), (list, list.copy),
    (tuple, lambda v: tuple.__getitem__(v, slice(None))), (dict, lambda v: dict(dict.items(v))),
    (frozenset, frozenset.copy), (set, set.copy),
)
_WATCHED = frozenset({"__eq__", "__ne__", "__hash__", "__repr__", "__str__", "__format__", "__getattribute__",
                      "__getattr__", "__lt__", "__le__", "__gt__", "__ge__", "__bool__", "__len__", "__iter__",
                      "__class__", "__del__"})
_MRO, _DICT = type.__dict__["__mro__"], type.__dict__["__dict__"]


def _unwrapped(value: Any, kind: type) -> Any:
    """A lifecycle value of a subclass of a builtin (a str-valued Enum, a named tuple) as an exact copy of its
    builtin part, made by the builtin's own method (none of the subclass's code runs); else _NOTHING."""
    for base, copy in _UNWRAP:
        if issubclass(kind, base):
            return copy(value)
    return _NOTHING


def _opaque(kind: type) -> bool:
    """Whether instances of ``kind`` compare, hash and print as ``object`` does (by identity): a page id or
    handle the kit may hold, compare and print without running the implementation's code."""
    if type(kind) is not type:
        return False
    return not any(_WATCHED & _DICT.__get__(cls).keys() for cls in _MRO.__get__(kind) if cls is not object)


def _flat(values: Any) -> bool:
    """Whether ``values`` are all plain scalars (the common leaf: a list of ids or a dict of fields), judged
    in bulk; False sends the caller element by element, where the first offender is named."""
    kinds = set(map(type, values))
    if not kinds <= _FLAT:
        return False
    if int in kinds:
        ints = values if len(kinds) == 1 else [v for v in values if type(v) is int]
        if min(ints) < -MAX_INT or max(ints) > MAX_INT:
            return False
    if float in kinds:
        return all(math.isfinite(v) for v in values if type(v) is float)
    return True


def _key_text(key: Any) -> str:
    text = key if type(key) is str else describe(key)
    return text.replace("~", "~0").replace("/", "~1")[:80]


def _key(key: Any, lifecycle: bool) -> Any:
    """A mapping key or set member: a str (JSON); for lifecycle data any plain hashable value."""
    if type(key) is str:
        return key
    if not lifecycle:
        raise _Bad(f"the key {describe(key)} is not a string")
    return _copy(key, 2, lifecycle)  # hashable still: a tuple, a scalar, or an object hashed by identity


def loads(text: str | bytes) -> Any:
    """Decode JSON ``text`` (bytes must be UTF-8) into plain data; NotPlain says why not, with the place."""
    if isinstance(text, (bytes, bytearray)):
        try:
            text = bytes(text).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise NotPlain("", f"not UTF-8 text (byte {exc.start + 1} is {bytes(text)[exc.start:exc.start + 1]!r})") \
                from None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise NotPlain("", f"not JSON ({exc.msg} at line {exc.lineno} column {exc.colno})") from None
    except RecursionError:
        raise NotPlain("", f"JSON nested deeper than {MAX_DEPTH} levels") from None
    except ValueError as exc:  # an integer too long to convert, say
        raise NotPlain("", f"not JSON the kit accepts ({str(exc)[:120]})") from None
    return plain(value)


def exception_text(exc: BaseException, limit: int = 2000) -> str:
    """``"Type: message"`` of an exception the implementation raised, at most ``limit`` characters.  Its
    ``__str__`` is the implementation's code: run it under the call's bounds (``bounded.call``); one that
    raises yields a note instead of its message."""
    name = _NAME.__get__(type(exc))[:80]
    try:
        message = str.__str__(str(exc))  # an exact str: a subclass's methods are its code too
    except Exception as failure:
        message = f"(its message could not be read: str() raised {_NAME.__get__(type(failure))[:80]})"
    text = f"{name}: {message}" if message else name
    return text if len(text) <= limit else text[:limit - 3] + "..."
