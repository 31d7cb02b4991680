"""The vLLM adapter (examples/vllm): vLLM's real V1 scheduler through the contract.

Runs only where vLLM and the adapter are installed (``.ci/vllm-venv`` builds
that environment; ``.ci/vllm-job`` runs this file there).  Elsewhere the whole
module is skipped with the reason.

Beyond the conformance suite (which skips every workload with release_delay
other than 0, the suite's default), these tests run every fixed workload and
generated traces at release_delay 0 and check that each violation is one of
the two documented deviations of examples/vllm/cbatch-expect.toml, and that
both really occur.  They also run one-edit bugs of vLLM's scheduler (the fork
campaign's edits, ``cbatch_vllm.fork_edits``) with vLLM's assertions stripped
and check that each fails the clause that judges what it breaks.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed here: build its venv with .ci/vllm-venv "
                                   "and run .ci/vllm-job")
adapter = pytest.importorskip("cbatch_vllm.adapter", reason="the vLLM adapter is not installed: "
                                                            "pip install -e examples/vllm")

from engine_findings import unexplained  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from cbatch_vllm import engine, fork  # noqa: E402
from cbatch_vllm.fork_edits import SCHEDULER, edit_named  # noqa: E402
from cbatch_vllm.worker_view import WorkerView  # noqa: E402

from pytest_cbatch import strategies  # noqa: E402
from pytest_cbatch.contract import Violation, check_report  # noqa: E402
from pytest_cbatch.impls import resolve_impl  # noqa: E402
from pytest_cbatch.workloads import WORKLOADS  # noqa: E402

ZERO_DELAY = {name: (list(w.trace), {**w.config, "release_delay": 0, "admission": "optimistic"})
              for name, w in WORKLOADS.items()}


def _run(trace: list[dict[str, Any]], config: dict[str, Any]) -> dict[str, Any]:
    return adapter.simulate(trace, **config)


def _deviation(v: Violation, report: dict[str, Any], trace: list[dict[str, Any]]) -> str | None:
    """Which documented deviation explains ``v`` ("lone_prefill", "max_model_len"), or None."""
    cfg = report["config"]
    if v.clause == "row_shape" and "exceeds prefill_chunk" in v.message and v.event_index is not None:
        snap = next(ev for ev in reversed(report["events"][:v.event_index]) if ev["event"] == "snapshot")
        return "lone_prefill" if len(snap["active"]) + len(snap["queued"]) == 1 else None
    line = next((x for x in trace if x["event"] == "arrival" and x["id"] == v.request), None)
    if line is None or line["prompt_tokens"] + line["output_tokens"] <= cfg["capacity"] * cfg["block_size"]:
        return None
    if v.clause == "impossible_rejected":
        return "max_model_len"
    if v.clause == "finished_outputs_complete":
        row = report["requests"][v.request]
        finished = next(ev for ev in report["events"] if ev["event"] == "finished" and ev["id"] == v.request)
        at_limit = line["prompt_tokens"] + row["output_tokens"] == cfg["capacity"] * cfg["block_size"]
        return "max_model_len" if at_limit and finished.get("reason") == "length" else None
    return None


def _unexplained(trace: list[dict[str, Any]], config: dict[str, Any], seen: set[str]) -> list[str]:
    return unexplained(_run(trace, config), trace, config, _deviation, seen)


def test_the_entry_point_resolves_to_the_adapter() -> None:
    assert resolve_impl("vllm").namespace is adapter


@pytest.mark.parametrize("change, reason", [
    ({"release_delay": 1}, "release_delay 1"),
    ({"admission": "reserve"}, "admission 'reserve'"),
    ({"capacity": 4096, "block_size": 8}, "exceeds the model's max_position_embeddings"),
])
def test_settings_vllm_cannot_express_are_unsupported(change: dict[str, Any], reason: str) -> None:
    trace, config = ZERO_DELAY["demo"]
    with pytest.raises(NotImplementedError, match=reason):
        _run(trace, {**config, **change})


def test_config_mapping() -> None:
    base = {**ZERO_DELAY["demo"][1], "capacity": 8, "block_size": 4, "token_budget": 3, "max_active": 5,
            "prefill_chunk": 64}
    got = adapter.engine_settings(base)
    assert (got.num_blocks, got.max_model_len, got.max_num_batched_tokens) == (9, 32, 3)
    assert got.max_num_seqs == 3                      # vLLM refuses max_num_batched_tokens < max_num_seqs
    assert got.long_prefill_token_threshold == 32     # vLLM refuses a threshold above max_model_len
    assert adapter.engine_settings({**base, "policy": "serial"}).max_num_seqs == 1


def test_invalid_input_is_refused() -> None:
    trace, config = ZERO_DELAY["demo"]
    with pytest.raises(ValueError, match="prompt_tokens"):
        _run([{**trace[0], "prompt_tokens": 0}], config)
    with pytest.raises(ValueError, match="capacity"):
        _run(trace, {**config, "capacity": 0})


def test_blocks_are_allocated_inside_schedule_so_the_snapshot_shows_them() -> None:
    trace, config = ZERO_DELAY["demo"]
    events = _run(trace, config)["events"]
    first = next(i for i, ev in enumerate(events) if ev["event"] == "dispatch")
    snap = events[first - 1]
    assert snap["event"] == "snapshot" and snap["time"] == events[first]["time"] == 0
    for row in events[first]["work"]:
        assert len(snap["block_tables"][row["id"]]) == -(-row["input_tokens"] // config["block_size"])


def test_preemption_takes_the_newest_running_request_and_recomputes_it() -> None:
    trace, config = ZERO_DELAY["preempt_decode"]
    report = _run(trace, config)
    events = report["events"]
    preempted = [ev for ev in events if ev["event"] == "preempted"]
    assert preempted, "the workload is built to run the pool dry"
    admits = [ev["id"] for ev in events if ev["event"] == "admit" and ev["time"] <= preempted[0]["time"]]
    assert preempted[0]["id"] == admits[-1]
    victim = preempted[0]["id"]
    rows = [row["phase"] for ev in events if ev["event"] == "dispatch" for row in ev["work"] if row["id"] == victim]
    assert "recompute" in rows
    assert check_report(report, trace, config) == []


def test_cancel_frees_at_once_and_a_repeat_is_ignored() -> None:
    trace, config = ZERO_DELAY["duplicate_cancel"]
    events = [ev for ev in _run(trace, config)["events"] if ev.get("id") == "a"]
    kinds = [(ev["time"], ev["event"]) for ev in events if ev["event"] in ("cancelled", "release", "cancel_ignored")]
    assert kinds == [(1, "cancelled"), (1, "release"), (1, "cancel_ignored"), (5, "cancel_ignored")]
    assert all(ev["status"] == "cancelled" for ev in events if ev["event"] == "cancel_ignored")


def test_a_request_cancelled_in_its_arrival_tick_never_runs_and_holds_nothing() -> None:
    trace, config = ZERO_DELAY["cancel_same_tick"]
    kinds = [ev["event"] for ev in _run(trace, config)["events"] if ev.get("id") == "r"]
    assert kinds == ["arrival", "cancelled"]


def test_a_prompt_of_max_model_len_tokens_is_rejected_by_the_front_end() -> None:
    trace, config = ZERO_DELAY["impossible"]
    rejected = [ev for ev in _run(trace, config)["events"] if ev["event"] == "rejected"]
    assert [ev["id"] for ev in rejected] == ["huge"]
    assert "longer than the maximum model length of 16" in rejected[0]["reason"]


def test_runs_are_deterministic() -> None:
    trace, config = ZERO_DELAY["preempt_tight"]
    assert _run(trace, config) == _run(trace, config)


def test_fixed_workloads_at_release_delay_0_deviate_only_as_documented() -> None:
    seen: set[str] = set()
    problems = {name: found for name, (trace, config) in ZERO_DELAY.items()
                if (found := _unexplained(trace, config, seen))}
    assert problems == {}
    assert seen == {"lone_prefill", "max_model_len"}  # both documented deviations really occur


@settings(max_examples=60, derandomize=True, database=None, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(workload=strategies.workloads(admissions=["optimistic"]))
def test_generated_traces_deviate_only_as_documented(workload: tuple[list[dict[str, Any]], dict[str, Any]]) -> None:
    trace, config = workload
    config = {**config, "release_delay": 0}
    assert _unexplained(trace, config, set()) == []


# -- what the workers see ------------------------------------------------------------------------------------


def _cached(req_ids: list[str], new_block_ids: list[Any], resumed: set[str] = frozenset()) -> SimpleNamespace:
    return SimpleNamespace(req_ids=req_ids, new_block_ids=new_block_ids, resumed_req_ids=set(resumed))


def _output(new: list[tuple[str, list[int]]] = (), cached: SimpleNamespace | None = None, preempted: set[str] = (),
            finished: set[str] = ()) -> SimpleNamespace:
    return SimpleNamespace(scheduled_new_reqs=[SimpleNamespace(req_id=rid, block_ids=(ids,)) for rid, ids in new],
                           scheduled_cached_reqs=cached or _cached([], []), preempted_req_ids=set(preempted),
                           finished_req_ids=set(finished))


def test_the_worker_view_builds_tables_as_the_model_runner_does() -> None:
    view = WorkerView()
    view.update(_output(new=[("a", [1, 2]), ("b", [3])]))
    view.update(_output(cached=_cached(["a", "b"], [([4],), None])))
    assert view.tables() == {"a": [1, 2, 4], "b": [3]}          # appended; None adds nothing
    view.update(_output(preempted={"b"}))
    assert view.tables() == {"a": [1, 2, 4]}                    # a preempted request's stale table is unused
    view.update(_output(cached=_cached(["b"], [([5, 6],)], resumed={"b"})))
    assert view.tables()["b"] == [5, 6]                         # resumed: the new blocks replace the table
    view.update(_output(preempted={"a"}))
    view.update(_output(cached=_cached(["a"], [([7, 8, 9],)])))  # resumed but not flagged so
    assert view.tables()["a"] == [1, 2, 4, 7, 8, 9]             # the runner appends to its stale table
    view.update(_output(finished={"a"}))
    assert view.tables() == {"b": [5, 6]}


def test_on_the_clean_engine_the_workers_tables_are_the_kv_cache_managers(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[dict[str, list[int]], dict[str, list[int]]]] = []
    update = WorkerView.update

    def compare(view: WorkerView, out: Any) -> None:
        update(view, out)
        sched = current[0]
        running = {req.request_id for req in sched.running}
        seen.append((view.tables(), {rid: ids for rid, ids in engine.held_blocks(sched).items() if rid in running}))

    current: list[Any] = []
    new_scheduler = engine.new_scheduler
    monkeypatch.setattr(engine, "new_scheduler", lambda s: current.append(new_scheduler(s)) or current[-1])
    monkeypatch.setattr(WorkerView, "update", compare)
    for name in ("preempt_decode", "preempt_tight", "cancel_mid_prefill"):
        current.clear()
        _run(*ZERO_DELAY[name])
    assert seen and all(worker == manager for worker, manager in seen)
    assert any(len(worker) > 1 for worker, _ in seen)


def test_token_indices_are_the_engines_output_positions() -> None:
    trace, config = ZERO_DELAY["preempt_decode"]
    report = _run(trace, config)
    for rid, row in report["requests"].items():
        indices = [ev["output_index"] for ev in report["events"] if ev["event"] == "token" and ev["id"] == rid]
        assert indices == list(range(1, row["output_tokens"] + 1))


def test_the_drain_snapshot_shows_the_engine_holding_nothing() -> None:
    trace, config = ZERO_DELAY["cancel_mid_prefill"]
    events = _run(trace, config)["events"]
    last = events[-1]
    assert last["event"] == "snapshot" and last["time"] == events[-2]["time"]
    assert (last["active"], last["queued"], last["block_tables"], last["free_blocks"]) == ([], [], {},
                                                                                           config["capacity"])


# -- one-edit bugs of vLLM's scheduler -----------------------------------------------------------------------


@pytest.fixture
def edited(monkeypatch: pytest.MonkeyPatch) -> Any:
    """``edited(name)``: the adapter drives vLLM's scheduler with the campaign edit ``name`` applied
    and vLLM's assertions stripped from the edited module (as ``python -O`` strips them)."""
    def apply(name: str) -> None:
        edit = edit_named(name)
        assert edit.module == SCHEDULER
        source = fork.apply(fork.module_file(SCHEDULER).read_text(encoding="utf-8"), edit)
        monkeypatch.setattr(engine, "Scheduler", fork.load_module(SCHEDULER, source, strip_asserts=True).Scheduler)
    return apply


def _clauses(names: tuple[str, ...]) -> dict[str, set[str]]:
    """The clauses each fixed workload in ``names`` fails at release_delay 0."""
    return {name: {v.clause for v in check_report(_run(*ZERO_DELAY[name]), *ZERO_DELAY[name])} for name in names}


@pytest.mark.parametrize("name, workloads, clause", [
    # the runner appends the first resumed request's new blocks to its stale table: pages it no longer owns
    ("resumed_flag_off_by_one", ("preempt_decode", "preempt_tight"), "pages_conserved"),
    ("resumed_flag_off_by_one", ("preempt_decode", "preempt_tight"), "pages_cover_rows"),
    # the aborted waiting request stays in Scheduler.requests: vLLM still holds a request that ended
    ("abort_waiting_never_freed", ("demo_serial", "cancel_same_tick"), "snapshot_counts"),
    # the aborted running request keeps its blocks to the end
    ("abort_running_never_freed", ("demo", "cancel_mid_prefill"), "no_leaked_pages"),
    # the workers never hear that a request finished and keep computing on its old table
    ("finished_not_told_to_workers", ("demo",), "pages_conserved"),
    # the same token reaches the client twice
    ("token_resent", ("demo",), "no_duplicate_emission"),
])
def test_a_scheduler_bug_fails_its_clause_with_vllms_assertions_off(edited: Any, name: str,
                                                                     workloads: tuple[str, ...], clause: str) -> None:
    assert all(clause not in found for found in _clauses(workloads).values())  # the clean engine
    edited(name)
    found = _clauses(workloads)
    assert all(clause in hit for hit in found.values()), found
