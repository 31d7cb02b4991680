"""The reference scheduler (``reference/scheduler_sim.py``) is the course's published simulator.

Three independent lines of evidence:

* the seed's printed example, its built-in numbers and its five experiments,
  exactly as the course text states them;
* a corpus of fixed traces (``corpus/cases.json``), one per rule of the
  published semantics, whose hand-checked facts are pinned below;
* ``published_model.py``, a naive model written straight from the published
  semantics, must produce the very same report (every event, page id and
  table) on generated and seeded random traces.

The optimistic-admission extension is checked by hand-derived cases and by
thousands of random traces run with the full invariant scan and the contract.
``--run-slow`` multiplies the randomized counts by 10.
"""

from __future__ import annotations

import importlib.util
import json
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings

from pytest_cbatch import strategies
from pytest_cbatch.contract import check_report
from pytest_cbatch.reference.scheduler_sim import DEFAULT_CONFIG, Scheduler, demo_trace, simulate
from pytest_cbatch.runner import first_difference

from .published_model import published_report

ROOT = Path(__file__).resolve().parents[2]
REFERENCE_DIR = ROOT / "reference"
CORPUS = json.loads((Path(__file__).parent / "corpus" / "cases.json").read_text(encoding="utf-8"))
SUBPROCESS_ENV = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}

# The seed's printed example, verbatim.
SEED_EXAMPLE = """\
from scheduler_sim import demo_trace, simulate

report = simulate(demo_trace())
assert report["time_unit"] == "synthetic_tick"
assert report["requests"]["long"]["token_times"] == [4, 5, 6, 7]
assert report["requests"]["cancel-me"]["ttft_ticks"] is None
assert report["summary"] == {
    "drained_at_tick": 8, "dispatches": 7,
    "processed_input_tokens": 19, "free_blocks": 8,
    "finished": 3, "cancelled": 1, "rejected": 0,
}
assert report == simulate(demo_trace())
print("deterministic trace and complete cleanup: OK")
"""


def arrival(time: int, rid: str, prompt: int, output: int) -> dict[str, Any]:
    return {"time": time, "event": "arrival", "id": rid, "prompt_tokens": prompt, "output_tokens": output}


def cancel(time: int, rid: str) -> dict[str, Any]:
    return {"time": time, "event": "cancel", "id": rid}


def of_kind(report: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    return [e for e in report["events"] if e["event"] == kind]


def rows_of(report: dict[str, Any], rid: str) -> list[tuple[int, str, int]]:
    """(tick, phase, input_tokens) of every dispatch row of ``rid``."""
    return [(e["time"], row["phase"], row["input_tokens"])
            for e in of_kind(report, "dispatch") for row in e["work"] if row["id"] == rid]


def snapshot_at(report: dict[str, Any], time: int) -> dict[str, Any]:
    (snap,) = [e for e in of_kind(report, "snapshot") if e["time"] == time]
    return snap


def full(**overrides: Any) -> dict[str, Any]:
    return {k: v for k, v in {**DEFAULT_CONFIG, **overrides}.items() if k != "admission"}


def checked(trace: list[dict[str, Any]], **config: Any) -> dict[str, Any]:
    """simulate(check=True); the report must satisfy every clause of the contract."""
    report = simulate(trace, check=True, **config)
    assert check_report(report, trace, {**full(), **config}) == []
    return report


@pytest.fixture
def scale(request: pytest.FixtureRequest) -> int:
    return 10 if request.config.getoption("--run-slow", default=False) else 1


# -- the seed ------------------------------------------------------------------------
def test_seed_example_runs_verbatim_beside_the_module():
    done = subprocess.run([sys.executable, "-c", SEED_EXAMPLE], cwd=REFERENCE_DIR, capture_output=True, text=True,
                          env=SUBPROCESS_ENV, timeout=60)
    assert (done.returncode, done.stdout, done.stderr) == (0, "deterministic trace and complete cleanup: OK\n", "")


def test_module_loads_by_file_path_alone_from_another_directory(tmp_path):
    # As the course's own tests load it: spec_from_file_location, its folder not on sys.path.
    script = f"""
import importlib.util, sys
spec = importlib.util.spec_from_file_location("student_sim", {str(REFERENCE_DIR / "scheduler_sim.py")!r})
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
assert {{"PagedKV", "validate_trace", "simulate", "demo_trace", "main"}} <= set(dir(module))
print(module.simulate(module.demo_trace())["summary"]["dispatches"])
"""
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True,
                          env={**SUBPROCESS_ENV, "PYTHONPATH": ""}, timeout=60)
    assert (done.returncode, done.stdout.strip(), done.stderr) == (0, "7", "")


def test_builtin_result_matches_the_seed():
    report = checked(demo_trace())
    assert report["time_unit"] == "synthetic_tick"
    assert report["summary"] == {"drained_at_tick": 8, "dispatches": 7, "processed_input_tokens": 19,
                                 "free_blocks": 8, "finished": 3, "cancelled": 1, "rejected": 0}
    fed = {rid: sum(n for _, _, n in rows_of(report, rid)) for rid in report["requests"]}
    assert fed == {"long": 11, "short": 3, "cancel-me": 1, "late": 4}
    assert report["requests"]["long"]["token_times"] == [4, 5, 6, 7]
    assert report["requests"]["cancel-me"]["ttft_ticks"] is None
    assert report["requests"]["short"]["token_times"][-1] == 2 and report["summary"]["drained_at_tick"] == 8
    # All eight pages reusable at tick 8, one tick after the last response (long, t=7).
    assert snapshot_at(report, 8)["free_blocks"] == 8 and report["requests"]["long"]["end"] == 7


def test_builtin_serial_run():
    report = checked(demo_trace(), policy="serial")
    assert report["summary"] == {"drained_at_tick": 13, "dispatches": 12, "processed_input_tokens": 18,
                                 "free_blocks": 8, "finished": 3, "cancelled": 1, "rejected": 0}
    assert all(len(s["active"]) <= 1 for s in of_kind(report, "snapshot"))


def test_experiment1_reservation_queues_the_second_despite_free_pages():
    report = checked([arrival(0, "big", 1, 8), arrival(0, "small", 1, 1)], capacity=2)
    snap = snapshot_at(report, 0)
    assert (snap["reserved_blocks"], snap["free_blocks"], snap["admission_headroom"]) == (2, 2, 0)
    # Blocked on every tick it waits, until big's pages are released at 9.
    blocked = [e["time"] for e in of_kind(report, "admission_blocked")]
    assert blocked == list(range(0, 9)) and all(e["required_blocks"] == 1 for e in of_kind(report, "admission_blocked"))
    assert report["requests"]["small"]["admitted"] == 9


@pytest.mark.parametrize(("delay", "admitted"), [(3, 4), (0, 1)])
def test_experiment2_release_delay_gates_reuse(delay, admitted):
    report = checked([arrival(0, "first", 1, 1), arrival(0, "second", 1, 1)], capacity=1, release_delay=delay)
    assert report["requests"]["first"]["end"] == 1
    assert report["requests"]["second"]["admitted"] == admitted


def test_experiment3_boundary_races():
    won = checked([arrival(0, "r", 1, 1), cancel(1, "r")])
    assert [(e["event"], e.get("status")) for e in won["events"] if e["event"] in ("finished", "cancel_ignored")] == [
        ("finished", None), ("cancel_ignored", "finished")]
    lost = checked([arrival(0, "r", 1, 1), cancel(0, "r")])
    assert of_kind(lost, "cancelled") and not of_kind(lost, "dispatch") and not of_kind(lost, "release")
    assert lost["requests"]["r"]["ttft_ticks"] is None


def test_experiment4_decode_can_take_the_whole_budget():
    report = checked([arrival(0, "a", 1, 3), arrival(0, "b", 1, 3), arrival(0, "c", 2, 2)], token_budget=1)
    assert all(sum(row["input_tokens"] for row in e["work"]) == 1 for e in of_kind(report, "dispatch"))
    times = {rid: row["token_times"] for rid, row in report["requests"].items()}
    assert times["a"][0] == 1 and times["c"][0] > times["a"][-1]  # c's prefill waits behind the decodes


def test_experiment5_impossible_is_rejected_and_duplicates_refused():
    report = checked([arrival(0, "ok", 2, 2), arrival(0, "huge", 40, 4)], capacity=4)
    assert report["requests"]["huge"]["status"] == "rejected" and report["summary"]["rejected"] == 1
    with pytest.raises(ValueError, match="duplicate request id 'a'"):
        simulate([arrival(0, "a", 1, 1), arrival(1, "a", 1, 1)])


# -- the corpus: one fixed trace per published rule, facts checked by hand --------------
@pytest.mark.parametrize("name", sorted(CORPUS))
def test_corpus_case_is_reproduced_exactly(name):
    case = CORPUS[name]
    report = simulate(case["trace"], **case["config"])
    assert first_difference(report, case["report"]) is None
    assert first_difference(published_report(case["trace"], case["config"]), case["report"]) is None
    assert check_report(report, case["trace"], case["config"]) == []


def _case(name: str) -> dict[str, Any]:
    return CORPUS[name]["report"]


def test_corpus_facts_checked_by_hand():
    # Trace order: sorted by (time, cancel last) whatever the file order.
    r = _case("unsorted_trace_cancel_listed_first")
    assert [(e["time"], e["event"], e["id"]) for e in r["events"] if e["event"] in ("arrival", "cancelled")] == [
        (0, "arrival", "a"), (1, "arrival", "b"), (1, "cancelled", "b")]
    assert "b" not in {e.get("id") for e in of_kind(r, "release")}  # cancelled while queued: no release
    # A snapshot at t=0 although the first arrival comes at t=5; then the clock jumps.
    r = _case("late_start_initial_snapshot")
    assert [e["time"] for e in of_kind(r, "snapshot")][:2] == [0, 5] and r["events"][0]["event"] == "snapshot"
    # Decode rotation: at t=2 the two decoders start from decode_turn % 2 = 1.
    r = _case("decode_rotation_offset")
    assert [(t, p) for t, p, _ in rows_of(r, "c")][:3] == [(1, "prefill"), (2, "decode"), (3, "decode")]
    assert [row["id"] for row in of_kind(r, "dispatch")[2]["work"]] == ["c", "b"]
    # Prefill rotation: each dispatch starts one request further on.
    r = _case("prefill_rotation")
    assert [[row["id"] for row in d["work"]] for d in of_kind(r, "dispatch")][:4] == [
        ["p", "q"], ["r", "p"], ["q", "r"], ["p", "q"]]
    # Page ids: the lowest free id, reused after a release.
    r = _case("lowest_free_page_reuse")
    assert snapshot_at(r, 2)["block_tables"] == {"c": [0]}
    # Pages are allocated while the dispatch runs: the snapshot before it shows the table before the write.
    r = _case("builtin")
    assert snapshot_at(r, 0)["block_tables"] == {"long": [], "short": []}
    assert snapshot_at(r, 1)["block_tables"] == {"long": [0], "short": [1], "cancel-me": []}
    assert snapshot_at(r, 2)["block_tables"] == {"long": [0], "short": [1], "cancel-me": [2], "late": []}
    assert snapshot_at(r, 5)["block_tables"]["long"] == [0, 3, 1]
    assert snapshot_at(r, 2)["active"] == ["long", "late"] and snapshot_at(r, 2)["queued"] == []
    # admission_blocked on every tick the head waits.
    r = _case("admission_blocked_every_tick")
    assert len(of_kind(r, "admission_blocked")) == 9
    # An impossible request is rejected when it reaches the head with a free slot (serial: after first ends).
    r = _case("impossible_rejected_at_head")
    assert [e["time"] for e in of_kind(r, "rejected")] == [r["requests"]["first"]["end"]]
    assert r["requests"]["next"]["admitted"] == r["requests"]["first"]["end"]
    # ... and a cancel that reaches it first wins: cancelled, never admitted.
    r = _case("impossible_cancelled_before_head")
    assert r["requests"]["huge"]["status"] == "cancelled" and r["requests"]["huge"]["admitted"] is None
    assert r["summary"]["rejected"] == 0
    # Releases due at one time go in id order, whatever the retire order.
    r = _case("release_order_by_time_then_id")
    assert [e["id"] for e in of_kind(r, "finished")] == ["b", "a"]
    assert [e["id"] for e in of_kind(r, "release")] == ["a", "b"]
    # A cancel after completion, twice: both ignored with the status it ended with.
    r = _case("cancel_ignored_after_finish")
    assert [(e["time"], e["status"]) for e in of_kind(r, "cancel_ignored")] == [(1, "finished"), (1, "finished")]
    r = _case("cancel_queued_no_release")
    assert r["requests"]["b"]["status"] == "cancelled" and [e["id"] for e in of_kind(r, "release")] == ["a"]


# -- the independent model, on generated and random traces ------------------------------
def _random_case(rng: random.Random) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    lines: list[dict[str, Any]] = []
    for k in range(rng.randint(0, 7)):
        t = rng.randint(0, 6)
        lines.append(arrival(t, f"r{k}", rng.randint(1, 9), rng.randint(1, 6)))
        while rng.random() < 0.3:
            lines.append(cancel(t + rng.randint(0, 5), f"r{k}"))
    rng.shuffle(lines)  # file order is free: the simulator sorts
    config = {"capacity": rng.randint(1, 8), "block_size": rng.randint(1, 4), "token_budget": rng.randint(1, 6),
              "max_active": rng.randint(1, 4), "prefill_chunk": rng.randint(1, 4),
              "release_delay": rng.randint(0, 3), "policy": rng.choice(["continuous", "serial"])}
    return lines, config


def test_random_traces_match_the_published_model_event_for_event(scale):
    for seed in range(1500 * scale):
        trace, config = _random_case(random.Random(seed))
        got, want = simulate(trace, **config), published_report(trace, config)
        assert got == want, (seed, config, trace, first_difference(got, want))


@settings(max_examples=150, derandomize=True, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(workload=strategies.workloads())
def test_generated_workloads_match_the_published_model(workload):
    trace, config = workload
    assert simulate(trace, **config) == published_report(trace, config)


# -- the incremental form -----------------------------------------------------------------
def test_scheduler_steps_tick_by_tick_with_the_same_tokens():
    sched = Scheduler(capacity=8, block_size=4)
    sched.arrive("long", 8, 4)
    sched.arrive("short", 2, 2)
    tokens: list[tuple[int, str]] = []
    for _ in range(20):
        if sched.now == 1:
            sched.arrive("cancel-me", 6, 4)
        if sched.now == 2:
            sched.arrive("late", 3, 2)
            sched.cancel("cancel-me")
        tokens += [(e["time"], e["id"]) for e in sched.step() if e["event"] == "token"]
    batch = simulate(demo_trace())
    assert tokens == [(e["time"], e["id"]) for e in of_kind(batch, "token")]
    stats = sched.pool_stats()
    assert stats["free_blocks"] == 8 and stats["running"] == [] and stats["waiting"] == [] and not sched.busy
    with pytest.raises(ValueError, match="id"):
        sched.arrive("long", 1, 1)


# -- optimistic admission (our extension) ----------------------------------------------
def test_optimistic_preempts_the_newest_and_recomputes_without_reemitting():
    # Two pages of two rows; each claims only its prompt's page.  At t=1 both decode
    # rows need a second page and none is free: b, the newest, is preempted.  It is
    # re-admitted after a's release at 4 (needing 2 + 1 rows = 2 pages), recomputes its
    # 2 committed rows (no token) and emits only outputs 2 and 3.
    report = checked([arrival(0, "a", 2, 3), arrival(0, "b", 2, 3)], admission="optimistic", capacity=2,
                     block_size=2)
    assert of_kind(report, "preempted") == [{"time": 1, "event": "preempted", "id": "b", "released_blocks": 1}]
    assert rows_of(report, "b") == [(0, "prefill", 2), (4, "recompute", 2), (5, "decode", 1), (6, "decode", 1)]
    assert [(e["time"], e["output_index"]) for e in of_kind(report, "token") if e["id"] == "b"] == [
        (1, 1), (6, 2), (7, 3)]
    # The page a's coming decode claims counts as reserved in the snapshot before it.
    assert (snapshot_at(report, 1)["reserved_blocks"], snapshot_at(report, 1)["block_tables"]) == (2, {"a": [0]})
    assert report["config"]["admission"] == "optimistic"


def test_optimistic_lone_request_waits_for_draining_pages_instead_of_yielding():
    report = checked([arrival(0, "first", 1, 1), arrival(1, "second", 1, 2)], capacity=2, block_size=1,
                     release_delay=2, admission="optimistic")
    assert not of_kind(report, "preempted")
    assert [e["time"] for e in of_kind(report, "dispatch")] == [0, 1, 3]
    assert report["requests"]["second"]["token_times"] == [2, 4]


def test_thousands_of_random_traces_drain_and_satisfy_the_contract(scale):
    seen: set[str] = set()
    for seed in range(1500 * scale):
        rng = random.Random(f"opt-{seed}")
        trace, config = _random_case(rng)
        config["admission"] = rng.choice(["reserve", "optimistic"])
        report = checked(trace, **config)
        assert report["summary"]["free_blocks"] == config["capacity"]
        seen |= {e["event"] for e in report["events"]} | {
            row["phase"] for e in of_kind(report, "dispatch") for row in e["work"]}
    assert {"rejected", "cancelled", "cancel_ignored", "admission_blocked", "preempted", "recompute"} <= seen


def test_installed_module_is_the_checkout_file():
    spec = importlib.util.find_spec("pytest_cbatch.reference.scheduler_sim")
    assert spec is not None and Path(spec.origin).resolve() == (REFERENCE_DIR / "scheduler_sim.py").resolve()
