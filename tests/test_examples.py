"""The example adapters: correct schedulers that make other legitimate choices than the reference
(shortest-job-first; engine-style) pass every clause, in process and behind the exec protocol."""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pytest_cbatch import strategies
from pytest_cbatch.contract import check_report
from pytest_cbatch.examples import course_scheduler, engine_scheduler
from pytest_cbatch.examples.sjf_scheduler import simulate
from pytest_cbatch.impls import Implementation, PythonImplementation, resolve_impl
from pytest_cbatch.reference.scheduler_sim import simulate as reference_simulate
from pytest_cbatch.runner import ALL_CLAUSES, Judge
from pytest_cbatch.workloads import BASE_CONFIG, INVALID_INPUTS, WORKLOADS

EXEC_SCRIPT = Path(__file__).resolve().parent.parent / "examples" / "exec_scheduler.py"

RESERVE = sorted(name for name, w in WORKLOADS.items() if "admission" not in w.config)
OPTIMISTIC = sorted(name for name, w in WORKLOADS.items() if "admission" in w.config)

TraceAndConfig = tuple[list[dict[str, Any]], dict[str, Any]]


def exec_impl(*python_flags: str) -> Implementation:
    """The exec script as the kit runs it: ``exec:<this interpreter> [flags] <script>``."""
    argv = [sys.executable, *python_flags, str(EXEC_SCRIPT)]
    return resolve_impl("exec:" + " ".join(shlex.quote(arg) for arg in argv))


def admissions(report: dict[str, Any]) -> list[str]:
    """Request ids in the order they were admitted."""
    return [ev["id"] for ev in report["events"] if ev["event"] == "admit"]


CORRECT = {"sjf": simulate, "engine": engine_scheduler.simulate, "reference": reference_simulate,
           "course": course_scheduler.simulate}
RESERVE_ONLY = ("sjf", "course")   # they leave optimistic admission (preemption) out


@pytest.mark.parametrize("impl", sorted(CORRECT))
def test_correct_variants_pass_every_clause_on_every_workload(impl: str) -> None:
    judge = Judge(PythonImplementation(impl, CORRECT[impl], "test"))
    for name, w in WORKLOADS.items():
        for clause in ALL_CLAUSES:
            if clause == "invalid_input_refused":
                continue
            result = judge.judge(clause, list(w.trace), w.config)
            left_out = result.status == "skip" and impl in RESERVE_ONLY and name in OPTIMISTIC
            assert result.status == "pass" or left_out, (
                name, clause, result.violations, result.reason)
    for name, (trace, extra) in INVALID_INPUTS.items():
        assert judge.judge_refusal(trace, {**BASE_CONFIG, **extra}).status == "pass", name


@pytest.mark.parametrize("admission", ["reserve", "optimistic"])
@settings(max_examples=150, derandomize=True, deadline=None, database=None)
@given(data=st.data())
def test_engine_variant_passes_every_clause_on_generated_traces(admission: str, data: st.DataObject) -> None:
    trace, config = data.draw(strategies.workloads(admissions=[admission]))
    report = engine_scheduler.simulate(trace, **config)
    assert check_report(report, trace, config) == []


def _kinds(report: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    return [ev for ev in report["events"] if ev["event"] == kind]


def test_engine_variant_really_makes_the_other_choice_on_every_freedom() -> None:
    """Each freedom the contract admits is exercised: otherwise passing would prove nothing."""
    def run(name: str) -> dict[str, Any]:
        w = WORKLOADS[name]
        return engine_scheduler.simulate(list(w.trace), **w.config)

    demo = run("demo")
    first_dispatch = _kinds(demo, "dispatch")[0]
    before = [ev for ev in demo["events"] if ev["event"] == "snapshot" and ev["time"] == first_dispatch["time"]][0]
    assert all(before["block_tables"].get(row["id"]) for row in first_dispatch["work"])  # pages before the snapshot
    assert "active" not in before and "queued" not in before
    assert demo["events"][-1]["event"] == "release"                        # no snapshot after the last release
    assert {ev["time"] for ev in _kinds(demo, "snapshot")} <= {ev["time"] for ev in _kinds(demo, "dispatch")}
    impossible = run("impossible")
    assert _kinds(impossible, "rejected")[0]["time"] == 0                  # rejected at arrival
    no_rows = run("cancel_before_rows")
    assert "c" not in {ev["id"] for ev in _kinds(no_rows, "release")}      # holds no pages: no release
    assert "c" in {ev["id"] for ev in _kinds(no_rows, "admit")}
    reference = reference_simulate(list(WORKLOADS["demo"].trace), **WORKLOADS["demo"].config)
    ours_pages = [ev["block_tables"] for ev in _kinds(demo, "snapshot")]
    theirs_pages = [ev["block_tables"] for ev in _kinds(reference, "snapshot")]
    assert ours_pages != theirs_pages
    preempt = run("preempt_decode")
    assert _kinds(preempt, "preempted") and any(
        row["phase"] == "recompute" for ev in _kinds(preempt, "dispatch") for row in ev["work"])
    pressure = run("queue_pressure")
    blocked = [ev["id"] for ev in _kinds(pressure, "admission_blocked")]
    assert blocked and len(set(blocked)) == len(blocked)                   # once per wait, not every tick
    at_2 = [(ev["event"], ev["id"]) for ev in demo["events"] if ev["time"] == 2 and ev["event"] in ("arrival", "cancelled")]
    assert at_2 == [("cancelled", "cancel-me"), ("arrival", "late")]       # a tick's lines in trace order


@pytest.mark.parametrize("name", RESERVE)
def test_sjf_passes_every_report_clause(name: str) -> None:
    trace, config = list(WORKLOADS[name].trace), WORKLOADS[name].config
    assert check_report(simulate(trace, **config), trace, config) == []


@settings(max_examples=200, derandomize=True, deadline=None, database=None)
@given(workload=strategies.workloads())
def test_sjf_passes_every_report_clause_on_generated_traces(workload: TraceAndConfig) -> None:
    trace, config = workload
    assert check_report(simulate(trace, **config), trace, config) == []


def test_sjf_passes_the_runner_clauses() -> None:
    judge = Judge(PythonImplementation("sjf", simulate, "test"))
    for name in RESERVE:
        trace, config = list(WORKLOADS[name].trace), WORKLOADS[name].config
        for clause in ("deterministic", "input_not_mutated"):
            result = judge.judge(clause, trace, config)
            assert result.status == "pass", (name, clause, result.violations)
    for name, (trace, extra) in INVALID_INPUTS.items():
        assert judge.judge_refusal(trace, {**BASE_CONFIG, **extra}).status == "pass", name


@pytest.mark.parametrize("name", sorted(INVALID_INPUTS))
def test_sjf_refuses_invalid_input(name: str) -> None:
    trace, extra = INVALID_INPUTS[name]
    with pytest.raises(ValueError):
        simulate(trace, **{**BASE_CONFIG, **extra})


def test_optimistic_workloads_are_skipped_by_capability_detection() -> None:
    assert OPTIMISTIC, "the kit ships optimistic-admission workloads"
    impl = PythonImplementation("sjf", simulate, "test")
    judge = Judge(impl)
    for name in RESERVE:
        assert impl.unsupported_reason(WORKLOADS[name].config) is None, name
    for name in OPTIMISTIC:
        w = WORKLOADS[name]
        assert "admission" in (impl.unsupported_reason(w.config) or ""), name
        assert judge.judge("completes", list(w.trace), w.config).status == "skip", name


def test_sjf_admits_shortest_job_first_unlike_the_reference() -> None:
    # One at a time: "long" (8 + 4 tokens) and "short" (2 + 2) arrive at t=0, "late" (3 + 2) at t=2.
    w = WORKLOADS["demo_serial"]
    ours = simulate(list(w.trace), **w.config)
    theirs = reference_simulate(list(w.trace), **w.config)
    assert admissions(theirs) == ["long", "short", "late"]
    assert admissions(ours) == ["short", "late", "long"]
    assert ours["requests"]["short"]["ttft_ticks"] < theirs["requests"]["short"]["ttft_ticks"]


def test_sjf_ties_go_to_the_earlier_arrival() -> None:
    trace = [
        {"time": 0, "event": "arrival", "id": "first", "prompt_tokens": 3, "output_tokens": 2},
        {"time": 0, "event": "arrival", "id": "second", "prompt_tokens": 2, "output_tokens": 3},
        {"time": 0, "event": "arrival", "id": "shortest", "prompt_tokens": 1, "output_tokens": 1},
    ]
    assert admissions(simulate(trace, policy="serial")) == ["shortest", "first", "second"]


@pytest.mark.parametrize("name", ["demo", "queue_pressure", "cancel_after_finish"])
def test_exec_script_round_trips(name: str) -> None:
    trace, config = list(WORKLOADS[name].trace), WORKLOADS[name].config
    outcome = exec_impl().run(trace, config)
    assert outcome.report == simulate(trace, **config), (outcome.refused, outcome.unsupported)


def test_exec_script_runs_without_the_installed_kit() -> None:
    # -S skips site-packages, so the script must find its scheduler and validator in the checkout.
    w = WORKLOADS["demo"]
    outcome = exec_impl("-S").run(list(w.trace), w.config)
    assert outcome.report == simulate(list(w.trace), **w.config), outcome.refused


def test_exec_script_records_reserve_admission() -> None:
    w = WORKLOADS["demo"]
    config = {**w.config, "admission": "reserve"}
    report = exec_impl().run(list(w.trace), config).report
    assert report is not None and report["config"]["admission"] == "reserve"
    assert check_report(report, list(w.trace), config) == []


@pytest.mark.parametrize("setting,value", [("admission", "optimistic"), ("speculative_tokens", 2)])
def test_exec_script_exit_3_is_unsupported(setting: str, value: Any) -> None:
    w = WORKLOADS["demo"]
    outcome = exec_impl().run(list(w.trace), {**w.config, setting: value})
    assert outcome.report is None and outcome.refused is None
    assert "exited 3" in (outcome.unsupported or "") and setting in outcome.unsupported


@pytest.mark.parametrize("name", ["duplicate_id", "bool_time", "zero_capacity"])
def test_exec_script_refuses_invalid_input(name: str) -> None:
    trace, extra = INVALID_INPUTS[name]
    outcome = exec_impl().run(trace, {**BASE_CONFIG, **extra})
    assert outcome.report is None and outcome.unsupported is None
    assert (outcome.refused or "").startswith("exit status 2: error: ")


def test_exec_script_refuses_stdin_that_is_not_a_request() -> None:
    proc = subprocess.run([sys.executable, str(EXEC_SCRIPT)], input='{"trace": []}', capture_output=True,
                          text=True, timeout=60)
    assert (proc.returncode, proc.stdout) == (2, "")
    assert '"trace" and "config"' in proc.stderr
