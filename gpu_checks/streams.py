"""Teacher-forced token streams and the per-position logits records of a run.

Request ``r`` of a trace owns the stream ``prompt_tokens + output_tokens``
ids long, drawn from ``seed`` and the request id.  Position ``i`` feeds
``stream[i]``; its logits predict ``stream[i + 1]``.  The last output token
is never fed, so at most ``prompt_tokens + output_tokens - 1`` positions are.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

import torch

__all__ = ["Streams", "Records"]


@dataclass(frozen=True)
class Streams:
    """Token ids of every request in a trace (CPU int64 tensors), keyed by id."""

    tokens: dict[str, torch.Tensor]
    prompt_lens: dict[str, int]

    @classmethod
    def from_trace(cls, trace: Iterable[Mapping[str, Any]], vocab: int, seed: int) -> "Streams":
        tokens: dict[str, torch.Tensor] = {}
        prompts: dict[str, int] = {}
        for line in trace:
            if line["event"] != "arrival":
                continue
            rid = str(line["id"])
            length = int(line["prompt_tokens"]) + int(line["output_tokens"])
            gen = torch.Generator().manual_seed(zlib.crc32(f"{seed}:{rid}".encode()))
            tokens[rid] = torch.randint(0, vocab, (length,), generator=gen)
            prompts[rid] = int(line["prompt_tokens"])
        return cls(tokens, prompts)

    def fed_len(self, rid: str) -> int:
        """Number of positions that can be fed for ``rid`` (stream length - 1)."""
        return self.tokens[rid].numel() - 1


@dataclass
class Records:
    """Logits of every position a run computed, in the order it computed them.

    ``logits [N, vocab]`` stays in the run's dtype and device; the labels are
    Python lists of length ``N``.  A position computed twice (preemption and
    recompute) appears twice.  ``chunk_start`` marks the first token of a
    prefill or recompute row that continues a partly computed sequence.
    """

    logits: torch.Tensor
    request: list[str] = field(default_factory=list)
    position: list[int] = field(default_factory=list)
    step: list[int] = field(default_factory=list)
    phase: list[str] = field(default_factory=list)
    chunk_start: list[bool] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.request)

    def index_of(self) -> dict[tuple[str, int], int]:
        """First record index of every ``(request, position)``."""
        first: dict[tuple[str, int], int] = {}
        for i, key in enumerate(zip(self.request, self.position)):
            first.setdefault(key, i)
        return first

    def select(self, keep: list[int]) -> "Records":
        """The records at indices ``keep`` (in that order)."""
        idx = torch.tensor(keep, dtype=torch.long, device=self.logits.device)
        return Records(
            logits=self.logits[idx],
            request=[self.request[i] for i in keep],
            position=[self.position[i] for i in keep],
            step=[self.step[i] for i in keep],
            phase=[self.phase[i] for i in keep],
            chunk_start=[self.chunk_start[i] for i in keep],
        )
