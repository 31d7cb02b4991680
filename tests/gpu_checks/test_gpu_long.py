"""Long contexts (1,100+ positions, 70+ pages, split-KV decodes) and large attention scores.

Schedules come from the kit's own planner where a test needs a property for
sure (a preemption, a row past 512 keys) and from the reference where it only
needs a correct scheduler; nothing pins the reference's exact schedule.
"""

from __future__ import annotations

import math
from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="gpu_checks need torch")

from pytest_cbatch.gpu_checks.attention import ATTENTION_CASES, LARGE_SCORE_GAIN, run_attention_parity  # noqa: E402
from pytest_cbatch.gpu_checks.checks import (  # noqa: E402
    LARGE_SCORE_MIN, TOLERANCES, mutant_kill_matrix, run_preemption_check, run_schedule_checks,
)
from pytest_cbatch.gpu_checks.engine import BLOCK_TABLE_PAGES, BUG_REGIMES, ROPE_TABLE_POSITIONS  # noqa: E402
from pytest_cbatch.gpu_checks.model import apply_rope  # noqa: E402
from pytest_cbatch.gpu_checks.paged import SPLIT_KV_PARTITION  # noqa: E402
from pytest_cbatch.gpu_checks.schedules import SUITE_WORKLOADS  # noqa: E402
from pytest_cbatch.reference.scheduler_sim import simulate  # noqa: E402

LONG = SUITE_WORKLOADS["long"]
LONG_BUGS = [b for b, regime in BUG_REGIMES.items() if regime == "long_context"]
LARGE_BUGS = [b for b, regime in BUG_REGIMES.items() if regime == "large_scores"]
BOUNDARY_BUGS = [b for b, regime in BUG_REGIMES.items() if regime == "partition_boundary"]
LEAD_BUGS = [b for b, regime in BUG_REGIMES.items() if regime.endswith("_partition_leads")]
BS = LONG.config["block_size"]


def _report(source: str, which: str = "config", name: str = "long") -> dict[str, Any]:
    w = SUITE_WORKLOADS[name]
    if source == "kit":
        report, baseline = w.kit_reports()
        return report if which == "config" else baseline
    return simulate(w.trace, **getattr(w, which))


def _rows(report: dict[str, Any]) -> list[tuple[list[dict[str, Any]], dict[str, int]]]:
    """Per dispatch: its rows and each request's keys after it (count of fed rows, reset on preemption)."""
    fed: dict[str, int] = {}
    out = []
    for e in report["events"]:
        if e["event"] == "preempted":
            fed[e["id"]] = 0
        elif e["event"] == "dispatch":
            for w in e["work"]:
                fed[w["id"]] = fed.get(w["id"], 0) + w["input_tokens"]
            out.append((e["work"], dict(fed)))
    return out


@pytest.mark.parametrize("source", ["reference", "kit"])
def test_the_long_workload_reaches_every_regime(source: str) -> None:
    steps = _rows(_report(source))
    long_chunks = [w["input_tokens"] for work, _ in steps for w in work
                   if w["id"] == "long" and w["phase"] == "prefill"]
    assert long_chunks[:4] == [256] * 4 and sum(long_chunks) == 1100
    keys = max(fed["long"] for _, fed in steps)
    assert keys > ROPE_TABLE_POSITIONS and math.ceil(keys / BS) >= 70 > BLOCK_TABLE_PAGES
    split_decodes = [work for work, fed in steps for w in work
                     if w["id"] == "long" and w["phase"] == "decode" and fed["long"] > 2 * SPLIT_KV_PARTITION]
    assert split_decodes and any(len(work) > 1 for work in split_decodes)   # batched with other requests
    assert any(w["id"] != "long" and w["phase"] == "prefill" for work in split_decodes for w in work)


@pytest.mark.parametrize("source,dtype", [("reference", "float64"), ("kit", "float32")])
def test_long_schedules_pass_and_large_scores_stay_finite(source: str, dtype: str) -> None:
    report = _report(source)
    common = {"dtype": dtype, "block_size": BS, "workload": "long"}
    results = run_schedule_checks(LONG.trace, report, preset="narrow",
                                  checks=("batched_vs_alone", "backend_parity", "page_reuse"), **common)
    results += run_schedule_checks(LONG.trace, report, preset="narrow-hot", checks=("large_scores",), **common)
    for r in results:
        assert r.passed and not r.skipped and r.metrics.nonfinite == 0, r.summary()
    assert results[-1].details["peak_score"] >= LARGE_SCORE_MIN


def test_large_scores_refuses_a_workload_that_does_not_reach_the_regime() -> None:
    [r] = run_schedule_checks(LONG.trace, _report("kit"), dtype="float64", preset="narrow", block_size=BS,
                              checks=("large_scores",))
    assert not r.passed and "does not reach the overflow range" in r.summary()


@pytest.mark.parametrize("source", ["reference", "kit"])
def test_a_preempted_long_request_recomputes_the_same_logits(source: str) -> None:
    w = SUITE_WORKLOADS["long-preempt"]
    preempted, baseline = _report(source, name="long-preempt"), _report(source, "baseline", "long-preempt")
    result = run_preemption_check(w.trace, preempted, baseline, dtype="float32", preset="narrow", block_size=BS)
    assert result.passed, result.summary()
    if source == "kit" or any(e["event"] == "preempted" for e in preempted["events"]):
        assert not result.skipped and result.details["recomputed"] >= 1000, result.summary()


@pytest.fixture(scope="module")
def long_kill() -> dict[str, Any]:
    report = _report("kit")
    common = {"block_size": BS, "workload": "long"}
    out = {r.name: r for r in mutant_kill_matrix(LONG.trace, report, dtype="float64", preset="narrow",
                                                 bugs=LONG_BUGS + LARGE_BUGS + BOUNDARY_BUGS, **common)}
    hot = mutant_kill_matrix(LONG.trace, report, dtype="float32", preset="narrow-hot", bugs=LARGE_BUGS + LEAD_BUGS,
                             checks=("large_scores",), **common)
    out.update({f"hot-{r.name}": r for r in hot})
    return out


def test_clean_engine_passes_the_long_kill_checks(long_kill: dict[str, Any]) -> None:
    assert long_kill["clean"].passed, long_kill["clean"].summary()
    assert long_kill["hot-clean"].passed, long_kill["hot-clean"].summary()


@pytest.mark.parametrize("bug", LONG_BUGS)
def test_long_context_bugs_are_caught(bug: str, long_kill: dict[str, Any]) -> None:
    result = long_kill[f"mutant:{bug}"]
    assert result.passed and set(result.details["caught_by"]) == {"batched_vs_alone", "page_reuse"}, result.summary()
    assert not result.details["crashed"] and result.metrics.max_kl > 100 * TOLERANCES["float32"].max_kl


@pytest.mark.parametrize("bug", LARGE_BUGS)
def test_large_score_bugs_hide_at_normal_scores_and_are_caught_at_large_ones(bug: str,
                                                                            long_kill: dict[str, Any]) -> None:
    assert not long_kill[f"mutant:{bug}"].passed   # scores ~6 in float64: a naive exp is exact enough
    caught = long_kill[f"hot-mutant:{bug}"]
    assert caught.passed and caught.details["caught_by"] == ["large_scores"], caught.summary()
    assert caught.metrics.nonfinite > 0


@pytest.mark.parametrize("bug", BOUNDARY_BUGS)
def test_a_decode_one_key_past_a_partition_is_what_the_boundary_bug_needs(bug: str, long_kill: dict[str, Any]) -> None:
    """The long workload decodes past two partitions (1,101-1,139 keys) but never at 513 or 1,025."""
    assert not long_kill[f"mutant:{bug}"].passed, long_kill[f"mutant:{bug}"].summary()


@pytest.mark.parametrize("bug", LEAD_BUGS)
def test_partition_lead_bugs_hide_when_the_partitions_maxima_are_close(bug: str, long_kill: dict[str, Any]) -> None:
    """narrow-hot's scores pass 150 in every partition, so no partition leads another by 88.7."""
    result = long_kill[f"hot-mutant:{bug}"]
    assert not result.passed and not result.details["crashed"], result.summary()


@pytest.mark.parametrize("dtype", ["float64", "float32", "bfloat16"])
def test_attention_kernels_agree_with_float64_at_large_scores(dtype: str) -> None:
    result = run_attention_parity(dtype, q_gain=LARGE_SCORE_GAIN)
    assert result.passed and result.name == "attention_large_scores", result.summary()
    assert result.details["peak_score"] >= LARGE_SCORE_MIN


@pytest.mark.parametrize("kernel,q_gain,dtype", [({"softmax": "naive"}, LARGE_SCORE_GAIN, "float32"),
                                                 ({"merge": "unscaled"}, 1.0, "float64")])
def test_attention_checks_catch_the_decode_kernel_bugs(kernel: dict[str, str], q_gain: float, dtype: str) -> None:
    result = run_attention_parity(dtype, q_gain=q_gain, kernel=kernel)
    assert not result.passed and "sdpa:" in result.summary()


def test_the_split_kv_merge_bug_needs_more_than_one_partition() -> None:
    short = [c for c in ATTENTION_CASES if c[1] <= SPLIT_KV_PARTITION]
    assert run_attention_parity("float64", cases=short, kernel={"merge": "unscaled"}).passed
    assert not run_attention_parity("float64", cases=short + [(1, SPLIT_KV_PARTITION + 1)],
                                    kernel={"merge": "unscaled"}).passed


def test_rope_is_computed_for_any_position() -> None:
    g = torch.Generator().manual_seed(0)
    q, k = (torch.randn(1, 2, 16, generator=g, dtype=torch.float64) for _ in range(2))

    def score(pq: int, pk: int) -> torch.Tensor:
        return (apply_rope(q, torch.tensor([pq]), 1e4) * apply_rope(k, torch.tensor([pk]), 1e4)).sum(-1)

    assert torch.allclose(score(7, 3), score(131_075, 131_071), atol=1e-9)
    assert not torch.allclose(apply_rope(q, torch.tensor([ROPE_TABLE_POSITIONS + 5]), 1e4),
                              apply_rope(q, torch.tensor([ROPE_TABLE_POSITIONS - 1]), 1e4))
