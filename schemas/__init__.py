"""JSON Schemas of the pytest-cbatch contract, shipped as package data, and validation against them.

Four draft 2020-12 schemas ship beside this module: ``trace-line`` (one line
of a JSONL workload), ``report`` (a scheduler run's report),
``faults-report`` (the lifecycle model's report) and ``gradescope-results``
(the results.json ``cbatch grade`` writes).  They fix structure and
types only; semantic rules (headroom never negative, budgets respected, counts
that agree with the events) belong to the contract checker.

Validation has two backends.  When the optional ``jsonschema-rs`` is importable
(extra ``fast``) it decides pass or fail; plain ``jsonschema`` explains
failures, and is the whole path without ``jsonschema-rs``.  Both read JSON
data as ``json.loads`` produces it, with one addition: tuples count as arrays,
since ``json.dumps`` writes them as arrays.  Per JSON Schema, a number with a
zero fraction such as ``1.0`` is an integer; booleans never are.

This module imports neither backend until a function needs it.
"""

from __future__ import annotations

import copy
import functools
import itertools
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from importlib import resources
from types import ModuleType
from typing import Any

__all__ = [
    "SCHEMA_NAMES",
    "SchemaIssue",
    "check_schema_all",
    "load_schema",
    "schema_issues",
    "validator_backend",
]

SCHEMA_NAMES: tuple[str, ...] = ("trace-line", "report", "faults-report", "gradescope-results")

_RS = "jsonschema-rs"
_PY = "jsonschema"
_MESSAGE_LIMIT = 400  # characters; jsonschema quotes whole instances in its messages
_SCREEN_MIN = 64  # arrays and objects at least this long are screened element by element


@dataclass(frozen=True)
class SchemaIssue:
    """One schema violation.

    ``path`` is a JSON pointer (RFC 6901) to the offending value inside the
    validated document, such as ``/events/12/work/0/input_tokens``; it is ``""``
    when the document itself is at fault (a missing or unexpected top-level
    field).  ``message`` says what is wrong, in jsonschema's wording, cut to a
    few hundred characters.
    """

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path or '(document)'}: {self.message}"


def _check_name(name: str) -> None:
    if name not in SCHEMA_NAMES:
        raise ValueError(f"unknown schema {name!r} (known: {', '.join(SCHEMA_NAMES)})")


@functools.lru_cache(maxsize=None)
def _schema_text(name: str) -> str:
    return resources.files(__name__).joinpath(f"{name}.schema.json").read_text(encoding="utf-8")


def load_schema(name: str) -> dict[str, Any]:
    """Return a fresh copy of the shipped schema ``name`` (one of SCHEMA_NAMES).

    Mutating the copy affects nothing else.  An unknown name raises ValueError
    listing the known ones.
    """
    _check_name(name)
    return json.loads(_schema_text(name))


@functools.lru_cache(maxsize=None)
def _rs_module() -> ModuleType | None:
    try:
        import jsonschema_rs
    except ImportError:
        return None
    return jsonschema_rs


def validator_backend() -> str:
    """Name the backend that decides pass or fail: ``"jsonschema-rs"`` when importable, else ``"jsonschema"``."""
    return _PY if _rs_module() is None else _RS


def check_schema_all() -> None:
    """Check every shipped schema against the draft 2020-12 metaschema.

    Raises ``jsonschema.exceptions.SchemaError`` for the first schema that is
    invalid or declares another draft in ``$schema``; returns None when all pass.
    """
    from jsonschema import Draft202012Validator
    from jsonschema.exceptions import SchemaError

    draft = Draft202012Validator.META_SCHEMA["$id"]
    for name in SCHEMA_NAMES:
        schema = load_schema(name)
        if schema.get("$schema") != draft:
            raise SchemaError(f"{name}: $schema must be {draft!r}, got {schema.get('$schema')!r}")
        Draft202012Validator.check_schema(schema)


def schema_issues(
    instance: Any, name: str, *, limit: int = 20, backend: str | None = None
) -> list[SchemaIssue]:
    """Validate ``instance`` against the shipped schema ``name``; return at most ``limit`` issues.

    The list is empty exactly when the instance is valid.  Issues come in
    jsonschema's order: the schema's keywords in order, array elements by
    index, the members of a map such as ``requests`` in no fixed order.

    ``backend`` is for tests and benchmarks: None takes the fastest available,
    ``"jsonschema"`` forces the pure-Python path and ``"jsonschema-rs"``
    insists on the fast one (ImportError without it).  An unknown ``name`` or
    ``backend``, or a ``limit`` below 1, raises ValueError.

    With jsonschema-rs, a valid document costs one jsonschema-rs pass; an
    invalid one adds a jsonschema pass that skips the elements of long arrays
    and objects jsonschema-rs accepts, so explaining a failure in a huge report
    stays cheap.  Without it, jsonschema walks the whole document (slow on
    reports with hundreds of thousands of events).
    """
    _check_name(name)
    if limit < 1:
        raise ValueError(f"limit must be at least 1, got {limit!r}")
    if backend is None:
        backend = validator_backend()
    if backend == _PY:
        return _explain(_explainer(name, screened=False), instance, limit)
    if backend != _RS:
        raise ValueError(f"unknown backend {backend!r} (known: {_RS}, {_PY})")
    if _rs_module() is None:
        raise ImportError("backend 'jsonschema-rs' needs the jsonschema-rs package (pip install jsonschema-rs)")
    validator = _rs_validator(name)
    try:
        verdict: bool | None = _rs_decider(name, _tick_branch_holds(instance)).is_valid(instance)
    except ValueError:  # holds a value jsonschema-rs cannot read (a set, say): jsonschema alone judges
        verdict = None
    if verdict:
        return []
    issues = _explain(_explainer(name, screened=True), instance, limit)
    if issues or verdict is None:
        return issues
    # jsonschema-rs rejects what jsonschema accepts: keep the stricter verdict, in jsonschema-rs's words.
    return [
        SchemaIssue(_pointer(error.instance_path), _shorten(error.message))
        for error in itertools.islice(validator.iter_errors(instance), limit)
    ]


@functools.lru_cache(maxsize=None)
def _rs_validator(name: str) -> Any:
    """jsonschema-rs compiled for ``name`` as written: its messages when jsonschema finds nothing."""
    rs = _rs_module()
    assert rs is not None
    return rs.Draft202012Validator(json.loads(_schema_text(name)))


@functools.lru_cache(maxsize=None)
def _rs_decider(name: str, ticks: bool) -> Any:
    """jsonschema-rs compiled for pass or fail only: ``name`` settled by ``_settle_time_unit``, then ``_selector_chains``."""
    rs = _rs_module()
    assert rs is not None
    return rs.Draft202012Validator(_selector_chains(_settle_time_unit(json.loads(_schema_text(name)), ticks)))


# The report's one top-level branch: a synthetic_tick report's times are integers.
_TICK_BRANCH = {"if": {"properties": {"time_unit": {"const": "synthetic_tick"}}},
                "then": {"$ref": "#/$defs/tick_integers"}}
_TICK_EVENTS = {"items": {"properties": {"time": {"type": "integer"}}}}


def _tick_branch_holds(instance: Any) -> bool:
    """Whether ``_TICK_BRANCH``'s ``if`` holds for ``instance``: false only for an object whose time_unit is
    present and not the string synthetic_tick (read as jsonschema-rs reads it, past any override in a subclass)."""
    if not isinstance(instance, dict) or "time_unit" not in dict.keys(instance):
        return True
    unit = dict.__getitem__(instance, "time_unit")
    return isinstance(unit, str) and str.__eq__(unit, "synthetic_tick")


def _settle_time_unit(schema: dict[str, Any], ticks: bool) -> dict[str, Any]:
    """``schema`` for the instances where ``_TICK_BRANCH``'s ``if`` holds (``ticks``) or fails, for pass or fail only.

    Where the root's ``allOf`` is exactly ``[_TICK_BRANCH]``, it is dropped; with
    ``ticks`` its ``then`` applies unconditionally instead, and the part of it
    that says every event's time is an integer moves into a copy of the event
    definition, so jsonschema-rs walks the events once instead of twice (about
    10 ms of 85 on a 400,000-event report).  Each form accepts exactly what the
    schema as written accepts on the instances it is chosen for.  Any other
    schema is returned as it is.
    """
    if schema.get("allOf") != [_TICK_BRANCH]:
        return schema
    del schema["allOf"]
    if not ticks:
        return schema
    rules = schema["$defs"]["tick_integers"]["properties"]
    events = schema["properties"]["events"]
    event = copy.deepcopy(schema["$defs"]["event"])
    if (rules.get("events") == _TICK_EVENTS and events.get("items") == {"$ref": "#/$defs/event"}
            and event["properties"]["time"] == {"$ref": "#/$defs/time"}):
        del rules["events"]
        event["properties"]["time"] = {"$ref": "#/$defs/time", "type": "integer"}
        schema["$defs"]["event_in_ticks"] = event
        events["items"] = {"$ref": "#/$defs/event_in_ticks"}
    schema["allOf"] = [dict(_TICK_BRANCH["then"])]
    return schema


# Selector values most documents are made of (a report's events are mostly tokens), tried first.
_COMMON_FIRST = ("token", "dispatch", "snapshot")


def _selector_chains(node: Any) -> Any:
    """``node`` with each ``allOf`` of selector branches rewritten as one if/then/else chain, common values first.

    A selector branch is ``{"if": {"required": [KEY], "properties": {KEY:
    {"const": VALUE}}}, "then": ...}``.  When every branch of an ``allOf``
    selects on the same KEY with a distinct string VALUE and the node itself
    demands an object, at most one ``if`` holds for any instance it accepts,
    so the chain accepts exactly what the ``allOf`` accepts; but jsonschema-rs
    then stops at the first ``if`` that holds instead of trying all of them
    on every element (four times faster on a report's events).  Anything
    else is kept as it is.  Only the shipped schemas pass through here, and
    error messages always come from the schema as written.
    """
    if isinstance(node, list):
        return [_selector_chains(child) for child in node]
    if not isinstance(node, dict):
        return node
    out = {key: _selector_chains(child) for key, child in node.items()}
    branches = out.get("allOf")
    # Only where the node demands an object: every such ``if`` holds for a non-object, so the forms would differ.
    selected = _selections(branches) if isinstance(branches, list) and out.get("type") == "object" else None
    if selected is None:
        return out
    del out["allOf"]
    first = {value: rank for rank, value in enumerate(_COMMON_FIRST)}
    order = sorted(range(len(branches)), key=lambda k: first.get(selected[k], len(first) + k))
    chain: dict[str, Any] = {}
    for k in reversed(order):
        chain = {"if": branches[k]["if"], "then": branches[k]["then"], **({"else": chain} if chain else {})}
    if set(chain) & set(out):   # the node has its own if/then: keep the chain beside it
        out["allOf"] = [chain]
    else:
        out.update(chain)
    return out


def _selections(branches: list[Any]) -> list[Any] | None:
    """The VALUE each selector branch of ``branches`` selects on one KEY (see ``_selector_chains``), or None."""
    keys, values = set(), []
    for branch in branches:
        if not isinstance(branch, dict) or set(branch) != {"if", "then"} or not isinstance(branch["if"], dict):
            return None
        cond = branch["if"]
        required, properties = cond.get("required"), cond.get("properties")
        if (set(cond) != {"required", "properties"} or not isinstance(required, list) or len(required) != 1
                or not isinstance(properties, dict) or list(properties) != required
                or not isinstance(properties[required[0]], dict) or list(properties[required[0]]) != ["const"]):
            return None
        keys.add(required[0])
        values.append(properties[required[0]]["const"])
    # Strings only: distinct strings never match one instance (1 and 1.0 would, under JSON Schema's equality).
    if len(keys) != 1 or len(values) < 2 or len(set(values)) != len(values) \
            or not all(isinstance(v, str) for v in values):
        return None
    return values


def _array_type(_checker: Any, instance: Any) -> bool:
    return isinstance(instance, (list, tuple))


@functools.lru_cache(maxsize=None)
def _explainer(name: str, screened: bool) -> Any:
    """A compiled jsonschema validator for ``name``; ``screened`` lets jsonschema-rs skip valid elements."""
    from jsonschema import Draft202012Validator, validators

    schema = json.loads(_schema_text(name))
    keywords: dict[str, Callable[..., Iterator[Any]]] = {}
    if screened:
        screen = _Screen(schema)
        keywords = {"items": screen.items, "additionalProperties": screen.additional_properties}
    cls = validators.extend(
        Draft202012Validator,
        validators=keywords,
        type_checker=Draft202012Validator.TYPE_CHECKER.redefine("array", _array_type),
    )
    return cls(schema)


def _explain(validator: Any, instance: Any, limit: int) -> list[SchemaIssue]:
    issues: list[SchemaIssue] = []
    seen: set[tuple[str, str]] = set()
    for error in validator.iter_errors(instance):
        path = _pointer(error.absolute_path)
        # A value of the wrong type is one issue, though two rules (say number, and integer in a tick report) say so.
        key = (path, "type" if error.validator == "type" else error.message)
        if key in seen:
            continue
        seen.add(key)
        issues.append(SchemaIssue(path, _message(error)))
        if len(issues) == limit:
            break
    return issues


def _pointer(parts: Any) -> str:
    return "".join("/" + str(part).replace("~", "~0").replace("/", "~1") for part in parts)


def _message(error: Any) -> str:
    text = error.message
    if error.context:  # anyOf/oneOf: say what each alternative wanted
        text += " (" + "; ".join(dict.fromkeys(sub.message for sub in error.context)) + ")"
    return _shorten(text)


def _shorten(text: str) -> str:
    return text if len(text) <= _MESSAGE_LIMIT else text[: _MESSAGE_LIMIT - 3] + "..."


class _Screen:
    """``items`` and ``additionalProperties`` for jsonschema that skip elements jsonschema-rs accepts.

    Used only after jsonschema-rs has found the document invalid.  On arrays and
    objects of at least _SCREEN_MIN elements, each element is first checked by
    jsonschema-rs against the same subschema (addressed by its JSON pointer in
    the root schema, so its ``$ref`` resolve as usual) and jsonschema descends
    only into the rejected ones.  The errors are those of an unscreened run as
    long as the backends agree element by element (the tests check that they
    do).  Anything else is left to jsonschema's own keyword.
    """

    def __init__(self, root: dict[str, Any]) -> None:
        from jsonschema import Draft202012Validator

        self._root = root
        self._pointers = {id(sub): pointer for pointer, sub in _subschemas(root, "")}
        self._compiled: dict[int, Any] = {}
        self._items = Draft202012Validator.VALIDATORS["items"]
        self._additional = Draft202012Validator.VALIDATORS["additionalProperties"]

    def _accepts(self, subschema: dict[str, Any], value: Any) -> bool:
        validator = self._compiled.get(id(subschema))
        if validator is None:
            rs = _rs_module()
            assert rs is not None
            wrapper = {
                "$schema": self._root["$schema"],
                "$ref": f"{self._root['$id']}#{self._pointers[id(subschema)]}",
                "$defs": {"root": self._root},
            }
            validator = self._compiled[id(subschema)] = rs.Draft202012Validator(wrapper)
        try:
            return validator.is_valid(value)
        except ValueError:  # unreadable for jsonschema-rs: let jsonschema look
            return False

    def _screens(self, subschema: Any, collection: Any) -> bool:
        return isinstance(subschema, dict) and id(subschema) in self._pointers and len(collection) >= _SCREEN_MIN

    def items(self, validator: Any, items: Any, instance: Any, schema: dict[str, Any]) -> Iterator[Any]:
        if "prefixItems" in schema or not validator.is_type(instance, "array") or not self._screens(items, instance):
            yield from self._items(validator, items, instance, schema)
            return
        for index, item in enumerate(instance):
            if not self._accepts(items, item):
                yield from validator.descend(item, items, path=index)

    def additional_properties(
        self, validator: Any, additional: Any, instance: Any, schema: dict[str, Any]
    ) -> Iterator[Any]:
        if (
            "patternProperties" in schema
            or not validator.is_type(instance, "object")
            or not self._screens(additional, instance)
        ):
            yield from self._additional(validator, additional, instance, schema)
            return
        declared = schema.get("properties", {})
        for key, value in instance.items():
            if key not in declared and not self._accepts(additional, value):
                yield from validator.descend(value, additional, path=key)


def _subschemas(node: Any, pointer: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every object inside a schema document with its JSON pointer, the document first."""
    if isinstance(node, dict):
        yield pointer, node
        children: Any = node.items()
    elif isinstance(node, list):
        children = enumerate(node)
    else:
        return
    for key, child in children:
        yield from _subschemas(child, pointer + _pointer((key,)))
