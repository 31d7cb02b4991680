"""The schedule executor: bookkeeping, validation, the built-in planner, numerics."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="gpu_checks need torch")

from pytest_cbatch.gpu_checks.engine import BUGS, EngineConfig, ScheduleError, peak_pages, run_schedule  # noqa: E402
from pytest_cbatch.gpu_checks.metrics import compare  # noqa: E402
from pytest_cbatch.gpu_checks.model import PRESETS, Model  # noqa: E402
from pytest_cbatch.gpu_checks.oracle import dense_records  # noqa: E402
from pytest_cbatch.gpu_checks.schedules import alone_schedule, boundary_trace, fcfs_schedule  # noqa: E402
from pytest_cbatch.gpu_checks.streams import Streams  # noqa: E402
from pytest_cbatch.reference.scheduler_sim import demo_trace, simulate  # noqa: E402

TRACE = [{"time": 0, "event": "arrival", "id": "a", "prompt_tokens": 9, "output_tokens": 4},
         {"time": 0, "event": "arrival", "id": "b", "prompt_tokens": 3, "output_tokens": 6}]


@pytest.fixture(scope="module")
def model() -> Model:
    return Model.from_seed(PRESETS["tiny"], 0, torch.float64)


def _streams(model: Model, trace: list[dict[str, Any]]) -> Streams:
    return Streams.from_trace(trace, model.config.vocab, seed=0)


def _dispatch(*rows: tuple[str, str, int]) -> dict[str, Any]:
    return {"time": 0, "event": "dispatch", "work": [{"id": r, "phase": p, "input_tokens": n} for r, p, n in rows]}


def test_demo_schedule_matches_the_dense_oracle(model: Model) -> None:
    report = simulate(demo_trace())
    streams = _streams(model, demo_trace())
    rec = run_schedule(model, streams, report["events"], EngineConfig(block_size=4))
    m = compare(rec, dense_records(model, streams, sorted(set(rec.request))), flip_margin=0.5)
    assert m.finite and m.max_abs < 1e-12 and m.n_positions == len(rec) > 0


@pytest.mark.parametrize("events,message", [
    ([_dispatch(("zz", "prefill", 1))], "unknown request"),
    ([_dispatch(("a", "prefill", 13))], "only 12 can be fed"),
    ([_dispatch(("a", "prefill", 2), ("a", "prefill", 2))], "twice"),
    ([_dispatch(("b", "prefill", 2)), {"event": "finished", "id": "b"}, _dispatch(("b", "decode", 1))], "ended"),
    ([_dispatch(("a", "prefill", 0))], "positive integer"),
])
def test_unexecutable_reports_are_refused(model: Model, events: list[dict[str, Any]], message: str) -> None:
    with pytest.raises(ScheduleError, match=message):
        run_schedule(model, _streams(model, TRACE), events, EngineConfig(block_size=4))


def test_preemption_resets_the_request_and_recompute_refeeds_it(model: Model) -> None:
    events = [_dispatch(("a", "prefill", 6)), {"event": "preempted", "id": "a"},
              _dispatch(("a", "recompute", 6)), _dispatch(("a", "prefill", 3))]
    rec = run_schedule(model, _streams(model, TRACE), events, EngineConfig(block_size=4))
    assert rec.position == list(range(6)) + list(range(9))
    assert rec.phase == ["prefill#0"] * 6 + ["recompute#0"] * 6 + ["prefill#1"] * 3
    assert torch.allclose(rec.logits[:6], rec.logits[6:12], atol=1e-12)


def test_pages_are_freed_at_release_when_the_report_has_one(model: Model) -> None:
    streams = _streams(model, TRACE)
    done = [_dispatch(("a", "prefill", 8)), {"event": "finished", "id": "a"}, _dispatch(("b", "prefill", 8))]
    assert peak_pages(streams, done, 4) == 2
    assert peak_pages(streams, done[:2] + [{"event": "release", "id": "a"}, done[2]], 4) == 2
    assert peak_pages(streams, done + [{"event": "release", "id": "a"}], 4) == 4


def test_a_huge_number_in_a_report_sizes_nothing_before_it_is_validated(model: Model) -> None:
    import tracemalloc

    streams = _streams(model, TRACE)
    forged = [_dispatch(("a", "prefill", 8)), _dispatch(("b", "prefill", 40_000_000))]
    tracemalloc.start()
    try:
        with pytest.raises(ScheduleError, match="feeds positions"):
            peak_pages(streams, forged, 4)
        _now, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20  # the pool is the trace's size; sized from the report's 40,000,000 it took 1.8 GB


def test_engine_config_is_validated() -> None:
    with pytest.raises(ValueError):
        EngineConfig(pool="huge")
    with pytest.raises(ValueError):
        EngineConfig(bugs=frozenset({"no_such_bug"}))
    assert len(BUGS) >= 10


def test_batch_invariant_mode_is_bitwise_equal_to_each_request_alone(model: Model) -> None:
    streams = _streams(model, TRACE)
    report = fcfs_schedule(TRACE, token_budget=5, prefill_chunk=3, max_active=2)
    cfg = EngineConfig(block_size=4, numerics="batch_invariant")
    batched = run_schedule(model, streams, report["events"], cfg)
    alone = run_schedule(model, streams, alone_schedule({"a": 12, "b": 8}), cfg)
    assert compare(batched, alone, flip_margin=0.5).bitwise_frac == 1.0


def test_fcfs_planner_feeds_every_position_once_per_incarnation() -> None:
    trace = boundary_trace(6, block_size=4, chunk=5, max_len=20, seed=3)
    report = fcfs_schedule(trace, token_budget=7, prefill_chunk=5, max_active=3, block_size=4,
                           preempt=[("r1", 2), ("r1", 1)])
    kinds = Counter(e["event"] for e in report["events"])
    assert kinds["preempted"] == 2 and kinds["finished"] == kinds["release"] == 6
    fed: dict[str, int] = {}
    for e in report["events"]:
        if e["event"] == "dispatch":
            assert sum(w["input_tokens"] for w in e["work"]) + e["unused_budget"] == 7
            for w in e["work"]:
                fed[w["id"]] = fed.get(w["id"], 0) + w["input_tokens"]
        elif e["event"] == "preempted":
            fed[e["id"]] = 0
    assert fed == {line["id"]: line["prompt_tokens"] + line["output_tokens"] - 1 for line in trace}


def test_fcfs_planner_refuses_a_preemption_that_never_fires() -> None:
    with pytest.raises(ValueError, match="never fired"):
        fcfs_schedule(TRACE, token_budget=8, prefill_chunk=4, max_active=2, preempt=[("b", 50)])
