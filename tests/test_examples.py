"""The example adapters: the shortest-job-first scheduler, in process and behind the exec protocol."""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings

from pytest_cbatch import strategies
from pytest_cbatch.contract import check_report
from pytest_cbatch.examples.sjf_scheduler import simulate
from pytest_cbatch.impls import Implementation, PythonImplementation, resolve_impl
from pytest_cbatch.reference.scheduler_sim import simulate as reference_simulate
from pytest_cbatch.runner import Judge
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
