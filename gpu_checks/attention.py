"""Attention-kernel checks: the engine's paged attention on long ragged rows, at normal and large scores.

The ``"sdpa"`` backend is the engine's (SDPA for prefill rows, the split-KV
kernel for decode rows); the ``"loop"`` backend is the per-row reference.
These checks need no schedule and no model weights, only the shapes of a preset.
"""

from __future__ import annotations

import time
from typing import Any, Mapping, Sequence

import torch

from .catalog import MAGNITUDES
from .checks import LARGE_SCORE_MIN, TOLERANCES, CheckResult
from .model import DTYPES, PRESETS
from .oracle import partition_leads
from .paged import Metadata, RowSpec, build_metadata, paged_attention
from .sizes import SPLIT_KV_PARTITION
from .threads import pinned

__all__ = ["ATTENTION_CASES", "LARGE_SCORE_GAIN", "MAGNITUDES", "run_attention_parity"]

LARGE_SCORE_GAIN = 32.0
"""Query scale of ``attention_large_scores``: unit-variance q and k then give peak scores ~170."""

# (query_len, kv_len) rows of one ragged batch, after vLLM's paged-attention kernel tests
ATTENTION_CASES: tuple[tuple[int, int], ...] = ((1, 1328), (5, 18), (129, 463), (1, 523), (1, 37), (1, 2011))


def _ragged_batch(cases: Sequence[tuple[int, int]], bs: int, gen: torch.Generator,
                  device: str) -> tuple[Metadata, int]:
    """Metadata of one ragged batch of ``(query_len, kv_len)`` rows on randomly placed pages."""
    pages = [-(-kv // bs) for _, kv in cases]
    order = (torch.randperm(sum(pages), generator=gen) + 1).tolist()
    rows, taken = [], 0
    for (q_len, kv_len), n in zip(cases, pages):
        rows.append(RowSpec(kv_len - q_len, q_len, tuple(order[taken:taken + n])))
        taken += n
    return build_metadata(rows, bs, device), sum(pages)


@pinned
def run_attention_parity(dtype: str, *, device: str = "cpu", preset: str = "tiny", seed: int = 0,
                         cases: Sequence[tuple[int, int]] = ATTENTION_CASES, q_gain: float = 1.0,
                         magnitude: str = "uniform", kernel: Mapping[str, str] | None = None) -> CheckResult:
    """The engine's attention (``"sdpa"`` backend: SDPA for prefill rows, split-KV for decode rows)
    on one ragged batch of ``cases`` (GQA shapes of ``preset``) on randomly placed pages.

    * ``q_gain == 1``: ``attention_parity``, against the ``"loop"`` reference in
      the same dtype; every element finite and within ``attn_atol + attn_rtol * |ref|``.
    * ``q_gain > 1`` (queries scaled up): ``attention_large_scores``, both
      backends against the loop reference in float64 on the same (rounded)
      inputs; finite and within ``attn_large_atol``, and the largest attended
      score must reach ``LARGE_SCORE_MIN``.  ``magnitude`` (``MAGNITUDES``) scales
      the keys of the first split-KV partition or the later ones: with
      ``later_leads`` a later partition's max score must lead the first's by
      ``LARGE_SCORE_MIN`` in some decode row and head, with ``first_leads`` the
      first must lead the newest key's partition by as much.

    ``kernel`` passes fault options (``merge``, ``softmax``, ``count``) to the
    engine's backend, to show the check catches them.
    """
    t0 = time.perf_counter()
    if magnitude not in MAGNITUDES:
        raise ValueError(f"magnitude must be one of {sorted(MAGNITUDES)}, got {magnitude!r}")
    cfg, tol = PRESETS[preset], TOLERANCES[dtype]
    torch_dtype, bs = DTYPES[dtype], cfg.block_size
    gen = torch.Generator().manual_seed(seed)
    meta, n_pages = _ragged_batch(cases, bs, gen, device)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(shape, generator=gen, dtype=torch.float64).to(device=device, dtype=torch_dtype)

    q = rand(meta.num_actual_tokens, cfg.n_heads, cfg.head_dim) * q_gain
    k_cache = rand(1 + n_pages, bs, cfg.n_kv_heads, cfg.head_dim)
    v_cache = rand(1 + n_pages, bs, cfg.n_kv_heads, cfg.head_dim)
    if magnitude != "uniform":
        k_cache = k_cache * _key_gains(meta, 1 + n_pages, MAGNITUDES[magnitude]).to(k_cache)
    large = q_gain != 1.0
    outs = {"sdpa": paged_attention(q, k_cache, v_cache, meta, backend="sdpa", **(kernel or {})).double()}
    details: dict[str, Any] = {"cases": [list(c) for c in cases]}
    if large:
        ref = paged_attention(q.double(), k_cache.double(), v_cache.double(), meta, backend="loop")
        outs["loop"] = paged_attention(q, k_cache, v_cache, meta, backend="loop").double()
        bound = torch.full_like(ref, tol.attn_large_atol)
        tolerance = f"|d_fp64|<={tol.attn_large_atol:g} finite peak_score>={LARGE_SCORE_MIN:g}"
        details["peak_score"], leads = _peak_score(q.double(), k_cache.double(), meta)
        details["later_lead"], details["first_lead"] = leads
    else:
        ref = paged_attention(q, k_cache, v_cache, meta, backend="loop").double()
        bound = tol.attn_atol + tol.attn_rtol * ref.abs()
        tolerance = f"|d|<={tol.attn_atol:g}+{tol.attn_rtol:g}*|ref| finite"
    failures = [] if bool(torch.isfinite(ref).all()) else ["non-finite reference outputs"]
    worst, nonfinite_total = 0.0, 0
    for backend, out in outs.items():
        nonfinite = int((~torch.isfinite(out)).sum())
        nonfinite_total += nonfinite
        diff = (out - ref).abs().nan_to_num(nan=float("inf"))
        worst = max(worst, float(diff.max()))
        if nonfinite:
            failures.append(f"{backend}: {nonfinite} non-finite attention outputs")
        if not bool((diff <= bound).all()):
            failures.append(f"{backend}: {int((~(diff <= bound)).sum())} elements outside tolerance")
    if large and not details["peak_score"] >= LARGE_SCORE_MIN:
        failures.append(f"scores peak at {details['peak_score']:.1f} < {LARGE_SCORE_MIN:g}: raise q_gain")
    side = {"later_leads": "later_lead", "first_leads": "first_lead"}.get(magnitude)
    if side:
        tolerance += f" {side}>={LARGE_SCORE_MIN:g}"
        if not details.get(side, float("-inf")) >= LARGE_SCORE_MIN:
            failures.append(f"{side} {details.get(side, float('-inf')):.1f} < {LARGE_SCORE_MIN:g}: the partitions' "
                            "maxima are too close (needs q_gain and decode rows past 512 keys)")
    return CheckResult(
        name="attention_large_scores" if large else "attention_parity", dtype=dtype, device=device,
        workload="ragged" if magnitude == "uniform" else f"ragged-{magnitude}", passed=not failures,
        mode="tolerance",
        metric=f"|d|={worst:.1e} nonfinite={nonfinite_total} n={ref.numel()}"
               + (f" peak={details['peak_score']:.0f}" if large else "")
               + (f" lead={details[side]:.0f}" if side and large else ""),
        tolerance=tolerance, seconds=time.perf_counter() - t0, failures=failures, details=details,
    )


def _key_gains(meta: Metadata, num_pages: int, gains: tuple[float, float]) -> torch.Tensor:
    """``[num_pages, bs, 1, 1]`` gain of every cache slot: ``gains[0]`` where the slot holds one of its
    row's first ``SPLIT_KV_PARTITION`` keys, ``gains[1]`` past them."""
    bs = meta.block_size
    out = torch.full((num_pages, bs), gains[1], dtype=torch.float64)
    for i, kl in enumerate(meta.seq_lens.tolist()):
        pages = meta.block_table[i, : -(-min(kl, SPLIT_KV_PARTITION) // bs)].long().cpu()
        out[pages] = gains[0]   # 512 is a multiple of the page size: whole pages
    return out[:, :, None, None]


def _peak_score(q: torch.Tensor, k_cache: torch.Tensor, meta: Metadata) -> tuple[float, tuple[float, float]]:
    """Largest attended score of the batch (each row's keys through its block table), and the
    largest :func:`~.oracle.partition_leads` of its one-query rows ``(later over first, first over last)``."""
    bs, kv_heads, hd = k_cache.shape[1:]
    group = q.shape[1] // kv_heads
    peak = float("-inf")
    leads = torch.full((2,), float("-inf"), dtype=torch.float64)
    for i, (qs, qe, kl) in enumerate(zip(meta.query_start_loc.tolist(), meta.query_start_loc[1:].tolist(),
                                         meta.seq_lens.tolist())):
        k = k_cache[meta.block_table[i, : -(-kl // bs)].long()].reshape(-1, kv_heads, hd)[:kl]
        s = torch.einsum("qhd,khd->hqk", q[qs:qe], k.repeat_interleave(group, dim=1)) * hd ** -0.5
        s.masked_fill_(torch.ones(qe - qs, kl, dtype=torch.bool, device=q.device).triu(kl - (qe - qs) + 1),
                       float("-inf"))
        peak = max(peak, float(s.max()))
        if qe - qs == 1:
            leads = torch.maximum(leads, partition_leads(s, kl - 1)[0].cpu())
    return peak, (float(leads[0]), float(leads[1]))
