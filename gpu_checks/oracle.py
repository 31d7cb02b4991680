"""The unbatched oracle: each request alone, dense causal attention, no paging.

It shares only the model's elementwise code (embedding, RMSNorm, RoPE, MLP,
head) with the engine; metadata, pages and the paged attention backends are
not involved, so a bug there cannot hide in the oracle too.
"""

from __future__ import annotations

from typing import Iterable

import torch

from .model import Model
from .streams import Records, Streams

__all__ = ["dense_attention", "dense_records"]


def dense_attention(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal attention of one whole sequence (``tril`` mask), scores in fp32 or fp64."""
    del layer  # same rule in every layer
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    group = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(group, dim=1).to(acc)
    v = v.repeat_interleave(group, dim=1).to(acc)
    s = torch.einsum("qhd,khd->hqk", q.to(acc), k) * q.shape[-1] ** -0.5
    n = q.shape[0]
    s.masked_fill_(torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    return torch.einsum("hqk,khd->qhd", torch.softmax(s, dim=-1), v).to(q.dtype)


@torch.no_grad()
def dense_records(model: Model, streams: Streams, requests: Iterable[str]) -> Records:
    """Logits of every feedable position of each request in ``requests``, each run alone."""
    parts: list[torch.Tensor] = []
    out = Records(logits=torch.empty(0))
    for rid in requests:
        n = streams.fed_len(rid)
        ids = streams.tokens[rid][:n].to(model.device)
        parts.append(model.forward(ids, torch.arange(n, device=model.device), dense_attention))
        out.request += [rid] * n
        out.position += range(n)
        out.step += [0] * n
        out.phase += ["dense"] * n
        out.chunk_start += [False] * n
    out.logits = torch.cat(parts) if parts else torch.empty(0, model.config.vocab, device=model.device)
    return out
