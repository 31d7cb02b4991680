"""The grader's boundary for what a submission hands it as names, files and strings.

``plain`` turns the values judged code returns into plain data; this module is its twin for everything
else a submission controls that the grader reads, writes or shows: the names of its files and folders,
the files it ships (a manifest), and every string copied out of it (an exception's message, an exit
value, a refusal, a flag).  Nothing here runs the submission's code, and every function is total: any
input ends in a bounded, safe value or in ``UntrustedFile`` naming the problem.

* ``name(raw)`` is the kit's name for a file or folder name of any bytes: the name itself where it is
  made of letters, digits and ``-_.``, else the same with every other character percent-encoded (as
  its bytes: ``caf%E9`` for a Latin-1 ``café``), so it is printable, valid UTF-8, one path component,
  safe in a spreadsheet cell, and two different names never meet.  A name that would take the place of
  one of the caller's own outputs (``reserved``) has its dots encoded too.
* ``read_file(path, limit)`` reads a file the submission ships: a plain file only (never through a
  link, never a FIFO or a device, which could block the grader or never end), at most ``limit`` bytes.
* ``text(value, limit)`` is a string made safe to write anywhere as UTF-8 and to show on a terminal:
  lone surrogates and control characters (but newline and tab) written as visible escapes, at most
  ``limit`` characters, with the cut said.  ``line`` is the same on one line (newlines escaped too).
* ``cell(value)`` is ``line`` for a CSV cell that a spreadsheet would evaluate: one starting with
  ``= + - @`` (or their full-width forms) gets a leading ``'``.
* ``document(value)`` copies a JSON-ready structure with every string (keys too) passed through ``text``
  without a bound, so what the kit writes as JSON is valid Unicode on every reader.
"""

from __future__ import annotations

import hashlib
import os
import stat
from typing import Any, Iterable

from .plain import describe

__all__ = ["MESSAGE_LIMIT", "UntrustedFile", "cell", "document", "line", "name", "read_file", "text"]

MESSAGE_LIMIT = 2000
"""Default bound of a message copied from a submission (an exception's text, an exit value)."""

_NAME_BYTES = 200  # a name's encoding stays well inside a file system's 255-byte component
_FORMULA = frozenset("=+-@\uff1d\uff0b\uff0d\uff20")


class UntrustedFile(ValueError):
    """A file of the submission that the grader does not read; the message says why."""


def name(raw: str | bytes, reserved: Iterable[str] = ()) -> str:
    """The kit's name for the file or folder name ``raw`` (as ``os.listdir`` gives it, or its bytes).

    Injective and stable: the same raw name gives the same result on every machine and two different
    raw names never give the same one (a name longer than about 200 bytes once encoded is cut and
    ends in a hash of the whole).  ``reserved``: names (compared without case) that must not come
    out, e.g. an output file beside the submissions' folders; ``summary.csv`` becomes ``summary%2Ecsv``.
    """
    data = raw if isinstance(raw, bytes) else os.fsencode(raw)
    out: list[str] = []
    for ch in data.decode("utf-8", "surrogateescape"):
        if (ch.isalnum() or ch in "-_.") and not "\ud800" <= ch <= "\udfff":
            out.append(ch)
        else:
            out.append("".join(f"%{b:02X}" for b in ch.encode("utf-8", "surrogateescape")))
    if out and out[0] in ("-", "."):  # an option on a command line, a hidden file
        out[0] = f"%{ord(out[0]):02X}"
    result = "".join(out) or "%00"
    folded = result.casefold()
    if folded in {r.casefold() for r in reserved} or folded.endswith(".tmp"):
        result = result.replace(".", "%2E")
    if len(result.encode("utf-8")) > _NAME_BYTES:
        result = result[:120] + "~" + hashlib.sha256(data).hexdigest()[:16]
    return result


def read_file(path: str | os.PathLike[str], limit: int) -> bytes:
    """The contents of the plain file ``path``, at most ``limit`` bytes; ``UntrustedFile`` otherwise.

    The file is opened without following a link and without blocking, and checked to be a regular
    file before a byte is read, so a FIFO, a device or a huge sparse file costs the grader nothing.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise UntrustedFile(f"cannot be opened as a plain file ({exc.strerror})") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise UntrustedFile("is not a plain file (a FIFO, socket or device is never read)")
        if info.st_size > limit:
            raise UntrustedFile(f"is larger than {_size(limit)} ({info.st_size} bytes)")
        chunks, left = [], limit + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 16))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        data = b"".join(chunks)
        if len(data) > limit:
            raise UntrustedFile(f"is larger than {_size(limit)}")
        return data
    finally:
        os.close(fd)


def _size(limit: int) -> str:
    return f"{limit >> 10} KiB" if limit >= 1024 and not limit % 1024 else f"{limit} bytes"


def text(value: Any, limit: int | None = MESSAGE_LIMIT) -> str:
    """``value`` (a string; anything else is described by type) safe to write as UTF-8 and to print.

    Lone surrogates become ``\\udcff``, other control characters ``\\x1b``-style escapes (newline and
    tab stay); past ``limit`` characters the text is cut and says how much was left out.
    """
    return _safe(value, limit, keep="\n\t")


def line(value: Any, limit: int | None = MESSAGE_LIMIT) -> str:
    """``text`` on one line: newlines, tabs and carriage returns escaped too."""
    return _safe(value, limit, keep="")


def cell(value: Any, limit: int | None = MESSAGE_LIMIT) -> str:
    """``value`` as a CSV cell no spreadsheet evaluates: ``line``, with a ``'`` before a formula's first
    character.  Numbers pass as they are."""
    if type(value) in (int, float):
        return str(value)
    safe = line(value, limit)
    return "'" + safe if safe[:1] in _FORMULA else safe


def document(value: Any) -> Any:
    """A copy of the JSON-ready ``value`` with every string (keys included) valid Unicode (``text``,
    unbounded); containers are copied, other values kept."""
    if isinstance(value, str):
        return _safe(value, None, keep="\n\t\r")
    if isinstance(value, dict):
        return {document(k) if isinstance(k, str) else k: document(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [document(v) for v in value]
    return value


def _safe(value: Any, limit: int | None, keep: str) -> str:
    if not isinstance(value, str):
        value = describe(value)
    else:
        value = str.__str__(value)  # a str subclass's own __str__ is never run
    cut = 0
    if limit is not None and len(value) > limit:
        cut, value = len(value) - limit, value[:limit]
    if value.isprintable():
        out = value
    else:
        out = "".join(ch if ch.isprintable() or ch in keep else _escape(ch) for ch in value)
    return out + (f"... ({cut} more characters)" if cut else "")


def _escape(ch: str) -> str:
    code = ord(ch)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"
