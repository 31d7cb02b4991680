"""Conformance: the KV lifecycle (allocator, preemption with recomputation, transfers).

One test per part, ids ``test_lifecycle[allocator|recompute|transfer]``. Each
runs a Hypothesis state machine from ``pytest_cbatch.lifecycle`` against the
``PagedKV``/``RecomputeRequest``/``TransferManager`` classes of the namespace
the implementation points at, and skips a part the namespace does not provide.
Example counts come from the active Hypothesis profile; a failure names the
violated ``lifecycle.*`` clause and prints the operations as runnable Python.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis.stateful import run_state_machine_as_test

from pytest_cbatch.lifecycle import MACHINES, PARTS, lifecycle_settings, missing_parts


@pytest.mark.parametrize("part", list(PARTS), ids=list(PARTS))
def test_lifecycle(part: str, cbatch_impl: Any) -> None:
    namespace = cbatch_impl.namespace
    reason = missing_parts(namespace).get(part)
    if reason is not None:
        pytest.skip(f"lifecycle {part}: {reason}")
    machine = MACHINES[part](namespace)
    run_state_machine_as_test(lambda: machine(), settings=lifecycle_settings())
