"""Server-sent events: splitting a body into data frames, and counting the tokens a frame carries.

A streamed OpenAI-compatible response is a sequence of ``data: <json>``
events separated by blank lines and ended by ``data: [DONE]``.  A real server
may put several tokens in one frame (vLLM merges them whenever the HTTP side
falls behind), so tokens are counted from the frame itself, in this order:

1. ``choices[i].token_ids`` when the server returns them (vLLM does with
   ``return_token_ids: true``);
2. else the logprobs tokens (``logprobs.tokens`` on completions,
   ``logprobs.content`` on chat);
3. else one token per frame whose text (``text``, or ``delta.content`` on
   chat) is non-empty.

Token text may be empty (a partial UTF-8 byte): with token ids or logprobs
such a frame still counts its tokens; without them it counts none.  A frame
with no choices (the final usage frame) carries no token.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

__all__ = ["DONE", "SSEDecoder", "ChoiceTokens", "parse_data", "choice_tokens", "StreamFormatError"]

DONE = "[DONE]"


class StreamFormatError(ValueError):
    """A data frame is not what an OpenAI-compatible stream sends (the message says what)."""


class SSEDecoder:
    """Incremental SSE parser: feed it lines (bytes, with or without the newline), get event data back.

    Follows the SSE rules the servers use: ``data:`` lines of one event are
    joined with newlines, a blank line ends the event, ``:`` lines are
    comments, other fields (``event:``, ``id:``, ``retry:``) are ignored.
    """

    def __init__(self) -> None:
        self._data: list[str] = []

    def feed(self, line: bytes | str) -> list[str]:
        """Consume one line; return the data of the event it completes (zero or one items)."""
        text = line.decode("utf-8", errors="replace") if isinstance(line, bytes) else line
        text = text.rstrip("\r\n")
        if not text:
            return self.flush()
        if text.startswith(":"):
            return []
        name, _, value = text.partition(":")
        if name == "data":
            self._data.append(value[1:] if value.startswith(" ") else value)
        return []

    def flush(self) -> list[str]:
        """End the current event (at a blank line or the end of the body)."""
        if not self._data:
            return []
        data, self._data = "\n".join(self._data), []
        return [data]


def parse_data(data: str) -> dict[str, Any] | None:
    """The JSON object of one event's data, or None for ``[DONE]``; StreamFormatError otherwise.

    An ``{"error": ...}`` object (what vLLM streams when a request fails mid-way)
    is reported as a StreamFormatError carrying the server's message.
    """
    if data.strip() == DONE:
        return None
    try:
        doc = json.loads(data)
    except json.JSONDecodeError as exc:
        raise StreamFormatError(f"data frame is not JSON ({exc.msg}): {data[:120]!r}") from None
    if not isinstance(doc, dict):
        raise StreamFormatError(f"data frame is not a JSON object: {data[:120]!r}")
    if "error" in doc and "choices" not in doc:
        err = doc["error"]
        message = err.get("message", err) if isinstance(err, dict) else err
        raise StreamFormatError(f"the server reported an error in the stream: {message}")
    choices = doc.get("choices", [])
    if not isinstance(choices, list) or not all(isinstance(c, dict) for c in choices):
        raise StreamFormatError(f"'choices' is not a list of objects: {data[:120]!r}")
    return doc


@dataclass
class ChoiceTokens:
    """What one choice of one frame carries."""

    count: int
    text: str = ""
    token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    finish_reason: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def _logprob_tokens(logprobs: Any) -> tuple[list[Any], list[float]] | None:
    if not isinstance(logprobs, dict):
        return None
    if isinstance(logprobs.get("content"), list):          # chat
        items = logprobs["content"]
        return [i.get("token") for i in items], [i.get("logprob") for i in items]
    if isinstance(logprobs.get("tokens"), list):           # completions
        return list(logprobs["tokens"]), list(logprobs.get("token_logprobs") or [])
    return None


def choice_tokens(choice: dict[str, Any]) -> ChoiceTokens:
    """Count the tokens of one choice by the rules in the module docstring."""
    if "delta" in choice:
        delta = choice.get("delta") or {}
        text = delta.get("content") if isinstance(delta, dict) else None
    else:
        text = choice.get("text")
    text = text if isinstance(text, str) else ""
    finish = choice.get("finish_reason")
    ids = choice.get("token_ids")
    lp = _logprob_tokens(choice.get("logprobs"))
    logprobs = [float(x) for x in lp[1] if isinstance(x, (int, float))] if lp else None
    if isinstance(ids, list):
        if not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
            raise StreamFormatError(f"token_ids is not a list of integers: {ids!r:.120}")
        return ChoiceTokens(len(ids), text, ids, logprobs, finish)
    if lp is not None:
        return ChoiceTokens(len(lp[0]), text, None, logprobs, finish)
    return ChoiceTokens(1 if text else 0, text, None, None, finish)
