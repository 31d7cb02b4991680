"""Token producers for the embedded server: they run the scheduler's dispatches and sample tokens.

A backend sees exactly what the scheduler decides: ``add`` when a request
arrives, ``forward(work)`` for every dispatch (its rows: id, phase,
input_tokens), ``accept`` when the scheduler emits a token (the sample is
fed back on the next decode row), ``preempt`` (its KV is gone; recompute
rows rebuild it) and ``drop`` when the request ends.

* ``synthetic`` (default, standard library): the k-th output of a prompt is
  a fixed function of the prompt's token ids and k, whatever the batch, so it
  is trivially batch-invariant and deterministic.
* ``tiny`` (needs torch): the seeded decoder of ``gpu_checks`` with a paged KV
  cache, greedy tokens and their logprobs; see :mod:`pytest_cbatch.live.tiny`.
"""

from __future__ import annotations

import zlib
from typing import Any, Mapping, Sequence

from .sampling import Backend, Sample, word_token

__all__ = ["SyntheticBackend", "make_backend", "BACKENDS"]

BACKENDS = ("synthetic", "tiny")


class SyntheticBackend:
    """Deterministic tokens from the prompt alone: output k = CRC32(prompt ids, k) modulo ``vocab``."""

    name = "synthetic"
    vocab = 1000

    def __init__(self) -> None:
        self._prompts: dict[str, bytes] = {}
        self._emitted: dict[str, int] = {}

    def token_of(self, word: str) -> int:
        return word_token(word, self.vocab)

    def text_of(self, token_id: int) -> str:
        return f" {token_id}"

    def add(self, rid: str, prompt: Sequence[int]) -> None:
        self._prompts[rid] = b",".join(str(t).encode() for t in prompt)
        self._emitted[rid] = 0

    def forward(self, work: Sequence[Mapping[str, Any]]) -> dict[str, Sample]:
        out = {}
        for row in work:
            rid = row["id"]
            crc = zlib.crc32(self._prompts[rid] + b"/%d" % self._emitted[rid])
            token = crc % self.vocab
            out[rid] = Sample(token, -((crc >> 10) % 256 + 1) / 64.0)  # exact binary fractions
        return out

    def accept(self, rid: str, token_id: int) -> None:
        self._emitted[rid] += 1

    def preempt(self, rid: str) -> None:
        """Nothing to rebuild: the next output depends only on the prompt and the count."""

    def drop(self, rid: str) -> None:
        self._prompts.pop(rid, None)
        self._emitted.pop(rid, None)


def make_backend(name: str, *, numerics: str = "batch_invariant", capacity: int, block_size: int,
                 seed: int = 0) -> Backend:
    """Build backend ``name``; ``tiny`` needs torch (MissingExtra names the pip command)."""
    if name == "synthetic":
        return SyntheticBackend()
    if name == "tiny":
        from .. import live

        live.require("torch", "--backend tiny")
        from .tiny import TinyBackend

        return TinyBackend(numerics=numerics, capacity=capacity, block_size=block_size, seed=seed)
    raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, got {name!r}")
