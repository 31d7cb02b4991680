"""What the sandbox's lifecycle tests share: settings, submissions, and the broken ones each run judges."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, Phase
from hypothesis import settings as Settings

from pytest_cbatch.examples.broken_lifecycle import BROKEN
from pytest_cbatch.lifecycle import PART_CLAUSES, PARTS
from pytest_cbatch.sandbox import IsolatedImplementation, Limits, load_spec_for

# No shrinking: it is capped in seconds, so how far it gets depends on the speed of the channel. The first
# failing example of a derandomized search does not, and so neither does its message.
SETTINGS = Settings(max_examples=6, derandomize=True, database=None, deadline=None,
                    suppress_health_check=list(HealthCheck), phases=(Phase.explicit, Phase.reuse, Phase.generate))
FINDS = Settings(SETTINGS, max_examples=12)  # enough for the search to find each bug of QUICK
REFERENCE = "pytest_cbatch.reference.scheduler_faults"
# One bug per part in the default run; every broken implementation with --run-slow.
QUICK = ("append_without_cow", "replay_refeed", "reads_in_flight")


def isolated(spec: str, mode: str = "process", **limits: Any) -> IsolatedImplementation:
    return IsolatedImplementation(spec, load_spec_for(spec), Limits(**limits), mode=mode)


def part_of(name: str) -> str:
    clause = BROKEN[name][1]
    return next(part for part in PARTS if clause in PART_CLAUSES[part])


def parametrize_broken(metafunc: pytest.Metafunc, quick: tuple[str, ...] = QUICK) -> None:
    """``broken``: the names of ``quick`` (every broken implementation with --run-slow)."""
    if "broken" in metafunc.fixturenames:
        metafunc.parametrize("broken", sorted(BROKEN) if metafunc.config.getoption("--run-slow") else list(quick))


HANGS = '''
from pytest_cbatch.reference.scheduler_faults import PagedKV as _PagedKV, RecomputeRequest, TransferManager


class PagedKV(_PagedKV):
    def fork(self, source, target):
        while True:
            pass
'''

TAMPERS = '''
from pytest_cbatch.reference.scheduler_faults import PagedKV, RecomputeRequest, TransferManager
import pytest_cbatch.lifecycle.machine as _machine

_machine.LifecycleMachine.check_views = lambda self, context: None  # the child's copy of the checks reads nothing
'''
