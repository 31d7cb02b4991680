"""xdist for the kit's own tests: every test that uses a module-scoped fixture runs on one worker.

Under ``-n 2`` xdist's ``load`` distribution may send a module's tests to both workers, and each then
builds the module's fixtures (a graded batch of samples, a kill matrix: tens of seconds) again.  The
kit's own runs use ``loadgroup`` instead: every test that uses a module-scoped fixture joins its
module's group, which one worker runs; all other tests are still spread one by one, as with ``load``.

xdist's ``loadgroup`` finds a test's group in its node id (``path::name@group``), which xdist's
worker writes by assigning ``Item._nodeid``; since pytest 9.2 a node id is a structured ``Item._id``
and that assignment no longer changes it, so the worker writes the group here, in either form, and
marks nothing for xdist to rename.
"""

from __future__ import annotations

from typing import Any

import pytest


def pytest_configure(config: pytest.Config) -> None:
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None:  # an xdist worker: it names each test's group in its id
        config.option.cbatch_groups = bool(workerinput.get("cbatch_loadgroup"))
    elif config.getoption("dist", "no") == "load":  # what ``-n N`` alone means, by then
        config.option.dist = "loadgroup"


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    node.workerinput["cbatch_loadgroup"] = node.config.getoption("dist") == "loadgroup"


def group_of(item: pytest.Item) -> str | None:
    """The test's module path when it uses a module-scoped fixture, else None."""
    info = getattr(item, "_fixtureinfo", None)
    chains = info.name2fixturedefs.values() if info is not None else ()
    if any(chain and chain[-1].scope == "module" for chain in chains):
        return item.nodeid.split("::")[0]
    return None


def _rename(item: pytest.Item, nodeid: str) -> None:
    structured = getattr(item, "_id", None)
    if structured is not None and hasattr(type(structured), "parse"):  # pytest >= 9.2
        item._id = type(structured).parse(nodeid)
    else:
        item._nodeid = nodeid


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not getattr(config.option, "cbatch_groups", False):
        return
    for item in items:
        group = group_of(item)
        if group is not None:
            _rename(item, f"{item.nodeid}@{group}")
