"""Counted nouns in messages: "1 page", "2 pages", the same way everywhere."""

from __future__ import annotations

__all__ = ["counted"]


def counted(count: int, noun: str, plural: str | None = None) -> str:
    """``count`` and ``noun``, the noun in the plural (``plural``, default ``noun + "s"``) unless count is 1."""
    return f"{count} {noun if count == 1 else plural or noun + 's'}"
