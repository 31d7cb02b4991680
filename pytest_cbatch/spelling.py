"""Naming an unknown setting with the nearest valid one, the same way in every front end."""

from __future__ import annotations

import difflib
from typing import Iterable

__all__ = ["unknown_name"]


def unknown_name(what: str, name: object, known: Iterable[str]) -> str:
    """``unknown {what} 'capcity' (did you mean 'capacity'?; known: ...)``: a usage error's words.

    ``name`` is whatever the user wrote (not necessarily a string); ``known`` the valid names in order.
    """
    names = list(known)
    text = name if isinstance(name, str) else repr(name)
    shown = text if len(text) <= 60 else text[:57] + "..."
    close = difflib.get_close_matches(text, names, n=1, cutoff=0.6)
    hint = f"did you mean {close[0]!r}?; " if close else ""
    return f"unknown {what} {shown!r} ({hint}known: {', '.join(names)})"
