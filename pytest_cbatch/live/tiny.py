"""The ``tiny`` backend: gpu_checks' seeded decoder on the scheduler's real dispatches (needs torch).

This is the only module of the live package that touches ``gpu_checks``: it
uses ``model`` (Model, PRESETS), the paged cache's public pieces (KVCache,
BlockAllocator, RowSpec, build_metadata) and ``engine.paged_forward``.

Each dispatch row feeds positions ``[computed, computed + n)`` of its
request's stream (prompt + accepted outputs) into a paged KV cache; the row's
last position gives the greedy next token and its logprob (float32 on CPU).

Numerics, explicit:

* ``batch_invariant``: every token of every row runs as its own one-token,
  one-row forward, so each sequence's logits come from a fixed reduction
  order whatever else the dispatch holds; outputs are bitwise identical at
  every batch size.
* ``batch_variant``: the whole dispatch runs as one batched forward, and when
  it holds more than one sequence the linear layers reduce over K in four
  slices (``Model.forward(splitk=True)``): the reduction order depends on the
  batch, as it does when a GEMM kernel is chosen by batch size.  Logprobs of
  the same prompt then move by a few ulp between batch sizes.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import torch

from ..gpu_checks.engine import paged_forward
from ..gpu_checks.model import PRESETS, Model
from ..gpu_checks.paged import BlockAllocator, KVCache, RowSpec, build_metadata
from .sampling import NUMERICS, Sample, word_token

__all__ = ["TinyBackend"]


class TinyBackend:
    """Greedy decoding on the ``tiny`` preset (float32, CPU), weights from ``seed``."""

    name = "tiny"

    def __init__(self, *, numerics: str, capacity: int, block_size: int, seed: int = 0) -> None:
        if numerics not in NUMERICS:
            raise ValueError(f"numerics must be one of {', '.join(NUMERICS)}, got {numerics!r}")
        self.numerics = numerics
        self.model = Model.from_seed(PRESETS["tiny"], seed, torch.float32)
        self.vocab = self.model.config.vocab
        self.block_size = block_size
        c = self.model.config
        # one page per scheduler page, plus the null page 0 the metadata pads with
        self.cache = KVCache(c.n_layers, capacity + 1, block_size, c.n_kv_heads, c.head_dim, torch.float32,
                             "cpu", poison=100.0)
        self.allocator = BlockAllocator(capacity + 1, seed=0)
        self.streams: dict[str, list[int]] = {}
        self.computed: dict[str, int] = {}
        self.pages: dict[str, list[int]] = {}

    def token_of(self, word: str) -> int:
        return word_token(word, self.vocab)

    def text_of(self, token_id: int) -> str:
        return f" {token_id}"

    def add(self, rid: str, prompt: Sequence[int]) -> None:
        self.streams[rid] = list(prompt)
        self.computed[rid] = 0
        self.pages[rid] = []

    def _rows(self, work: Sequence[Mapping[str, Any]]) -> list[tuple[str, int, int]]:
        rows = []
        for item in work:
            rid, n = item["id"], item["input_tokens"]
            start = self.computed[rid]
            pages = self.pages[rid]
            while len(pages) * self.block_size < start + n:
                pages.append(self.allocator.allocate())
            rows.append((rid, start, n))
        return rows

    def _run(self, rows: list[tuple[str, int, int]], splitk: bool) -> torch.Tensor:
        specs = [RowSpec(start, n, tuple(self.pages[rid])) for rid, start, n in rows]
        meta = build_metadata(specs, self.block_size, "cpu", pad_to=1)
        ids = torch.tensor([t for rid, start, n in rows for t in self.streams[rid][start:start + n]])
        return paged_forward(self.model, self.cache, meta, ids, splitk=splitk)

    def forward(self, work: Sequence[Mapping[str, Any]]) -> dict[str, Sample]:
        rows = self._rows(work)
        last: dict[str, torch.Tensor] = {}
        if self.numerics == "batch_invariant":
            for rid, start, n in rows:
                for j in range(n):
                    last[rid] = self._run([(rid, start + j, 1)], splitk=False)[0]
        else:
            logits = self._run(rows, splitk=len(rows) > 1)
            end = 0
            for rid, start, n in rows:
                end += n
                last[rid] = logits[end - 1]
        for rid, start, n in rows:
            self.computed[rid] = start + n
        out = {}
        for rid, row in last.items():
            logprobs = torch.log_softmax(row, dim=-1)
            token = int(torch.argmax(logprobs))
            value = float(logprobs[token])
            out[rid] = Sample(token, value if math.isfinite(value) else -1e30)
        return out

    def accept(self, rid: str, token_id: int) -> None:
        self.streams[rid].append(token_id)

    def preempt(self, rid: str) -> None:
        self._free(rid)
        self.computed[rid] = 0

    def drop(self, rid: str) -> None:
        self._free(rid)
        self.streams.pop(rid, None)
        self.computed.pop(rid, None)
        self.pages.pop(rid, None)

    def _free(self, rid: str) -> None:
        pages = self.pages.get(rid, [])
        self.allocator.release(pages)
        self.cache.poison_blocks(pages)
        self.pages[rid] = []
