"""The pass/fail forms of the shipped schemas (``schemas._rs_decider``) accept exactly what they accept."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pytest_cbatch import schemas
from pytest_cbatch.reference.scheduler_faults import demo as faults_demo
from pytest_cbatch.reference.scheduler_sim import demo_trace, simulate
from pytest_cbatch.schemas import SCHEMA_NAMES, load_schema

jsonschema_rs = pytest.importorskip("jsonschema_rs", reason="the pass/fail form is jsonschema-rs's")

REPORT_KINDS = load_schema("report")["$defs"]["event_name"]["anyOf"][0]["enum"]


def chains(node: Any) -> list[list[str]]:
    """The selector values of every if/then/else chain in ``node``, each chain in the order it tries them."""
    found = []
    if isinstance(node, dict):
        if "else" in node and "if" in node:
            order, link = [], node
            while link:
                order.append(link["if"]["properties"]["event"]["const"])
                link = link.get("else")
            return [order]
        for child in node.values():
            found += chains(child)
    elif isinstance(node, list):
        for child in node:
            found += chains(child)
    return found


def test_report_events_become_one_chain_tokens_first_and_the_rest_is_untouched() -> None:
    schema = load_schema("report")
    decision = schemas._selector_chains(copy.deepcopy(schema))
    assert chains(decision) == [["token", "dispatch", "snapshot", *[k for k in REPORT_KINDS
                                                                    if k not in ("token", "dispatch", "snapshot")]]]
    del schema["$defs"]["event"]["allOf"]
    for key in ("if", "then", "else"):
        del decision["$defs"]["event"][key]
    assert decision == schema   # the top-level allOf (one branch, on time_unit) stays as written


def test_only_selector_unions_on_objects_are_rewritten() -> None:
    branch = {"if": {"required": ["k"], "properties": {"k": {"const": "a"}}}, "then": {"required": ["x"]}}
    other = {"if": {"required": ["k"], "properties": {"k": {"const": "b"}}}, "then": {"required": ["y"]}}
    kept = [
        {"allOf": [branch, other]},   # no "type": "object": every if holds for a non-object
        {"type": "object", "allOf": [branch]},   # one branch: nothing to chain
        {"type": "object", "allOf": [branch, branch]},   # the same value twice: both ifs hold
        {"type": "object", "allOf": [branch, {**other, "if": {"required": ["j"], "properties": {"j": {"const": "b"}}}}]},
        {"type": "object", "allOf": [branch, {**other, "if": {"properties": {"k": {"const": "b"}}}}]},
        {"type": "object", "allOf": [branch, {**other, "if": {"required": ["k"], "properties": {"k": {"const": 1}}}}]},
        {"type": "object", "allOf": [branch, {**other, "else": {}}]},
    ]
    for node in kept:
        assert schemas._selector_chains(copy.deepcopy(node)) == node
    assert schemas._selector_chains({"type": "object", "allOf": [branch, other]}) == {
        "type": "object", "if": branch["if"], "then": branch["then"], "else": other}
    beside = {"type": "object", "if": {"required": ["z"]}, "then": {}, "allOf": [branch, other]}
    assert schemas._selector_chains(copy.deepcopy(beside))["allOf"] == [{**branch, "else": other}]


def test_every_shipped_schema_with_a_selector_union_gets_its_chain() -> None:
    # faults-report's transfer events select one branch by an enum, not a const: kept as written.
    assert {name: len(chains(schemas._selector_chains(load_schema(name)))) for name in SCHEMA_NAMES} == {
        "trace-line": 1, "report": 1, "faults-report": 1, "gradescope-results": 0}


def test_a_report_settles_its_time_unit_branch_and_checks_tick_times_inside_the_event_union() -> None:
    seconds = schemas._settle_time_unit(load_schema("report"), ticks=False)
    ticks = schemas._settle_time_unit(load_schema("report"), ticks=True)
    written = load_schema("report")
    del written["allOf"]
    assert seconds == written
    assert ticks["allOf"] == [{"$ref": "#/$defs/tick_integers"}]
    assert "events" not in ticks["$defs"]["tick_integers"]["properties"]
    assert ticks["properties"]["events"]["items"] == {"$ref": "#/$defs/event_in_ticks"}
    assert ticks["$defs"]["event_in_ticks"]["properties"]["time"] == {"$ref": "#/$defs/time", "type": "integer"}
    for name in ("trace-line", "faults-report", "gradescope-results"):
        assert schemas._settle_time_unit(load_schema(name), ticks=True) == load_schema(name)


@pytest.mark.parametrize("unit, holds", [("synthetic_tick", True), ("seconds", False), (None, False), (1, False),
                                         ("synthetic_ticks", False)])
def test_the_tick_form_is_chosen_exactly_where_the_time_unit_branch_applies(unit: Any, holds: bool) -> None:
    assert schemas._tick_branch_holds({"time_unit": unit}) is holds
    assert schemas._tick_branch_holds({}) and schemas._tick_branch_holds([]) and schemas._tick_branch_holds(None)


@pytest.mark.parametrize("backend", ["jsonschema-rs", "jsonschema"])
def test_a_tick_report_with_a_fractional_event_time_stays_schema_invalid_with_the_same_message(backend: str) -> None:
    doc = copy.deepcopy(DOCUMENTS["report"])
    doc["events"][2]["time"] = 1.5
    assert schemas.schema_issues(doc, "report", backend=backend) == [
        schemas.SchemaIssue("/events/2/time", "1.5 is not of type 'integer'")]
    doc["time_unit"] = "seconds"
    assert schemas.schema_issues(doc, "report", backend=backend) == []


class _Decider:
    """The pass/fail form ``schema_issues`` picks for each instance, as one validator."""

    def __init__(self, name: str) -> None:
        self.name = name

    def is_valid(self, instance: Any) -> bool:
        return schemas._rs_decider(self.name, schemas._tick_branch_holds(instance)).is_valid(instance)


def _validators(name: str) -> tuple[Any, Any]:
    return jsonschema_rs.Draft202012Validator(load_schema(name)), _Decider(name)


DOCUMENTS = {
    "report": json.loads(json.dumps(simulate(demo_trace(), admission="optimistic", capacity=6))),
    "faults-report": json.loads(json.dumps(faults_demo())),
    "trace-line": {"time": 0, "event": "arrival", "id": "a", "prompt_tokens": 3, "output_tokens": 2},
}
LISTS = {"report": ("events",), "faults-report": ("request_events", "transfer_events"), "trace-line": ()}
VALIDATORS = {name: _validators(name) for name in DOCUMENTS}


def _elements(doc: dict[str, Any], name: str) -> list[tuple[list[Any], int]]:
    """(list, index) of every selected element of ``doc`` (a trace line is one, in a list of its own)."""
    return [(doc[key], k) for key in LISTS[name] for k in range(len(doc[key]))]


FIELDS = sorted({key for name, doc in DOCUMENTS.items()
                 for element in ([doc] if not LISTS[name] else [h[k] for h, k in _elements(doc, name)])
                 for key in element} | {"x"})
NAMES = sorted({*REPORT_KINDS, "cancel", "begin", "abort", "ready", "resumed", "resume_blocked", "emit", "x-engine", "bogus"})
VALUES = st.one_of(st.none(), st.booleans(), st.integers(-2, 3), st.sampled_from([0.5, 2.0, "", "a", "r0"]),
                   st.sampled_from(NAMES), st.lists(st.integers(-1, 3), max_size=2),
                   st.dictionaries(st.sampled_from(["id", "phase", "input_tokens", "a"]),
                                   st.one_of(st.integers(0, 2), st.sampled_from(["r0", "decode"])), max_size=3))
UNITS = st.sampled_from(["keep", "synthetic_tick", "seconds", "delete", None, 1])
EDITS = st.tuples(st.sampled_from(["set", "delete", "replace"]), st.sampled_from(FIELDS), VALUES)


def _edit(doc: dict[str, Any], name: str, at: int, edits: list[tuple[str, str, Any]]) -> Any:
    """``doc`` with one selected element edited: fields set or deleted, or the element replaced by a value."""
    root = [copy.deepcopy(doc)]
    places = _elements(root[0], name) or [(root, 0)]
    holder, k = places[at % len(places)]
    for op, key, value in edits:
        if op == "replace":
            holder[k] = value
        elif isinstance(holder[k], dict) and op == "set":
            holder[k][key] = value
        elif isinstance(holder[k], dict):
            holder[k].pop(key, None)
    return root[0]


@pytest.mark.parametrize("name", sorted(DOCUMENTS))
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(at=st.integers(0, 10_000), edits=st.lists(EDITS, min_size=1, max_size=3), unit=UNITS)
def test_the_pass_fail_form_agrees_with_the_schema_on_edited_documents(
        name: str, at: int, edits: list[tuple[str, str, Any]], unit: Any) -> None:
    doc = _edit(DOCUMENTS[name], name, at, edits)
    if isinstance(doc, dict) and "time_unit" in doc and unit != "keep":   # a report's branch on time_unit
        doc["time_unit"] = unit
        if unit == "delete":
            del doc["time_unit"]
    written, decision = VALIDATORS[name]
    assert decision.is_valid(doc) == written.is_valid(doc), (name, edits)


@pytest.mark.parametrize("name", sorted(DOCUMENTS))
def test_edits_reach_both_verdicts(name: str) -> None:
    """The property above meets valid and invalid documents: an element whose kind is swapped for another is
    judged by the other kind's branch, which demands fields it lacks or forbids ones it has."""
    written, decision = VALIDATORS[name]
    doc = DOCUMENTS[name]
    assert written.is_valid(doc) and decision.is_valid(doc)
    swapped = _edit(doc, name, 0, [("set", "event", {"report": "dispatch", "trace-line": "cancel",
                                                     "faults-report": "emit"}[name])])
    assert not written.is_valid(swapped) and not decision.is_valid(swapped)
