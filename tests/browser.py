"""Headless Chromium for the picture tests: open a page and hear its console, take a screenshot, read its pixels.

Debian's ``chromium`` package (``apt-get install chromium``; ``.ci/run`` installs it).  Every run gets a new
empty profile and no network features; ``--no-sandbox`` because CI runs as root.  ``chromium()`` is None where
it is missing, and the tests skip saying so.
"""

from __future__ import annotations

import shutil
import struct
import subprocess
import tempfile
import zlib
from pathlib import Path

__all__ = ["chromium", "console_problems", "marker_pixels", "png_rgb", "screenshot", "SKIP_REASON"]

SKIP_REASON = "headless Chromium is not installed (Debian: apt-get install -y chromium)"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--enable-logging=stderr", "--v=0"]


def chromium() -> str | None:
    """The Chromium executable, or None."""
    return shutil.which("chromium") or shutil.which("chromium-browser")


def _run(page: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    exe = chromium()
    assert exe is not None, SKIP_REASON
    with tempfile.TemporaryDirectory(prefix="cbatch-chromium-") as profile:
        return subprocess.run([exe, *FLAGS, f"--user-data-dir={profile}", *extra, page.resolve().as_uri()],
                              capture_output=True, text=True, timeout=120)


def console_problems(page: Path) -> tuple[list[str], str]:
    """Load ``page``; the console's messages and refusals Chromium logged (CSP, failed loads), and the DOM."""
    done = _run(page, "--dump-dom")
    problems = [line for line in done.stderr.splitlines()
                if ":CONSOLE" in line or "Refused to" in line or "net::ERR" in line or "Uncaught" in line]
    return problems, done.stdout


def screenshot(page: Path, png: Path, width: int = 1400, height: int = 900) -> None:
    """Write a screenshot of ``page`` (the first ``width`` x ``height`` pixels) to ``png``."""
    done = _run(page, f"--screenshot={png}", f"--window-size={width},{height}", "--hide-scrollbars")
    assert png.is_file(), done.stderr[-2000:]


def png_rgb(data: bytes) -> tuple[int, int, list[bytes]]:
    """Width, height and RGB rows of an 8-bit, non-interlaced RGB or RGBA PNG (what Chromium writes)."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, width = 8, b"", 0
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            width, height, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", body)
            assert depth == 8 and colour in (2, 6) and not interlace, (depth, colour, interlace)
            channels = 3 if colour == 2 else 4
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    raw, stride, rows, previous = zlib.decompress(idat), width * channels, [], bytearray(width * channels)
    for y in range(height):
        kind, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            left = line[i - channels] if i >= channels else 0
            up, corner = previous[i], previous[i - channels] if i >= channels else 0
            if kind == 1:
                line[i] = (line[i] + left) & 0xFF
            elif kind == 2:
                line[i] = (line[i] + up) & 0xFF
            elif kind == 3:
                line[i] = (line[i] + (left + up) // 2) & 0xFF
            elif kind == 4:
                p = left + up - corner
                pa, pb, pc = abs(p - left), abs(p - up), abs(p - corner)
                line[i] = (line[i] + (left if pa <= pb and pa <= pc else up if pb <= pc else corner)) & 0xFF
        previous = line
        rows.append(bytes(line) if channels == 3 else bytes(b for j, b in enumerate(line) if j % 4 != 3))
    return width, height, rows


def marker_pixels(png: Path, colour: str, min_x: int = 0) -> int:
    """How many pixels of the screenshot ``png``, ``min_x`` or more from its left edge, are ``colour`` (#rrggbb,
    within a small tolerance)."""
    want = bytes.fromhex(colour.lstrip("#"))
    width, _height, rows = png_rgb(png.read_bytes())
    return sum(1 for row in rows for x in range(min_x, width)
               if all(abs(row[3 * x + c] - want[c]) <= 12 for c in range(3)))
