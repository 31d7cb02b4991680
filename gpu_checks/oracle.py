"""The unbatched oracle: each request alone, dense causal attention, no paging.

It shares only the model's elementwise code (embedding, RMSNorm, RoPE, MLP,
head) with the engine; metadata, pages and the paged attention backends are
not involved, so a bug there cannot hide in the oracle too.
"""

from __future__ import annotations

import functools
from typing import Iterable

import torch

from .model import Model
from .sizes import SPLIT_KV_PARTITION
from .streams import Records, Streams

__all__ = ["SCORE_BUDGET", "query_block", "dense_attention", "dense_records", "partition_leads"]


SCORE_BUDGET = 1 << 27  # score elements per block: a 32k-token request alone stays near 1 GiB in float64


def query_block(heads: int, keys: int) -> int:
    """Queries scored at once so a block's ``heads x block x keys`` scores stay within ``SCORE_BUDGET``."""
    return max(64, min(1024, SCORE_BUDGET // max(1, heads * keys)))


def partition_leads(s: torch.Tensor, first_query: int) -> torch.Tensor:
    """``[q, 2]``: per query of the masked scores ``s [H, q, k]`` (query ``j`` is at position
    ``first_query + j`` and sees keys ``0..first_query + j``), the largest over heads of (a) a later
    split-KV partition's max score minus the first partition's and (b) the first partition's max
    minus the max of the partition holding the query's newest key; ``-inf`` for queries whose keys
    fit one partition."""
    P = SPLIT_KV_PARTITION
    H, q, k = s.shape
    parts = -(-k // P)
    if parts < 2:
        return torch.full((q, 2), float("-inf"), dtype=torch.float64, device=s.device)
    m = torch.nn.functional.pad(s, (0, parts * P - k), value=float("-inf")).unflatten(-1, (parts, P)).amax(-1)
    pos = torch.arange(first_query, first_query + q, device=s.device)
    last = (pos // P).clamp(max=parts - 1)
    m_last = m.gather(-1, last.view(1, q, 1).expand(H, q, 1)).squeeze(-1)
    leads = torch.stack((m[..., 1:].amax(-1) - m[..., 0], m[..., 0] - m_last), dim=-1).amax(0).double()
    return leads.masked_fill((pos < P)[:, None], float("-inf"))


def dense_attention(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *,
                    peak: list[float] | None = None, leads: list[torch.Tensor] | None = None) -> torch.Tensor:
    """Causal attention of one whole sequence (``tril`` mask), scores in fp32 or fp64.

    Queries are scored in blocks (:func:`query_block`); each query's softmax
    still runs over all its keys at once.  ``peak``, when given, receives the
    largest attended score of every block (the regime a run actually reached);
    ``leads`` receives this layer's :func:`partition_leads` of every query (``[n, 2]``).
    """
    del layer  # same rule in every layer
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    group = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(group, dim=1).to(acc)
    v = v.repeat_interleave(group, dim=1).to(acc)
    n = q.shape[0]
    out = torch.empty_like(q)
    block = query_block(q.shape[1], n)
    layer_leads = []
    for b in range(0, n, block):
        e = min(b + block, n)
        s = torch.einsum("qhd,khd->hqk", q[b:e].to(acc), k[:e]) * q.shape[-1] ** -0.5
        s.masked_fill_(torch.ones(e - b, e, dtype=torch.bool, device=q.device).triu(b + 1), float("-inf"))
        if peak is not None:
            peak.append(float(s.max()))
        if leads is not None:
            layer_leads.append(partition_leads(s, b))
        out[b:e] = torch.einsum("hqk,khd->qhd", torch.softmax(s, dim=-1), v[:e]).to(q.dtype)
    if leads is not None:
        leads.append(torch.cat(layer_leads).cpu())
    return out


@torch.no_grad()
def dense_records(model: Model, streams: Streams, requests: Iterable[str], *,
                  peak: list[float] | None = None, leads: dict[str, torch.Tensor] | None = None) -> Records:
    """Logits of every feedable position of each request in ``requests``, each run alone.

    ``peak`` collects attended attention scores' block maxima (see :func:`dense_attention`);
    ``leads[request]`` receives ``[n, 2]``: each position's :func:`partition_leads`, max over layers.
    """
    parts: list[torch.Tensor] = []
    out = Records(logits=torch.empty(0))
    for rid in requests:
        n = streams.fed_len(rid)
        ids = streams.tokens[rid][:n].to(model.device)
        layers: list[torch.Tensor] | None = [] if leads is not None else None
        attend = functools.partial(dense_attention, peak=peak, leads=layers)
        parts.append(model.forward(ids, torch.arange(n, device=model.device), attend))
        if leads is not None and layers:
            leads[rid] = torch.stack(layers).amax(0)
        out.request += [rid] * n
        out.position += range(n)
        out.step += [0] * n
        out.phase += ["dense"] * n
        out.chunk_start += [False] * n
    out.logits = torch.cat(parts) if parts else torch.empty(0, model.config.vocab, device=model.device)
    return out
