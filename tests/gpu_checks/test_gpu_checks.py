"""The numeric checks on the reference scheduler's schedules, the kill matrix, the controls."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="gpu_checks need torch")

from pytest_cbatch.gpu_checks.checks import (  # noqa: E402
    SCHEDULE_CHECKS, TOLERANCES, _tolerance_failures, mutant_kill_matrix, run_invariance_checks,
    run_preemption_check, run_schedule_checks,
)
from pytest_cbatch.gpu_checks.bugs import REGIMES  # noqa: E402
from pytest_cbatch.gpu_checks.engine import BUG_REGIMES, BUGS  # noqa: E402
from pytest_cbatch.gpu_checks.profiles import _short_workloads  # noqa: E402
from pytest_cbatch.gpu_checks.metrics import compare  # noqa: E402
from pytest_cbatch.gpu_checks.schedules import SUITE_WORKLOADS, alone_schedule  # noqa: E402
from pytest_cbatch.gpu_checks.streams import Records  # noqa: E402
from pytest_cbatch.reference.scheduler_sim import demo_trace, simulate  # noqa: E402


def reference_report(workload: str, which: str = "config") -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """(trace, report) of a suite workload scheduled by the reference simulator."""
    w = SUITE_WORKLOADS[workload]
    return w.trace, simulate(w.trace, **getattr(w, which))


def _reference(workload: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    if workload == "demo":
        return demo_trace(), simulate(demo_trace())
    return reference_report(workload)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("workload", ["demo", "chunked", "preempt"])  # reserve, reserve, optimistic admission
def test_reference_schedules_pass_every_check(workload: str, dtype: str) -> None:
    trace, report = _reference(workload)
    results = run_schedule_checks(trace, report, dtype=dtype, workload=workload)
    assert [r.name for r in results] == list(SCHEDULE_CHECKS)
    for r in results:
        assert r.passed and not r.skipped, r.summary()
        assert r.metrics is not None and r.metrics.nonfinite == 0


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("source", ["reference", "kit"])
def test_preemption_and_recompute_match_the_run_without_preemption(dtype: str, source: str) -> None:
    w = SUITE_WORKLOADS["preempt"]
    if source == "kit":   # scripted: preempts whatever the reference's policy does
        preempted, baseline = w.kit_reports()
    else:
        (_, preempted), (_, baseline) = reference_report("preempt"), reference_report("preempt", "baseline")
    assert not any(e["event"] == "preempted" for e in baseline["events"])
    result = run_preemption_check(w.trace, preempted, baseline, dtype=dtype, block_size=w.config["block_size"])
    assert result.passed, result.summary()
    if source == "kit" or any(e["event"] == "preempted" for e in preempted["events"]):
        assert not result.skipped and result.details["recomputed"] > 0, result.summary()
    else:
        assert result.skipped


def test_bfloat16_uses_the_ratio_rule_against_a_float64_oracle() -> None:
    trace, report = _reference("chunked")
    [result] = run_schedule_checks(trace, report, dtype="bfloat16", checks=("batched_vs_alone",))
    assert result.passed, result.summary()
    tol = TOLERANCES["bfloat16"]
    assert result.details["err_vs_fp64"] <= tol.ratio * result.details["alone_err_vs_fp64"] + tol.floor


def test_batch_invariance_passes_and_the_negative_control_fails_bitwise_only() -> None:
    trace, report = _reference("chunked")
    invariance, control = run_invariance_checks(trace, report, dtype="float64")
    assert invariance.passed and invariance.metrics.bitwise_frac == 1.0, invariance.summary()
    assert control.passed, control.summary()
    assert control.details["bitwise_differs"] and control.metrics.bitwise_frac < 1.0
    assert control.metrics.max_kl <= TOLERANCES["float64"].max_kl  # tolerance mode still passes


def test_a_schedule_without_chunked_prefill_skips_the_chunk_check() -> None:
    trace = demo_trace()
    report = {"events": alone_schedule({"long": 11, "short": 3})}
    [result] = run_schedule_checks(trace, report, dtype="float64", block_size=4, checks=("chunked_vs_whole",))
    assert result.skipped and result.passed


SHORT_BUGS = [bug for bug, regime in BUG_REGIMES.items() if regime == "short"]
NEEDS_PREEMPTION = {"stale_block_table"}


def _kill_workloads() -> dict[str, tuple[list[dict[str, Any]], dict[str, Any], int]]:
    trace, report = reference_report("preempt")
    fcfs_trace, fcfs_report, _, bs = _short_workloads(16, 80, quick=False)["preempt"]
    return {"reference-optimistic": (trace, report, 4), "fcfs-scripted": (fcfs_trace, fcfs_report, bs)}


@pytest.fixture(scope="module", params=["reference-optimistic", "fcfs-scripted"])
def kill_matrix(request: pytest.FixtureRequest) -> dict[str, Any]:
    trace, report, bs = _kill_workloads()[request.param]
    results = {r.name: r for r in mutant_kill_matrix(trace, report, dtype="float64", block_size=bs, bugs=SHORT_BUGS)}
    results["preempts"] = any(e["event"] == "preempted" for e in report["events"])
    return results


def test_clean_engine_passes_the_kill_checks(kill_matrix: dict[str, Any]) -> None:
    assert kill_matrix["clean"].passed, kill_matrix["clean"].summary()


def test_every_bug_has_a_regime() -> None:
    assert set(BUG_REGIMES) == set(BUGS) and set(BUG_REGIMES.values()) == set(REGIMES)


@pytest.mark.parametrize("bug", SHORT_BUGS)
def test_every_injected_bug_is_caught_numerically(bug: str, kill_matrix: dict[str, Any]) -> None:
    result = kill_matrix[f"mutant:{bug}"]
    if bug in NEEDS_PREEMPTION and not kill_matrix["preempts"]:   # the schedule gives the bug nothing to break
        assert not result.passed and not result.details["caught_by"], result.summary()
        return
    assert result.passed and result.details["caught_by"], result.summary()
    assert not result.details["crashed"], result.details["crashed"]
    # margin: the weakest mutant must stand far above the fp32 tolerance, not just above fp64 noise
    assert result.metrics.max_kl > 100 * TOLERANCES["float32"].max_kl


def test_non_finite_logits_never_pass() -> None:
    ref = Records(logits=torch.zeros(2, 4, dtype=torch.float64), request=["a", "a"], position=[0, 1],
                  step=[0, 0], phase=["p", "p"], chunk_start=[False, False])
    sut = Records(logits=torch.tensor([[0.0, 0, 0, 0], [float("nan"), 0, 0, 0]], dtype=torch.float64),
                  request=["a", "a"], position=[0, 1], step=[0, 0], phase=["p", "p"], chunk_start=[False, False])
    m = compare(sut, ref, flip_margin=0.5)
    assert m.nonfinite == 1 and not m.finite and math.isinf(m.max_kl)
    assert m.worst["position"] == 1
    assert _tolerance_failures(m, TOLERANCES["bfloat16"])


def test_results_serialise_to_json_with_infinities() -> None:
    trace, report = _reference("demo")
    [result] = run_schedule_checks(trace, report, dtype="float64", checks=("batched_vs_alone",),
                                   block_size=4)
    result.metrics.max_kl = float("inf")
    document = json.loads(json.dumps(result.as_dict()))
    assert document["metrics"]["max_kl"] == "inf" and document["name"] == "batched_vs_alone"


def test_a_non_finite_reference_fails_its_checks_and_the_others_still_report(monkeypatch: pytest.MonkeyPatch) -> None:
    from pytest_cbatch.gpu_checks import checks

    real = checks.dense_records

    def poisoned(*args: Any, **kwargs: Any) -> Records:
        out = real(*args, **kwargs)
        out.logits[0, 0] = float("nan")
        return out

    monkeypatch.setattr(checks, "dense_records", poisoned)
    trace, report = _reference("demo")
    results = {r.name: r for r in run_schedule_checks(trace, report, dtype="float64", block_size=4)}
    assert list(results) == list(SCHEDULE_CHECKS)
    for name in ("oracle_self_test", "batched_vs_alone", "page_reuse"):
        assert not results[name].passed and "reference logits are not finite" in results[name].summary()
    for name in ("backend_parity", "row_order", "determinism"):
        assert results[name].passed, results[name].summary()
    [clean, *_] = mutant_kill_matrix(trace, report, dtype="float64", block_size=4, bugs=["cross_row_leak"])
    assert not clean.passed and "reference logits are not finite" in clean.summary()


def test_the_torch_free_catalog_names_exactly_the_checks_that_run() -> None:
    """The suite builds its test ids from ``catalog`` without importing torch; those names must be the checks."""
    from pytest_cbatch.gpu_checks import catalog, checks

    defaults = tuple(checks._SCHEDULE_CHECKS)[:len(catalog.SCHEDULE_CHECKS)]
    assert defaults == catalog.SCHEDULE_CHECKS
    assert set(catalog.LEAD_CHECKS) <= set(checks._SCHEDULE_CHECKS)
