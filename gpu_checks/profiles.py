"""What ``python -m gpu_checks`` runs: the ``cpu`` and ``gpu`` profiles, their workloads and their size.

A profile is a list of :class:`Stage` objects (one check function on one
workload with one model preset, for some dtypes) plus decode-step timings.
:func:`build` turns a profile into concrete workloads (traces and the kit's
own FCFS schedules, no scheduler needed); :func:`estimate` sizes a plan
(engine steps, positions, peak memory, an estimated wall time) from the
schedules and preset shapes alone, without allocating anything, so
``--dry-run`` and the tests can prove on a CPU that the ``gpu`` profile fits
one H100/H200 inside its time budget.

* ``cpu`` (default off CUDA): tiny preset for the short workloads; the
  ``narrow`` preset for the long-context workloads (a 1,100-token prompt in
  256-token chunks, decodes past 1,100 keys on 70+ pages, a preemption that
  recomputes 1,100+ rows); ``narrow-hot`` for large scores.
* ``gpu`` (default on CUDA): ``gpu-small`` (99 M) in bfloat16 and float32;
  contexts of 8k, 16k and 32k tokens in one batch with short requests, a
  batch of 64 requests decoding together, the same kill matrix, and decode
  steps of ``gpu-small``/``perf-1b`` at 8k-32k contexts and batch 1-64
  against their memory-bandwidth floor.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from .bugs import BUG_REGIMES
from .presets import PRESETS
from .schedules import SUITE_WORKLOADS, arrivals, boundary_trace, fcfs_schedule, numerics_workloads, reference_simulate

__all__ = ["Stage", "Profile", "PROFILES", "Built", "build", "estimate", "GPU_MEMORY_BUDGET", "QUICK_BUGS"]

QUICK_BUGS = ("cross_row_leak", "decode_position_off_by_one", "read_past_end", "stale_block_table")
SHORT_BUGS = tuple(b for b, regime in BUG_REGIMES.items() if regime == "short")
LONG_BUGS = tuple(b for b, regime in BUG_REGIMES.items() if regime == "long_context")
LARGE_SCORE_BUGS = tuple(b for b, regime in BUG_REGIMES.items() if regime == "large_scores")


def _bugs_of(*regimes: str) -> tuple[str, ...]:
    return tuple(b for b, regime in BUG_REGIMES.items() if regime in regimes)


BOUNDARY_BUGS = _bugs_of("partition_boundary", "wide_decode")
LATER_LEAD_BUGS = _bugs_of("later_partition_leads")
FIRST_LEAD_BUGS = _bugs_of("first_partition_leads")
LONG_PREEMPTION_BUGS = _bugs_of("long_preemption")
BOUNDS_CHECKS = ("batched_vs_alone", "backend_parity", "chunked_vs_whole", "page_reuse")
GPU_MEMORY_BUDGET = 64 * 2**30   # an H100 has 80 GB: leave room for the allocator and the CUDA context

# Assumptions of the time estimate (eager PyTorch on one H100/H200, not measured: no GPU was available):
STEP_SECONDS = {"tiny": 0.004, "narrow": 0.003, "gpu-small": 0.012, "gpu-small-hot": 0.012}
FP64_FLOPS = 25e12            # float64 dense oracle (cuBLAS DGEMM on tensor cores, with einsum overheads)
TIMING_SECONDS = 8.0          # one decode-step timing: weights drawn on the device, warm-up, 10 iterations
FIXED_SECONDS = 60.0          # interpreter and CUDA start-up, float64 weight draws, ceilings


@dataclass(frozen=True)
class Stage:
    """One check function on one workload.

    ``kind``: ``attention`` (``q_gain`` 1 or large, ``magnitude`` of ``attention.MAGNITUDES``),
    ``schedule`` (``checks``),
    ``preemption``, ``invariance`` or ``kill`` (``bugs`` judged by ``checks``).
    ``dtypes`` restricts the stage (empty: every dtype of the run), ``once``
    runs it in the first of those only; ``quick`` says whether ``--quick`` keeps it.
    """

    kind: str
    workload: str = ""
    preset: str = ""
    checks: tuple[str, ...] = ()
    bugs: tuple[str, ...] = ()
    q_gain: float = 1.0
    magnitude: str = "uniform"
    dtypes: tuple[str, ...] = ()
    quick: bool = True
    once: bool = False

    def runs_in(self, dtypes: tuple[str, ...]) -> tuple[str, ...]:
        """The dtypes of a run (in order) this stage runs in."""
        mine = tuple(d for d in dtypes if not self.dtypes or d in self.dtypes)
        return mine[:1] if self.once else mine


@dataclass(frozen=True)
class Profile:
    """A named plan: default dtypes, stages, decode timings ``(preset, batch, context)`` and a budget.

    No stage starts after ``budget_s - checks_reserve_s()`` seconds and no
    timing after ``budget_s``: the reserve keeps room for the timings.
    """

    name: str
    preset: str
    dtypes: tuple[str, ...]
    stages: tuple[Stage, ...]
    timings: tuple[tuple[str, int, int], ...]
    timing_dtype: str
    budget_s: float

    def checks_reserve_s(self) -> float:
        """Seconds kept free for the decode timings at the end."""
        return TIMING_SECONDS * len(self.timings)


@dataclass
class Built:
    """A profile made concrete: ``workloads[name] = (trace, report, baseline or None, block_size)``."""

    profile: Profile
    stages: list[Stage]
    workloads: dict[str, tuple[list[dict[str, Any]], dict[str, Any], dict[str, Any] | None, int]]


def _short_workloads(bs: int, max_len: int, quick: bool) -> dict[str, tuple]:
    """mixed, chunked and preempt: the short workloads on and around page and chunk boundaries."""
    n = 5 if quick else 10
    mixed = boundary_trace(n, bs, 2 * bs, max_len, seed=1)
    chunked = boundary_trace(n, bs, bs - 1, max_len, seed=2, gap=2)
    a, b, c = 3 * bs, bs + 1, 2 * bs - 1
    pre = arrivals([(0, "a", a, bs), (0, "b", b, 2 * bs), (0, "c", c, bs // 2), (0, "d", 5, 3)])
    # "a" mid-prefill one token past a page boundary, and again right after its recompute;
    # "c" after its first decode, on a page boundary; "b" mid-decode
    script = [("a", 1), ("c", 2 * bs), ("b", b + 3), ("a", bs)]
    plan = {"token_budget": 3 * bs + 1, "prefill_chunk": 2 * bs, "max_active": 6, "block_size": bs}
    preempt_plan = {**plan, "prefill_chunk": bs + 1}
    return {
        "mixed": (mixed, fcfs_schedule(mixed, **plan), None, bs),
        "chunked": (chunked, fcfs_schedule(chunked, **{**plan, "token_budget": bs + 1, "prefill_chunk": bs - 1}),
                    None, bs),
        "preempt": (pre, fcfs_schedule(pre, preempt=script, **preempt_plan), fcfs_schedule(pre, **preempt_plan), bs),
    }


def _suite_long(name: str) -> tuple:
    w = SUITE_WORKLOADS[name]
    report, baseline = w.kit_reports()
    return w.trace, report, baseline, w.config["block_size"]


REFERENCE_SHORT = ("demo", "chunked", "preempt")
REFERENCE_LONG = ("long-preempt",)
"""The suite's numerics workloads the command also runs as the kit's reference scheduler plans them: its
schedules reach regimes the FCFS planner's do not (a running request cancelled, its pages released after
the delay while others allocate; recompute-only steps; its own row order and chunk sizes)."""


def _reference_workloads(names: set[str]) -> dict[str, tuple]:
    """``<name>-ref``: the suite's numerics workload ``name`` as the reference scheduler plans it."""
    simulate = reference_simulate().simulate
    out = {}
    for name, w in numerics_workloads().items():
        if f"{name}-ref" in names:
            baseline = None if w.baseline is None else simulate(w.trace, **w.baseline)
            out[f"{name}-ref"] = (w.trace, simulate(w.trace, **w.config), baseline, w.config["block_size"])
    return out


def _gpu_long() -> dict[str, tuple]:
    """long-gpu: 32k, 16k and 8k prompts in 2,048-token chunks beside short requests;
    batch64: 64 requests of 256-2,048 prompt tokens decoding together, two of them preempted."""
    bs = 16
    long_trace = arrivals([(0, "c32k", 32000, 16), (1, "c8k", 8192, 32), (3, "c16k", 16384, 16)]
                          + [(2 * i, f"s{i}", 40 + 37 * i, 8 + i) for i in range(6)])
    long_plan = {"token_budget": 2048 + 64, "prefill_chunk": 2048, "max_active": 16, "block_size": bs}
    batch = arrivals([(0, f"b{i}", 256 + (i * 383) % 1793, 16 + i % 9) for i in range(64)])
    batch_plan = {"token_budget": 8192, "prefill_chunk": 2048, "max_active": 64, "block_size": bs}
    script = [("b3", 300), ("b40", 500)]
    return {
        "long-gpu": (long_trace, fcfs_schedule(long_trace, **long_plan), None, bs),
        "batch64": (batch, fcfs_schedule(batch, preempt=script, **batch_plan), fcfs_schedule(batch, **batch_plan), bs),
    }


def _common_stages(preset: str) -> list[Stage]:
    """The stages of the short workloads (``--quick`` cuts the kill matrix to ``QUICK_BUGS``)."""
    return [
        Stage("attention", preset=preset),
        *(Stage("attention", preset=preset, q_gain=32.0, magnitude=m)
          for m in ("uniform", "later_leads", "first_leads")),
        *(Stage("schedule", w, preset) for w in ("mixed", "chunked", "preempt")),
        Stage("preemption", "preempt", preset),
        Stage("invariance", "chunked", preset),
        Stage("kill", "preempt", preset, bugs=SHORT_BUGS),
        *(Stage("schedule", f"{w}-ref", preset) for w in REFERENCE_SHORT),
        Stage("preemption", "preempt-ref", preset),
    ]


_LOW_PRECISION = ("float32", "bfloat16")   # a naive exp overflows at 88.7 there, not in float64


def _regime_stages(preset: str, lead_dtypes: tuple[str, ...]) -> list[Stage]:
    """Boundaries, partition leads and long-preemption page reuse, with the bugs only they catch.

    The partition-lead stages run the ``long`` workload on ``narrow-hot-late``/``-early`` in every
    profile: at scores near 180 a deep model's float32 run is itself chaotic (gpu-small-hot-late on
    the bounds workload, CPU float32: batched vs alone KL 5e-4, alone vs float64 0.45 logits), so the
    regime is exercised where the float32 bound still separates noise from a bug."""
    lead = {"quick": False, "dtypes": lead_dtypes}
    lead_kill = {"quick": False, "dtypes": ("float32",), "once": True}   # invisible in float64: exp(100) is finite
    return [
        Stage("schedule", "bounds", preset, checks=BOUNDS_CHECKS, quick=False),
        Stage("schedule", "long", "narrow-hot-late", checks=("later_partition_leads",), **lead),
        Stage("schedule", "long", "narrow-hot-early", checks=("first_partition_leads",), **lead),
        Stage("schedule", "long-preempt", preset, checks=("batched_vs_alone", "page_reuse"), quick=False),
        Stage("kill", "bounds", preset, bugs=BOUNDARY_BUGS, quick=False, once=True),
        Stage("kill", "long", "narrow-hot-late", checks=("later_partition_leads",), bugs=LATER_LEAD_BUGS,
              **lead_kill),
        Stage("kill", "long", "narrow-hot-early", checks=("first_partition_leads",), bugs=FIRST_LEAD_BUGS,
              **lead_kill),
        Stage("kill", "long-preempt", preset, bugs=LONG_PREEMPTION_BUGS, quick=False, once=True),
        *(Stage("schedule", f"{w}-ref", SUITE_WORKLOADS[w].preset, checks=("batched_vs_alone", "page_reuse"),
                quick=False) for w in REFERENCE_LONG),
    ]


PROFILES: dict[str, Profile] = {
    "cpu": Profile(
        name="cpu", preset="tiny", dtypes=("float64", "float32"), timing_dtype="float32", budget_s=600.0,
        timings=(("tiny", 1, 128), ("tiny", 8, 128), ("narrow", 8, 2048)),
        stages=tuple(_common_stages("tiny") + [
            Stage("schedule", "long", "narrow"),
            Stage("schedule", "long", "narrow-hot", checks=("large_scores",)),
            Stage("preemption", "long-preempt", "narrow"),
            Stage("kill", "long", "narrow", bugs=LONG_BUGS, quick=False, once=True),
            Stage("kill", "long", "narrow-hot", checks=("large_scores",), bugs=LARGE_SCORE_BUGS,
                  dtypes=_LOW_PRECISION, quick=False, once=True),
            *_regime_stages("narrow", ()),
        ])),
    "gpu": Profile(
        # 360 s of stages and timings leave a minute of a 7-minute session for start-up and the JSON
        name="gpu", preset="gpu-small", dtypes=("bfloat16", "float32"), timing_dtype="bfloat16", budget_s=360.0,
        timings=(("gpu-small", 1, 8192), ("gpu-small", 64, 8192), ("gpu-small", 64, 32768),
                 ("perf-1b", 1, 32768), ("perf-1b", 64, 8192), ("perf-1b", 16, 32768)),
        stages=tuple(_common_stages("gpu-small") + [
            Stage("schedule", "long-gpu", "gpu-small", checks=("batched_vs_alone", "backend_parity", "page_reuse")),
            Stage("schedule", "batch64", "gpu-small", checks=("batched_vs_alone", "page_reuse", "row_order")),
            # gpu-small-hot only in bfloat16: its float32 run is itself chaotic at scores near 170 (README,
            # "Profiles"), so float32 large scores run on narrow-hot, where the float32 bound holds
            Stage("schedule", "batch64", "gpu-small-hot", checks=("large_scores",), dtypes=("bfloat16",)),
            Stage("schedule", "long", "narrow-hot", checks=("large_scores",), dtypes=("float32",)),
            Stage("preemption", "batch64", "gpu-small"),
            Stage("kill", "long-gpu", "gpu-small", bugs=LONG_BUGS, dtypes=("float32",), quick=False, once=True),
            Stage("kill", "batch64", "gpu-small-hot", checks=("large_scores",), bugs=LARGE_SCORE_BUGS,
                  dtypes=("bfloat16",), quick=False),
            Stage("kill", "long", "narrow-hot", checks=("large_scores",), bugs=LARGE_SCORE_BUGS,
                  dtypes=("float32",), quick=False),
            *_regime_stages("gpu-small", ("float32",)),
        ])),
}


def build(profile: Profile, quick: bool = False) -> Built:
    """The concrete workloads and stages of ``profile`` (``--quick``: fewer requests, fewer stages)."""
    bs = PRESETS[profile.preset].block_size
    max_len = 5 * bs if profile.preset == "tiny" else 16 * bs
    workloads = _short_workloads(bs, max_len, quick)
    stages = [s for s in profile.stages if s.quick or not quick]
    if quick:
        stages = [replace(s, bugs=QUICK_BUGS) if s.bugs == SHORT_BUGS else s for s in stages]
    names = {s.workload for s in stages}
    for name in names & {"long", "long-preempt", "bounds"}:
        workloads[name] = _suite_long(name)
    if names & {"long-gpu", "batch64"}:
        workloads.update(_gpu_long())
    workloads.update(_reference_workloads(names))
    return Built(profile, stages, workloads)


def _dispatch_stats(report: dict[str, Any]) -> tuple[int, int]:
    """(engine steps, fed positions) of a report."""
    steps = positions = 0
    for e in report["events"]:
        if e.get("event") == "dispatch":
            steps += 1
            positions += sum(w["input_tokens"] for w in e["work"])
    return steps, positions


def _engine_runs(stage: Stage) -> int:
    """Schedule runs a stage makes (each the whole schedule; ``alone`` counted as one)."""
    if stage.kind == "schedule":
        return 6 if not stage.checks else 1 + len(set(stage.checks) & {"backend_parity", "page_reuse", "row_order"})
    if stage.kind == "preemption":
        return 2
    if stage.kind == "kill":
        return len(stage.checks or ("batched_vs_alone", "page_reuse")) * (1 + len(stage.bugs))
    return 0


def estimate(built: Built, dtypes: tuple[str, ...]) -> dict[str, Any]:
    """Size of a run of ``built`` in ``dtypes``: steps, positions, peak bytes and estimated seconds.

    Memory: the largest of (a) one workload's engine cache (ample pool,
    float32 at most) plus its logits records (run, dense, float64 oracle, and
    six float64 temporaries of the comparison) and (b) one decode timing's KV
    cache, weights and the split-KV kernel's float32 copies of one layer.
    """
    steps = positions = 0
    oracle_flops = 0.0
    peak = 0
    for stage in built.stages:
        if stage.kind == "attention":
            continue
        trace, report, baseline, bs = built.workloads[stage.workload]
        cfg = PRESETS[stage.preset]
        n_steps, n_pos = _dispatch_stats(report)
        stage_dtypes = stage.runs_in(dtypes)
        runs = _engine_runs(stage)
        token_steps = n_pos * 4 if stage.kind == "invariance" else 0
        steps += len(stage_dtypes) * (runs * n_steps + token_steps)
        positions += len(stage_dtypes) * runs * n_pos
        lens = [line["prompt_tokens"] + line["output_tokens"] - 1 for line in trace if line["event"] == "arrival"]
        body = cfg.n_params - 2 * cfg.vocab * cfg.d_model
        oracle_flops += len(stage_dtypes) * sum(
            2 * body * n + 4 * cfg.n_layers * cfg.n_heads * cfg.head_dim * n * n for n in lens)
        kv_token = cfg.n_layers * 2 * cfg.n_kv_heads * cfg.head_dim * 4
        cache = 2 * sum(math.ceil(n / bs) for n in lens) * bs * kv_token
        peak = max(peak, cache + sum(lens) * cfg.vocab * 8 * 9)
    for preset, batch, context in built.profile.timings:
        cfg = PRESETS[preset]
        kv_token = cfg.n_layers * 2 * cfg.n_kv_heads * cfg.head_dim * 2
        width = math.ceil((context + 1) / 512) * 512
        gather = batch * width * 2 * cfg.n_kv_heads * cfg.head_dim * (2 + 4)
        peak = max(peak, batch * (context + 17) * kv_token + 2 * cfg.n_params + gather)
    step_s = max((STEP_SECONDS.get(s.preset, 0.012) for s in built.stages if s.preset), default=0.0)
    seconds = (FIXED_SECONDS + steps * step_s + oracle_flops / FP64_FLOPS
               + TIMING_SECONDS * len(built.profile.timings))
    return {"profile": built.profile.name, "dtypes": list(dtypes), "stages": len(built.stages),
            "engine_steps": steps, "positions": positions, "oracle_tflop": round(oracle_flops / 1e12, 1),
            "peak_bytes": peak, "peak_gib": round(peak / 2**30, 1), "estimated_seconds": round(seconds),
            "budget_s": built.profile.budget_s,
            "max_context": max(c for _, _, c in built.profile.timings),
            "max_batch": max(b for _, b, _ in built.profile.timings)}
