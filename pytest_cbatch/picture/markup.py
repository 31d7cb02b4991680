"""Safe markup: escaping, bounded text, SVG elements and the self-contained page shell.

Everything a picture shows that came from the judged code (request ids,
messages, values) goes through ``esc``/``clip`` here; the page carries a
Content-Security-Policy that allows no script, no network and no frame, so a
value that slipped past escaping still could not run or fetch anything.
"""

from __future__ import annotations

import html
import math
import reprlib
from typing import Any, Iterable

__all__ = ["FIGURE", "MARK", "SWATCH", "clip", "esc", "note", "number", "page", "rect", "side_by_side", "svg", "text",
           "title", "verdict"]

MARK = "#ff00aa"
"""The colour of the violating event's marker, and of nothing else on a page (the screenshot test looks for it)."""

CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:; base-uri 'none'; form-action 'none'"

# Inline styles: the figure and its boxes also travel as a fragment (Gradescope's HTML output) without this page's
# style sheet.
FIGURE = "overflow-x:auto;border:1px solid #e2e8f0;padding:4px;margin:6px 0"
SWATCH = ("display:inline-block;width:12px;height:12px;vertical-align:middle;margin:0 4px 0 12px;"
          "border:1px solid #718096")


def verdict(body: str, ok: bool = False) -> str:
    """A box of verdict lines (``body`` already escaped): the violation's colour on its edge, green when ``ok``."""
    edge, ground = ("#2f855a", "#f0fff4") if ok else (MARK, "#fff0f8")
    return (f'<div style="border-left:6px solid {edge};background:{ground};padding:8px 12px;margin:8px 0 12px;'
            f'white-space:pre-wrap">{body}</div>')


_CELL = ' style="padding:2px 10px;border-bottom:1px solid #e2e8f0;text-align:left;vertical-align:top"'


def side_by_side(number: int, rows: Iterable[tuple[Any, Any, Any, Any]]) -> str:
    """Violation ``number``'s two schedules from where they part, a tick a row: (tick, the course's rows, the
    report's rows, whether they are the same); a row that differs is edged in the violation's colour."""
    cells = []
    for tick, ours, theirs, same in rows:
        edge = "" if same is True else f' class="parts" style="outline:2px solid {MARK}"'
        cells.append(f"<tr{edge}><td{_CELL}>t={esc(tick, 20)}</td><td{_CELL}>{esc(ours or '-', 400)}</td>"
                     f"<td{_CELL}>{esc(theirs or '-', 400)}</td></tr>")
    return (f"<p><b>{number}: the two schedules from the dispatch where they part</b></p>"
            f'<table class="schedules" style="border-collapse:collapse;margin:4px 0 12px;font:13px ui-monospace,'
            f'Menlo,Consolas,monospace"><tr><th{_CELL}>tick</th><th{_CELL}>the course&#x27;s '
            f"simulator</th><th{_CELL}>this report</th></tr>{''.join(cells)}</table>")


def note(body: str) -> str:
    """A remark on what the page left out or could not draw (``body`` already escaped)."""
    return f'<p style="color:#744210;background:#fffbeb;padding:4px 8px;margin:6px 0">{body}</p>'


_BRIEF = reprlib.Repr()  # its keyword arguments are Python 3.12's
_BRIEF.maxlevel, _BRIEF.maxstring, _BRIEF.maxother, _BRIEF.maxlong = 3, 200, 200, 60

_STYLE = """
body{font:14px/1.4 system-ui,-apple-system,'Segoe UI',sans-serif;margin:16px 24px;color:#1a202c;background:#fff}
h1{font-size:20px;margin:0 0 4px}h2{font-size:16px;margin:18px 0 6px}
pre{background:#f7fafc;border:1px solid #e2e8f0;padding:8px;overflow-x:auto;white-space:pre-wrap;word-break:break-all}
table.steps{border-collapse:collapse;font:13px ui-monospace,Menlo,Consolas,monospace}
table.steps td{border-bottom:1px solid #edf2f7;padding:2px 8px;vertical-align:middle}
table.steps code{white-space:pre-wrap}
table.steps tr.fail td{background:#fff0f8;border-top:2px solid #ff00aa;border-bottom:2px solid #ff00aa}
"""


def clip(value: Any, limit: int = 200) -> str:
    """``value`` as text of at most ``limit`` characters (an ellipsis says it was cut), control characters shown."""
    s = value if isinstance(value, str) else _BRIEF.repr(value)  # bounded work for any object, however large
    s = "".join(c if c.isprintable() or c in "\n\t" else f"\\x{ord(c) & 0xff:02x}" for c in s[: limit + 1])
    return s if len(s) <= limit else s[: limit - 1] + "…"


def esc(value: Any, limit: int = 200) -> str:
    """``clip(value, limit)`` escaped for HTML text and attribute values (quotes included)."""
    return html.escape(clip(value, limit), quote=True)


def number(value: Any) -> float | None:
    """``value`` as a finite float, or None (booleans, strings, NaN and infinities are not numbers here)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    f = float(value)
    return f if math.isfinite(f) else None


def title(tip: str) -> str:
    """An SVG ``<title>`` child: the browser shows it on hover.  ``tip`` must already be escaped."""
    return f"<title>{tip}</title>" if tip else ""


def rect(x: float, y: float, w: float, h: float, fill: str, tip: str = "", extra: str = "") -> str:
    return (f'<rect x="{x:.1f}" y="{y:.1f}" width="{max(w, 0):.1f}" height="{max(h, 0):.1f}" fill="{fill}"'
            f"{extra}>{title(tip)}</rect>")


def text(x: float, y: float, body: str, *, size: int = 11, anchor: str = "start", fill: str = "#1a202c",
         weight: str = "normal") -> str:
    """An SVG text element; ``body`` must already be escaped."""
    return (f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size}" text-anchor="{anchor}" fill="{fill}" '
            f'font-weight="{weight}" font-family="system-ui,sans-serif">{body}</text>')


def svg(width: float, height: float, parts: Iterable[str], label: str, fill: bool = False) -> str:
    """An inline SVG figure of ``parts``; ``label`` (escaped) is its accessible name.  With ``fill`` it is
    scaled to the width of the page (down to 60 % of its own: a wider one scrolls in its box)."""
    style = f' style="width:100%;min-width:{0.6 * width:.0f}px;height:auto"' if fill else ""
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{height:.0f}" '
            f'viewBox="0 0 {width:.0f} {height:.0f}"{style} role="img" aria-label="{label}">'
            + "".join(parts) + "</svg>")


def page(heading: str, body: Iterable[str]) -> str:
    """A whole HTML document: no script, no external resource, opens from disk.  ``heading`` is raw text."""
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
            f"<title>{esc(heading)}</title><style>{_STYLE}</style></head>\n<body>\n<h1>{esc(heading)}</h1>\n"
            + "\n".join(body) + "\n</body></html>\n")
