"""The transformers adapter (examples/transformers): transformers' continuous-batching engine, its
FIFO and prefill-first schedulers, through the contract, and the engine behaviours the kit found.

Runs only where transformers and the adapter are installed (``.ci/transformers-venv`` builds that
environment; ``.ci/transformers-job`` runs this file there).  Elsewhere the module is skipped.
"""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("transformers", reason="transformers is not installed here: build its venv with "
                                           ".ci/transformers-venv and run .ci/transformers-job")
adapter = pytest.importorskip("cbatch_transformers.adapter", reason="the transformers adapter is not installed: "
                                                                    "pip install -e examples/transformers")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from pytest_cbatch import strategies  # noqa: E402
from pytest_cbatch.contract import check_report  # noqa: E402
from pytest_cbatch.impls import resolve_impl  # noqa: E402
from pytest_cbatch.workloads import arrival, cancel  # noqa: E402

ADAPTERS = [adapter.FIFO, adapter.PREFILL_FIRST]
NATIVE = adapter.Adapter.CBATCH_NATIVE_CONFIG
BASE = {"capacity": 8, "block_size": 4, "token_budget": 4, "max_active": 4, **NATIVE, "policy": "continuous"}


def timeline(report: dict[str, Any], *kinds: str) -> list[tuple[int, str, str]]:
    return [(ev["time"], ev["event"], ev["id"]) for ev in report["events"] if ev["event"] in kinds]


@pytest.mark.parametrize("name, target", [("transformers-fifo", adapter.FIFO),
                                          ("transformers-prefill-first", adapter.PREFILL_FIRST)])
def test_the_entry_points_resolve_to_the_two_schedulers(name: str, target: Any) -> None:
    assert resolve_impl(name).namespace is target
    report = target.simulate([arrival(0, "a", 3, 2)], **BASE)
    assert report["summary"]["engine"].endswith(f"({target.scheduler_type})")


@pytest.mark.parametrize("change, reason", [
    ({"release_delay": 1}, "release_delay 1"),
    ({"admission": "reserve"}, "admission 'reserve'"),
    ({"block_size": 3}, "page_size must be at least 4"),
    ({"prefill_chunk": 2}, "no per-row prefill limit"),
])
def test_settings_transformers_cannot_express_are_unsupported(change: dict[str, Any], reason: str) -> None:
    with pytest.raises(NotImplementedError, match=reason):
        adapter.FIFO.simulate([arrival(0, "a", 1, 1)], **{**BASE, **change})


@st.composite
def fitting_workloads(draw: st.DrawFn) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Generated traces and configs the engine can express, every request fitting the pool alone
    (the impossible-request finding is tested on its own below)."""
    trace = draw(strategies.traces(max_requests=6))
    config = draw(strategies.configs())
    config.update(NATIVE, block_size=max(4, config["block_size"]), admission="optimistic")
    need = max(-(-(line["prompt_tokens"] + line["output_tokens"] - 1) // config["block_size"])
               for line in trace if line["event"] == "arrival")
    config["capacity"] = max(config["capacity"], need)
    return trace, config


@pytest.mark.parametrize("impl", ADAPTERS, ids=lambda a: a.scheduler_type)
@settings(max_examples=40, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(workload=fitting_workloads())
def test_generated_fitting_traces_pass_every_clause_unless_they_stall_after_an_eviction(
        impl: Any, workload: tuple[list[dict[str, Any]], dict[str, Any]]) -> None:
    trace, config = workload
    try:
        report = impl.simulate(trace, **config)
    except RuntimeError as exc:  # the eviction stall below; anything else is a new finding
        assert "stalled" in str(exc) and "block_new_requests=True" in str(exc), exc
        return
    assert [str(v) for v in check_report(report, trace, config)] == []


@pytest.mark.parametrize("impl", ADAPTERS, ids=lambda a: a.scheduler_type)
def test_an_impossible_request_is_admitted_and_makes_the_step_raise(impl: Any) -> None:
    """Finding: no length check; the request runs until it is the only active one, then
    prepare_next_batch raises (in the manager: every request in flight fails)."""
    config = {**BASE, "capacity": 1, "token_budget": 1, "max_active": 1}
    with pytest.raises(RuntimeError, match="No requests can be scheduled and no requests can be offloaded"):
        impl.simulate([arrival(0, "r0", 1, 5)], **config)


TWO_DECODING = [arrival(0, "a", 4, 12), arrival(0, "b", 4, 12)]  # on 4 pages: both cannot finish together


@pytest.mark.parametrize("impl", ADAPTERS, ids=lambda a: a.scheduler_type)
def test_the_preemption_victim_is_the_request_that_could_not_get_blocks(impl: Any) -> None:
    """a needs its third page first and is the one offloaded, though it is the oldest; b, which
    had its pages, runs on."""
    report = impl.simulate(TWO_DECODING, **{**BASE, "capacity": 4})
    assert timeline(report, "admit", "preempted", "finished") == [
        (0, "admit", "a"), (1, "admit", "b"), (5, "preempted", "a"), (14, "finished", "b"), (14, "admit", "a"),
        (23, "finished", "a")]


@pytest.mark.parametrize("impl", ADAPTERS, ids=lambda a: a.scheduler_type)
def test_after_an_eviction_nothing_is_admitted_until_a_request_finishes(impl: Any) -> None:
    trace = TWO_DECODING + [arrival(6, "c", 1, 1)]  # c fits at once, yet waits for b's finish
    report = impl.simulate(trace, **{**BASE, "capacity": 5})
    events = timeline(report, "admit", "preempted", "finished")
    evicted = next(t for t, kind, _ in events if kind == "preempted")
    first_finish = next(t for t, kind, _ in events if kind == "finished")
    assert [e for e in events if e[1] == "admit" and evicted <= e[0] < first_finish] == []
    assert (first_finish, "admit", "c") in events or any(k == "admit" and r == "c" and t >= first_finish
                                                         for t, k, r in events)


@pytest.mark.parametrize("impl", ADAPTERS, ids=lambda a: a.scheduler_type)
def test_cancelling_the_running_request_after_an_eviction_stalls_the_evicted_one(impl: Any) -> None:
    """Finding: block_new_requests is set by the eviction and cleared only when a request finishes
    (update_batch); a cancel never clears it, so the evicted request waits forever."""
    trace = TWO_DECODING + [cancel(6, "b")]
    with pytest.raises(RuntimeError, match=r"stalled at tick 6.*block_new_requests=True.*a \(queued\)"):
        impl.simulate(trace, **{**BASE, "capacity": 4})


@pytest.mark.parametrize("impl", ADAPTERS, ids=lambda a: a.scheduler_type)
def test_a_preempted_request_recomputes_without_reemitting_and_the_pool_drains(impl: Any) -> None:
    report = impl.simulate(TWO_DECODING, **{**BASE, "capacity": 4})
    rows = [row for ev in report["events"] if ev["event"] == "dispatch" for row in ev["work"] if row["id"] == "a"]
    assert any(row["phase"] == "recompute" for row in rows)
    indices = [ev["output_index"] for ev in report["events"] if ev["event"] == "token" and ev["id"] == "a"]
    assert indices == list(range(1, 13))
    assert report["summary"]["free_blocks"] == 4
    assert check_report(report, TWO_DECODING, {**BASE, "capacity": 4, "admission": "optimistic"}) == []
