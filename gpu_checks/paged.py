"""Paged KV cache, block allocator, step metadata and paged attention.

The metadata mirrors what serving engines hand their attention kernels
(vLLM ``FlashAttentionMetadata`` plus runner inputs):

* ``positions [T_pad]`` logical position of every token (drives RoPE only);
* ``query_start_loc [B+1]`` row boundaries in the flat token batch;
* ``seq_lens [B]`` KV length of each row after this step (context + chunk);
* ``block_table [B, W]`` physical pages of each row in logical order, 0 = null page;
* ``slot_mapping [T_pad]`` cache slot written by each token, ``-1`` = padding, skipped;
* ``logits_indices [T]`` tokens whose logits are returned (all real tokens here).

Attention is causal and **bottom-right aligned**: query ``j`` of a row with
``q_len`` queries and ``seq_len`` keys sees keys ``0 .. seq_len - q_len + j``.
Two backends compute it: ``"loop"``, a per-row gather + einsum reference in
fp32/fp64 (the shape of vLLM's ``ref_paged_attn`` test oracle), and ``"sdpa"``,
the engine's path, which splits the step as serving engines do: rows with
several queries (prefill, recompute) go through one padded
``scaled_dot_product_attention`` call with a boolean mask, one-query rows
(decode) of up to ``SPLIT_KV_PARTITION`` keys through a second one, and longer
decode rows through a hand-written split-KV kernel (FlashDecoding style):
keys in partitions of ``SPLIT_KV_PARTITION``, a max-subtracted softmax per
partition, partitions merged by log-sum-exp rescaling.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Sequence

import torch
import torch.nn.functional as F

from .sizes import SPLIT_KV_PARTITION

__all__ = [
    "ALIGNS", "BACKENDS", "COUNTS", "MERGES", "SOFTMAXES", "SPLIT_KV_PARTITION", "LOOP_SCORE_BUDGET",
    "Metadata", "RowSpec", "build_metadata",
    "KVCache", "BlockAllocator", "PoolExhausted", "PagedAttention", "paged_attention",
]

BACKENDS = ("sdpa", "loop")
ALIGNS = ("bottom_right", "top_left")
# split-KV faults: "unscaled" partitions summed as they are; "first_max"/"last_max" rescaled to the
# first/last partition's max instead of the common one (exp overflows when another partition leads by > 88.7)
MERGES = ("rescaled", "unscaled", "first_max", "last_max")
SOFTMAXES = ("stable", "naive")        # "naive": exp(scores) without the max subtracted (a bug)
COUNTS = ("exact", "one_short")        # "one_short": ceil((seq_len - 1) / P) partitions, drops a lone newest key
LOOP_SCORE_BUDGET = 1 << 28           # the loop reference scores a row in query blocks of about this many elements
_SDPA_HAS_GQA = tuple(int(x) for x in torch.__version__.split(".")[:2]) >= (2, 5)


@dataclass(frozen=True)
class RowSpec:
    """One row of a step: feed ``num_new`` tokens after ``num_computed`` cached ones."""

    num_computed: int
    num_new: int
    blocks: tuple[int, ...]


@dataclass(frozen=True)
class Metadata:
    """Tensors of one step (see the module docstring); all on the cache's device."""

    positions: torch.Tensor
    query_start_loc: torch.Tensor
    seq_lens: torch.Tensor
    block_table: torch.Tensor
    slot_mapping: torch.Tensor
    logits_indices: torch.Tensor
    block_size: int

    @property
    def num_actual_tokens(self) -> int:
        return int(self.logits_indices.numel())


def build_metadata(rows: Sequence[RowSpec], block_size: int, device: torch.device | str,
                   pad_to: int = 1) -> Metadata:
    """Correct metadata for ``rows``; the flat batch is padded to a multiple of ``pad_to``.

    Each row's ``blocks`` must cover ``num_computed + num_new`` tokens.
    Positions and slots of padding tokens are 0 and -1.
    """
    positions: list[int] = []
    slots: list[int] = []
    starts = [0]
    width = max(len(r.blocks) for r in rows)
    for r in rows:
        if len(r.blocks) * block_size < r.num_computed + r.num_new:
            raise ValueError(f"row needs {r.num_computed + r.num_new} slots, has {len(r.blocks)} pages")
        for pos in range(r.num_computed, r.num_computed + r.num_new):
            positions.append(pos)
            slots.append(r.blocks[pos // block_size] * block_size + pos % block_size)
        starts.append(len(positions))
    total = len(positions)
    padded = -(-total // pad_to) * pad_to
    positions += [0] * (padded - total)
    slots += [-1] * (padded - total)

    def t(values: Sequence[int] | Sequence[Sequence[int]], dtype: torch.dtype) -> torch.Tensor:
        return torch.tensor(values, dtype=dtype, device=device)

    return Metadata(
        positions=t(positions, torch.int64),
        query_start_loc=t(starts, torch.int32),
        seq_lens=t([r.num_computed + r.num_new for r in rows], torch.int32),
        block_table=t([list(r.blocks) + [0] * (width - len(r.blocks)) for r in rows], torch.int32),
        slot_mapping=t(slots, torch.int64),
        logits_indices=torch.arange(total, device=device),
        block_size=block_size,
    )


class PoolExhausted(RuntimeError):
    """The engine's page pool has no free page left."""


class BlockAllocator:
    """Free list of pages ``1 .. num_blocks-1`` (page 0 is the reserved null page).

    The initial order is shuffled from ``seed`` (random physical placement);
    allocation pops the most recently freed page first, so a small pool
    reuses freed pages at once.
    """

    def __init__(self, num_blocks: int, seed: int) -> None:
        self.free_list = list(range(1, num_blocks))
        random.Random(seed).shuffle(self.free_list)

    def allocate(self) -> int:
        if not self.free_list:
            raise PoolExhausted("no free KV page left")
        return self.free_list.pop()

    def release(self, blocks: Sequence[int]) -> None:
        self.free_list.extend(reversed(blocks))


class KVCache:
    """``[layers, 2, num_blocks, block_size, kv_heads, head_dim]`` filled with ``poison``.

    ``poison`` is written at creation and by :meth:`poison_blocks` when pages
    are freed, so any read of a slot that the current owner did not write
    returns a large finite value instead of plausible stale KV or zeros.
    """

    def __init__(self, n_layers: int, num_blocks: int, block_size: int, kv_heads: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device | str, poison: float) -> None:
        self.block_size = block_size
        self.poison = poison
        self.data = torch.full((n_layers, 2, num_blocks, block_size, kv_heads, head_dim), poison,
                               dtype=dtype, device=device)

    def poison_blocks(self, blocks: Sequence[int]) -> None:
        if blocks:
            idx = torch.tensor(list(blocks), device=self.data.device)
            self.data[:, :, idx] = self.poison

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor, slots: torch.Tensor) -> None:
        """Store ``k, v [n, KV, hd]`` at cache ``slots [n]`` (all valid: drop padding first)."""
        kv = self.data[layer]
        kv[0].view(-1, *k.shape[1:])[slots] = k
        kv[1].view(-1, *v.shape[1:])[slots] = v

    def layer(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(k_cache, v_cache)`` of one layer, each ``[num_blocks, block_size, KV, hd]``."""
        return self.data[layer, 0], self.data[layer, 1]


@dataclass(frozen=True)
class _SdpaPlan:
    """One padded SDPA call: gather ``slots [B, Lk]``, queries ``tokens [B, Lq]``, ``mask [B, 1, Lq, Lk]``;
    ``keep`` selects the real queries of the flat output, which land at ``out_tokens``."""

    slots: torch.Tensor
    tokens: torch.Tensor
    mask: torch.Tensor
    keep: torch.Tensor
    out_tokens: torch.Tensor


class PagedAttention:
    """Causal attention of one step's ``T = num_actual_tokens`` queries over the paged cache.

    Build it once per step (it precomputes gather indices and masks from
    ``meta``), then call it once per layer with ``q [T, H, hd]`` and that
    layer's caches.  Row ``i`` reads its first ``seq_lens[i]`` logical slots
    through ``block_table[i]``; ``align="top_left"`` anchors the causal mask
    at the first key instead of the last (the pre-2.1 FlashAttention
    convention).  ``merge`` and ``softmax`` select faults of the split-KV
    decode kernel (``"unscaled"``: partitions summed without rescaling to a
    common max; ``"first_max"``/``"last_max"``: rescaled to the first/last
    partition's max, which overflows once another partition's max leads it by
    ~88.7 in float32; ``"naive"``: ``exp(score)`` without subtracting the max, which
    overflows once a score passes ~88.7 in float32/bfloat16; ``count="one_short"``:
    ``ceil((seq_len - 1) / P)`` partitions, which drops the newest key of a row
    one key past a partition boundary).  A query that
    sees no key gets zeros or NaN (backend and torch version dependent).
    Output: ``[T, H, hd]`` in ``q.dtype``.
    """

    def __init__(self, meta: Metadata, *, backend: str = "sdpa", align: str = "bottom_right",
                 merge: str = "rescaled", softmax: str = "stable", count: str = "exact") -> None:
        for name, value, allowed in (("backend", backend, BACKENDS), ("align", align, ALIGNS),
                                     ("merge", merge, MERGES), ("softmax", softmax, SOFTMAXES),
                                     ("count", count, COUNTS)):
            if value not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, got {value!r}")
        self.meta, self.backend, self.align, self.merge, self.softmax = meta, backend, align, merge, softmax
        self.count = count
        if backend == "loop":
            self.rows = list(zip(meta.query_start_loc.tolist(), meta.query_start_loc[1:].tolist(),
                                 meta.seq_lens.tolist()))
        else:
            qsl = meta.query_start_loc.long()
            q_lens, split = qsl[1:] - qsl[:-1], meta.seq_lens.long() > SPLIT_KV_PARTITION
            groups = ((q_lens > 1), (q_lens == 1) & ~split)   # prefill rows; short decode rows
            self.sdpa_plans = [self._plan_sdpa(rows) for rows in (g.nonzero().squeeze(1) for g in groups)
                               if len(rows)]
            self._plan_decode(((q_lens == 1) & split).nonzero().squeeze(1))

    def __call__(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> torch.Tensor:
        if self.backend == "loop":
            return self._loop(q, k_cache, v_cache)
        out = q.new_zeros(self.meta.num_actual_tokens, *q.shape[1:])
        for plan in self.sdpa_plans:
            out[plan.out_tokens] = self._sdpa(plan, q, k_cache, v_cache)
        if self.decode_tokens.numel():
            out[self.decode_tokens] = self._decode(q, k_cache, v_cache)
        return out

    def _loop(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> torch.Tensor:
        bs, kv_heads, hd = k_cache.shape[1:]
        group = q.shape[1] // kv_heads
        acc = torch.float64 if q.dtype == torch.float64 else torch.float32
        out = torch.zeros_like(q)
        for i, (qs, qe, kl) in enumerate(self.rows):
            ql = qe - qs
            blk = self.meta.block_table[i, : -(-kl // bs)].long()
            k = k_cache[blk].reshape(-1, kv_heads, hd)[:kl].repeat_interleave(group, dim=1).to(acc)
            v = v_cache[blk].reshape(-1, kv_heads, hd)[:kl].repeat_interleave(group, dim=1).to(acc)
            diagonal = kl - ql + 1 if self.align == "bottom_right" else 1
            masked = torch.ones(ql, kl, dtype=torch.bool, device=q.device).triu(diagonal)
            block = max(1, LOOP_SCORE_BUDGET // max(1, q.shape[1] * kl))
            for b in range(qs, qe, block):   # blocks of queries: the same rows, bounded memory
                e = min(b + block, qe)
                s = torch.einsum("qhd,khd->hqk", q[b:e].to(acc), k) * hd ** -0.5
                s.masked_fill_(masked[b - qs:e - qs], float("-inf"))
                out[b:e] = torch.einsum("hqk,khd->qhd", torch.softmax(s, dim=-1), v).to(q.dtype)
        return out

    def _gather_plan(self, rows: torch.Tensor, width: int) -> torch.Tensor:
        """Cache slots ``[len(rows), width]`` of the first ``width`` logical slots of ``rows``."""
        meta = self.meta
        bs, table_width = meta.block_size, meta.block_table.shape[1]
        kpos = torch.arange(width, device=meta.seq_lens.device)
        pages = meta.block_table[rows].long().gather(
            1, (kpos // bs).clamp(max=table_width - 1).expand(len(rows), -1))
        return pages * bs + kpos % bs

    def _plan_sdpa(self, rows: torch.Tensor) -> "_SdpaPlan":
        meta = self.meta
        device = meta.seq_lens.device
        qsl = meta.query_start_loc.long()[rows]
        seq_lens = meta.seq_lens.long()[rows]
        q_lens = meta.query_start_loc.long()[rows + 1] - qsl
        lq, lk = int(q_lens.max()), max(int(seq_lens.max()), 1)
        kpos = torch.arange(lk, device=device)
        j = torch.arange(lq, device=device)
        valid = j[None, :] < q_lens[:, None]                                     # [B, Lq]
        tokens = (qsl[:, None] + j[None, :]).clamp(max=max(meta.num_actual_tokens - 1, 0))
        qpos = j[None, :] + ((seq_lens - q_lens)[:, None] if self.align == "bottom_right" else 0)
        mask = (kpos[None, None, :] <= qpos[:, :, None]) & (kpos[None, None, :] < seq_lens[:, None, None])
        keep = valid.flatten().nonzero().squeeze(1)   # padding queries are computed, then dropped
        return _SdpaPlan(slots=self._gather_plan(rows, lk), tokens=tokens, mask=mask[:, None], keep=keep,
                         out_tokens=tokens.flatten()[keep])

    @staticmethod
    def _sdpa(plan: "_SdpaPlan", q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> torch.Tensor:
        kv_heads, hd = k_cache.shape[2:]
        k = k_cache.reshape(-1, kv_heads, hd)[plan.slots].transpose(1, 2)    # [B, KV, Lk, hd]
        v = v_cache.reshape(-1, kv_heads, hd)[plan.slots].transpose(1, 2)
        qb = q[plan.tokens].transpose(1, 2)                                    # [B, H, Lq, hd]
        if _SDPA_HAS_GQA:
            out = F.scaled_dot_product_attention(qb, k, v, attn_mask=plan.mask, scale=hd ** -0.5, enable_gqa=True)
        else:
            group = q.shape[1] // kv_heads
            out = F.scaled_dot_product_attention(qb, k.repeat_interleave(group, 1), v.repeat_interleave(group, 1),
                                                 attn_mask=plan.mask, scale=hd ** -0.5)
        return out.transpose(1, 2).flatten(0, 1)[plan.keep]

    def _plan_decode(self, rows: torch.Tensor) -> None:
        meta = self.meta
        self.decode_tokens = meta.query_start_loc.long()[rows]
        if not len(rows):
            return
        seq_lens = meta.seq_lens.long()[rows]
        lk = max(int(seq_lens.max()), 1)
        self.partitions = -(-lk // SPLIT_KV_PARTITION)
        width = lk if self.partitions == 1 else self.partitions * SPLIT_KV_PARTITION
        self.decode_slots = self._gather_plan(rows, width)                       # [Bd, Lk]
        kpos = torch.arange(width, device=seq_lens.device)
        qpos = seq_lens - 1 if self.align == "bottom_right" else torch.zeros_like(seq_lens)
        self.decode_mask = (kpos[None, :] <= qpos[:, None]) & (kpos[None, :] < seq_lens[:, None])
        if self.count == "one_short":
            counted = ((seq_lens - 2).clamp(min=0) // SPLIT_KV_PARTITION + 1) * SPLIT_KV_PARTITION
            self.decode_mask &= kpos[None, :] < counted[:, None]
        # the partition of each row's newest key (the "last" one of a last_max merge)
        self.last_partition = ((seq_lens - 1) // SPLIT_KV_PARTITION).clamp(max=self.partitions - 1)

    def _decode(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> torch.Tensor:
        kv_heads, hd = k_cache.shape[2:]
        acc = torch.float64 if q.dtype == torch.float64 else torch.float32
        n, heads = len(self.decode_tokens), q.shape[1]
        parts = self.partitions
        k = k_cache.reshape(-1, kv_heads, hd)[self.decode_slots].to(acc)      # [Bd, Lk, KV, hd]
        v = v_cache.reshape(-1, kv_heads, hd)[self.decode_slots].to(acc)
        qd = q[self.decode_tokens].to(acc).view(n, kv_heads, heads // kv_heads, hd)
        s = torch.einsum("bkgd,blkd->bkgl", qd, k) * hd ** -0.5                # [Bd, KV, G, Lk]
        s = s.masked_fill(~self.decode_mask[:, None, None, :], float("-inf"))
        s = s.unflatten(-1, (parts, -1))                                       # [Bd, KV, G, P, Lk/P]
        m = s.amax(-1, keepdim=True)                                           # -inf: partition sees no key
        if self.softmax == "naive":
            p = s.exp()
        else:
            p = (s - torch.where(torch.isfinite(m), m, torch.zeros_like(m))).exp()
        o = torch.einsum("bkgpl,bplkd->bkgpd", p, v.unflatten(1, (parts, -1)))  # [Bd, KV, G, P, hd]
        l = p.sum(-1, keepdim=True)                                            # [Bd, KV, G, P, 1]
        if self.merge != "unscaled" and self.softmax == "stable":
            if self.merge == "first_max":
                ref = m[..., :1, :]
            elif self.merge == "last_max":
                ref = m.gather(-2, self.last_partition.view(n, 1, 1, 1, 1).expand(n, *m.shape[1:3], 1, 1))
            else:
                ref = m.amax(-2, keepdim=True)
            w = (m - ref).exp()                          # exp(m_i - max_i m_i); 0 for empty partitions
            o, l = o * w, l * w
        out = o.sum(-2) / l.sum(-2)                                            # [Bd, KV, G, hd]
        return out.reshape(n, heads, hd).to(q.dtype)


def paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: Metadata, *,
                    backend: str = "sdpa", align: str = "bottom_right", merge: str = "rescaled",
                    softmax: str = "stable", count: str = "exact") -> torch.Tensor:
    """One-shot :class:`PagedAttention` (builds the plan and applies it to one layer)."""
    return PagedAttention(meta, backend=backend, align=align, merge=merge, softmax=softmax,
                          count=count)(q, k_cache, v_cache)
