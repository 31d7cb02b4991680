"""What a token producer of the embedded server is: the ``Backend`` protocol, its ``Sample``, and
how a prompt word becomes a token id.  The backends themselves (:mod:`.backends`, :mod:`.tiny`)
build on this module and on nothing of each other.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Any, Mapping, Protocol, Sequence

__all__ = ["Backend", "NUMERICS", "Sample", "word_token"]

NUMERICS = ("batch_invariant", "batch_variant")


@dataclass(frozen=True)
class Sample:
    """A sampled token and its logprob."""

    token_id: int
    logprob: float


class Backend(Protocol):
    name: str
    vocab: int

    def token_of(self, word: str) -> int: ...
    def text_of(self, token_id: int) -> str: ...
    def add(self, rid: str, prompt: Sequence[int]) -> None: ...
    def forward(self, work: Sequence[Mapping[str, Any]]) -> dict[str, Sample]: ...
    def accept(self, rid: str, token_id: int) -> None: ...
    def preempt(self, rid: str) -> None: ...
    def drop(self, rid: str) -> None: ...


def word_token(word: str, vocab: int) -> int:
    """A prompt word's token id: an integer word maps to itself modulo ``vocab``, any other by CRC32."""
    return int(word) % vocab if word.isdigit() else zlib.crc32(word.encode()) % vocab
