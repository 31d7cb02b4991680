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
from .streams import Records, Streams

__all__ = ["SCORE_BUDGET", "query_block", "dense_attention", "dense_records"]


SCORE_BUDGET = 1 << 27  # score elements per block: a 32k-token request alone stays near 1 GiB in float64


def query_block(heads: int, keys: int) -> int:
    """Queries scored at once so a block's ``heads x block x keys`` scores stay within ``SCORE_BUDGET``."""
    return max(64, min(1024, SCORE_BUDGET // max(1, heads * keys)))


def dense_attention(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *,
                    peak: list[float] | None = None) -> torch.Tensor:
    """Causal attention of one whole sequence (``tril`` mask), scores in fp32 or fp64.

    Queries are scored in blocks (:func:`query_block`); each query's softmax
    still runs over all its keys at once.  ``peak``, when given, receives the
    largest attended score of every block (the regime a run actually reached).
    """
    del layer  # same rule in every layer
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    group = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(group, dim=1).to(acc)
    v = v.repeat_interleave(group, dim=1).to(acc)
    n = q.shape[0]
    out = torch.empty_like(q)
    block = query_block(q.shape[1], n)
    for b in range(0, n, block):
        e = min(b + block, n)
        s = torch.einsum("qhd,khd->hqk", q[b:e].to(acc), k[:e]) * q.shape[-1] ** -0.5
        s.masked_fill_(torch.ones(e - b, e, dtype=torch.bool, device=q.device).triu(b + 1), float("-inf"))
        if peak is not None:
            peak.append(float(s.max()))
        out[b:e] = torch.einsum("hqk,khd->qhd", torch.softmax(s, dim=-1), v[:e]).to(q.dtype)
    return out


@torch.no_grad()
def dense_records(model: Model, streams: Streams, requests: Iterable[str], *,
                  peak: list[float] | None = None) -> Records:
    """Logits of every feedable position of each request in ``requests``, each run alone.

    ``peak`` collects attended attention scores' block maxima (see :func:`dense_attention`).
    """
    attend = dense_attention if peak is None else functools.partial(dense_attention, peak=peak)
    parts: list[torch.Tensor] = []
    out = Records(logits=torch.empty(0))
    for rid in requests:
        n = streams.fed_len(rid)
        ids = streams.tokens[rid][:n].to(model.device)
        parts.append(model.forward(ids, torch.arange(n, device=model.device), attend))
        out.request += [rid] * n
        out.position += range(n)
        out.step += [0] * n
        out.phase += ["dense"] * n
        out.chunk_start += [False] * n
    out.logits = torch.cat(parts) if parts else torch.empty(0, model.config.vocab, device=model.device)
    return out
