"""Every report clause declares what its check reads and compares, in the statement's own words."""

from __future__ import annotations

import re

import pytest

from pytest_cbatch.contract import CLAUSES
from pytest_cbatch.contract.core import EVENT_KINDS
from pytest_cbatch.schemas import load_schema

JUDGED = [cid for cid, c in CLAUSES.items() if c.check is not None]


def _fields(schema: object) -> set[str]:
    """Every property name anywhere in a JSON schema."""
    found: set[str] = set()
    stack = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            found.update(node.get("properties", {}))
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return found


KNOWN = _fields(load_schema("report")) | _fields(load_schema("trace-line")) | EVENT_KINDS | {"trace"}


@pytest.mark.parametrize("cid", JUDGED)
def test_each_read_is_a_field_of_the_report_or_the_trace(cid: str) -> None:
    declared = CLAUSES[cid]
    assert declared.reads, f"{cid} declares no reads"
    for path in declared.reads:
        unknown = [word for word in re.findall(r"[a-z_]+", path) if word not in KNOWN]
        assert not unknown, f"{cid}: read {path!r} names {unknown}, which no report or trace field is"


@pytest.mark.parametrize("cid", JUDGED)
def test_each_compared_value_is_defined_by_the_statement(cid: str) -> None:
    declared = CLAUSES[cid]
    assert declared.compares, f"{cid} declares no compared value"
    for value, words in declared.compares:
        assert words in declared.statement, f"{cid}: {value!r} is declared as defined by {words!r}, which its " \
                                            f"statement does not say"


def test_every_event_kind_read_is_one_the_clause_may_observe() -> None:
    """A clause reading events of a kind that is not in the report format could never be judged."""
    for cid in JUDGED:
        for path in CLAUSES[cid].reads:
            for kind in re.findall(r"events\[([a-z_]+)\]", path):
                assert kind in EVENT_KINDS, (cid, path)
