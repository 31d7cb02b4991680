"""The schedule figure: a lane per request on the time axis, the KV pages below, the violation marked.

Plain SVG (no script): hovering a cell or a mark shows its details through
SVG ``<title>`` elements, which every browser renders as a tooltip.
"""

from __future__ import annotations

import math
import textwrap
from dataclasses import dataclass
from typing import Callable, Sequence

from .markup import MARK, SWATCH, clip, esc, rect, svg, text, title
from .schedule import Lane, PageCount, PageMap, Schedule

__all__ = ["COLOURS", "Pin", "legend", "schedule_svg"]

COLOURS = {
    "waiting": "#e2e8f0", "admitted": "#bee3f8", "prefill": "#2b6cb0", "decode": "#2f855a", "recompute": "#dd6b20",
    "other": "#718096", "preempted": "#6b46c1", "cancelled": "#1a202c", "rejected": "#9b2c2c",
    "finished": "#22543d", "release": "#a0aec0", "allocated": "#319795", "draining": "#d69e2e",
    "reserved": "#2c5282", "token": "#1a202c",
}
Scale = Callable[[float], float]
"""A time to its x coordinate."""

_LABEL_W = 150
_LANE_H = 24
_TOP = 34
_PAGES_H = 110
_LINE_H = 14    # a line of a violation's label
_PIN_GAP = 5
_WIDTH = 840   # the time axis of a run in ticks, however short; the figure is then scaled to the page's width
_RIGHT = 110  # room for the capacity label past the last tick
_CHAR_W = 7.0   # the widest a character of a label (11 px, bold) is drawn: labels are wrapped to fit
_LABEL_CHARS = 600  # a violation's label: its whole message (they are bounded), wrapped, never cut short
_MAP_TOP = 30   # the page map's row below the page counts
_CELL_H = 22


@dataclass(frozen=True)
class Pin:
    """A violation to mark: where (``time``; ``request``'s lane, or every lane) and its number and message."""

    number: int
    message: str
    time: float | None
    request: str | None
    cell: bool = False  # a dispatch's: it occupies the tick after its time


def legend() -> str:
    """The colour key, as HTML."""
    keys = [("waiting", "waiting"), ("admitted", "admitted (resident)"), ("prefill", "prefill chunk (tokens)"),
            ("decode", "decode row"), ("token", "output token emitted"), ("recompute", "recompute"),
            ("preempted", "▼ preempted"), ("cancelled", "✕ cancelled"), ("rejected", "✕ rejected"),
            ("finished", "✓ finished"), ("release", "◆ pages released"),
            ("other", "• other event (admission blocked, ...)"), ("allocated", "KV pages in use"),
            ("draining", "draining pages"), ("reserved", "— reserved pages")]
    items = "".join(f'<span style="display:inline-block"><i style="{SWATCH};background:{COLOURS[k]}"></i>'
                    f"{esc(label)}</span>" for k, label in keys)
    return f"<div>{items}</div>"  # the violation's colour is on its label: nothing else has it


def schedule_svg(s: Schedule, pins: Sequence[Pin]) -> str:
    """The figure of ``s`` with ``pins`` marked (a ring on the request's lane, a line across all lanes)."""
    span = s.end - s.start
    unit_w = _WIDTH / span
    if s.unit == "tick":
        unit_w = max(6.0, unit_w)

    def x(t: float) -> float:
        return _LABEL_W + (min(max(t, s.start), s.end) - s.start) * unit_w

    lanes_h = max(1, len(s.lanes)) * _LANE_H
    width = _LABEL_W + span * unit_w + _RIGHT
    row = {lane.rid: i for i, lane in enumerate(s.lanes)}
    placed = [pin for pin in pins if (pin.time is not None and s.start <= pin.time <= s.end) or pin.request in row]
    labels = [_wrapped(pin, width) for pin in placed]
    pages_top = _TOP + lanes_h + 30 + sum(len(lines) * _LINE_H + 6 + _PIN_GAP for lines in labels)
    map_h = _MAP_TOP + _CELL_H + 34 if s.page_map else 0
    height = pages_top + _PAGES_H + 44 + map_h
    parts = [rect(0, 0, width, height, "#ffffff")]
    parts += _axis(s, x, _TOP, _TOP + lanes_h)
    for i, lane in enumerate(s.lanes):
        parts += _lane(lane, _TOP + i * _LANE_H, x, unit_w if s.unit == "tick" else 0.0, s)
    if not s.lanes:
        parts.append(text(_LABEL_W, _TOP + 16, "(no request events in the report)", fill="#4a5568"))
    parts += _pages(s.pages, s, x, pages_top)
    if s.page_map:
        parts += _page_map(s.page_map, pages_top + _PAGES_H + _MAP_TOP, width)
    drawn, ly = [], _TOP + lanes_h + 6
    for pin, lines in zip(placed, labels):
        drawn.append(_pin(pin, lines, ly, x, row, _TOP, lanes_h, s, unit_w if s.unit == "tick" else 0.0, width))
        ly += len(lines) * _LINE_H + 6 + _PIN_GAP
    parts += [marker for marker, _ in drawn] + [label for _, label in drawn]  # labels over every line
    label = esc(f"schedule of {len(s.lanes)} requests over {s.start:g}..{s.end:g} {s.unit}s")
    return svg(width, height, parts, label, fill=True)


def _wrapped(pin: Pin, width: float) -> list[str]:
    """A violation's label, ``number: message``, in lines that fit the figure's width, broken between words
    (a word longer than a whole line, only, is broken; never between "got" and its value), never cut short."""
    most = max(20, int((width - 18) / _CHAR_W))
    whole = clip(f"{pin.number}: {pin.message}", _LABEL_CHARS).replace("got ", "got\u00a0")  # "got" keeps its value
    return [line.replace("\u00a0", " ") for line in textwrap.wrap(whole, most, break_on_hyphens=False)] or [""]


def _axis(s: Schedule, x: Scale, top: float, bottom: float) -> list[str]:
    span = s.end - s.start
    step = _nice_step(span, 24 if s.unit == "tick" else 12, whole=s.unit == "tick")
    parts = [text(8, top - 18, f"time ({'synthetic ticks' if s.unit == 'tick' else 'seconds'})", size=11,
                  fill="#4a5568", weight="bold")]
    t = (s.start // step) * step
    while t <= s.end + 1e-9:
        if t >= s.start - 1e-9:
            parts.append(f'<line x1="{x(t):.1f}" y1="{top - 6}" x2="{x(t):.1f}" y2="{bottom}" stroke="#edf2f7"/>')
            parts.append(text(x(t), top - 9, f"{t:g}", size=10, anchor="middle", fill="#4a5568"))
        t += step
    return parts


def _nice_step(span: float, most: int, whole: bool) -> float:
    """The least of 1, 2 or 5 times a power of ten that divides ``span`` into at most ``most`` steps."""
    power = 10.0 ** math.floor(math.log10(max(span / most, 1e-9)))
    step = next(k * power for k in (1, 2, 5, 10) if span / (k * power) <= most)
    return max(step, 1.0) if whole else step


def _lane(lane: Lane, y: float, x: Scale, cell_w: float, s: Schedule) -> list[str]:
    status = f" ({lane.status})" if lane.status else ""
    parts = [f'<g><title>{esc("request " + lane.rid + status, 300)}</title>'
             + text(8, y + 16, esc(lane.rid, 18), size=12) + "</g>"]
    for start, end, state in lane.spans:
        stop = s.end if end is None else end
        tip = esc(f"{lane.rid}: {state} from {start:g} to {'the end' if end is None else f'{end:g}'}", 300)
        parts.append(rect(x(start), y + 5, x(stop) - x(start), 14, COLOURS[state], tip))
    for cell in lane.cells:
        if not s.start <= cell.time < s.end:
            continue
        tip = esc(f"{lane.rid}: {cell.phase} of {cell.tokens} input token(s) dispatched at t={cell.time:g}", 300)
        parts.append(rect(x(cell.time) + 1, y + 3, max(cell_w - 2, 2), 18, COLOURS[cell.phase], tip))
        if cell.phase in ("prefill", "recompute") and cell_w >= 14:
            parts.append(text(x(cell.time) + cell_w / 2, y + 16, str(cell.tokens), size=10, anchor="middle",
                              fill="#ffffff", weight="bold"))
    for n, t in enumerate(lane.tokens, 1):
        tip = esc(f"{lane.rid}: output token {n} at t={t:g}", 300)
        parts.append(rect(x(t) - 1, y + 1, 2, 6, COLOURS["token"], tip))
    for mark in lane.marks:
        if s.start <= mark.time <= s.end:
            parts.append(_glyph(mark.kind, x(mark.time), y,
                                esc(f"{lane.rid}: {mark.kind} at t={mark.time:g} {mark.detail}".rstrip(), 300)))
    return parts


def _glyph(kind: str, cx: float, y: float, tip: str) -> str:
    shapes = {"preempted": ("▼", COLOURS["preempted"]), "cancelled": ("✕", COLOURS["cancelled"]),
              "rejected": ("✕", COLOURS["rejected"]), "finished": ("✓", COLOURS["finished"]),
              "release": ("◆", COLOURS["release"])}
    glyph, colour = shapes.get(kind, ("•", COLOURS["other"]))
    return f"<g>{title(tip)}" + text(cx, y + 17, glyph, size=14, anchor="middle", fill=colour, weight="bold") + "</g>"


def _pages(counts: Sequence[PageCount], s: Schedule, x: Scale, top: float) -> list[str]:
    shown = list(counts)
    top_value = max([s.capacity or 0] + [v for c in shown for v in (c.allocated, c.reserved) if v is not None] + [1])
    scale = (_PAGES_H - 10) / top_value
    base = top + _PAGES_H
    parts = [text(8, top + 12, "KV pages", size=12, weight="bold"),
             text(8, top + 28, "(pages in use)", size=10, fill="#4a5568"),
             text(_LABEL_W - 6, base + 4, "0", size=10, anchor="end", fill="#4a5568"),
             text(_LABEL_W - 6, base - top_value * scale + 4, f"{top_value}", size=10, anchor="end", fill="#4a5568"),
             f'<line x1="{_LABEL_W}" y1="{base}" x2="{x(s.end):.1f}" y2="{base}" stroke="#4a5568"/>']
    if not shown:
        parts.append(text(_LABEL_W + 4, base - 8, "(the report has no snapshots: no page counts to draw)",
                          fill="#4a5568"))
    for i, c in enumerate(shown):
        right = x(shown[i + 1].time) if i + 1 < len(shown) else x(min(c.time + 1, s.end))
        left = x(c.time)
        tip = esc(f"t={c.time:g}: " + ", ".join(f"{k} {v}" for k, v in (("allocated", c.allocated),
                  ("reserved", c.reserved), ("draining", c.draining), ("free", c.free)) if v is not None), 300)
        used, draining = c.allocated or 0, min(c.draining or 0, c.allocated or 0)
        parts.append(f"<g>{title(tip)}"
                     + rect(left, base - used * scale, right - left, (used - draining) * scale, COLOURS["allocated"])
                     + rect(left, base - draining * scale, right - left, draining * scale, COLOURS["draining"])
                     + "</g>")
        if c.reserved is not None:
            y = base - c.reserved * scale
            parts.append(f'<line x1="{left:.1f}" y1="{y:.1f}" x2="{right:.1f}" y2="{y:.1f}" '
                         f'stroke="{COLOURS["reserved"]}" stroke-width="2"/>')
    if s.capacity:
        y = base - s.capacity * scale
        parts.append(f'<line x1="{_LABEL_W}" y1="{y:.1f}" x2="{x(s.end):.1f}" y2="{y:.1f}" stroke="#1a202c" '
                     f'stroke-dasharray="6 3"/>')
        parts.append(text(x(s.end) + 4, y + 4, f"capacity {s.capacity} pages", size=10))
    return parts


def _pin(pin: Pin, lines: Sequence[str], ly: float, x: Scale, row: dict[str, int], top: float, lanes_h: float,
         s: Schedule, cell_w: float, width: float) -> tuple[str, str]:
    """A violation's marker: a ring on its request's lane (the lane's label when it has no time), or an outline
    of its whole column when it names no request; and, at ``ly`` below the lanes, its number and message in
    ``lines``, joined to the marker by a line."""
    tip = esc(f"violation {pin.number}: {pin.message}", 600)
    lane = row.get(pin.request or "")
    timed = pin.time is not None and s.start <= pin.time <= s.end
    if timed:
        cx = x(pin.time) + (cell_w / 2 if pin.cell else 0)
    elif lane is not None:
        cx = _LABEL_W - 12
    else:
        return "", ""
    if lane is not None:
        cy = top + (lane + 0.5) * _LANE_H
        marker = (f'<circle cx="{cx:.1f}" cy="{cy:.1f}" r="13" fill="none" stroke="{MARK}" stroke-width="4"/>'
                  f'<line x1="{cx:.1f}" y1="{cy + 13:.1f}" x2="{cx:.1f}" y2="{ly:.1f}" stroke="{MARK}" '
                  f'stroke-width="1.5"/>')
    else:
        w = max(cell_w, 8)
        left = cx - w / 2
        marker = rect(left, top - 4, w, lanes_h + 8, "none", extra=f' stroke="{MARK}" stroke-width="3"') + \
            f'<line x1="{cx:.1f}" y1="{top + lanes_h + 4:.1f}" x2="{cx:.1f}" y2="{ly:.1f}" stroke="{MARK}"/>'
    box_w = 10 + _CHAR_W * max(len(line) for line in lines)
    lx = max(4.0, min(cx - 10, width - 4 - box_w))
    body = "".join(text(lx + 5, ly + 13 + i * _LINE_H, esc(line, _LABEL_CHARS), size=11, fill="#1a202c",
                        weight="bold") for i, line in enumerate(lines))
    return (f"<g>{title(tip)}{marker}</g>",
            f'<g class="violation-label">{title(tip)}'
            + rect(lx, ly, box_w, len(lines) * _LINE_H + 6, "#ffffff", extra=f' stroke="{MARK}" stroke-width="2"')
            + body + "</g>")


def _page_map(m: PageMap, top: float, width: float) -> list[str]:
    """Every page of the pool at one snapshot, a cell each by id: free, held (and by whom), and the pages that
    break a rule edged in the violation's colour: in two block tables, or leaked (held at the end by a request
    never released); then the pages the snapshot counts in use that no table lists."""
    cells = m.capacity + m.unlisted
    cell_w = max(4.0, min(48.0, (width - _LABEL_W - 20) / max(cells, 1)))
    what = "the last snapshot" if m.last else "the violation's snapshot"
    parts = [text(8, top + 14, f"pages at t={m.time:g}", size=12, weight="bold"),
             text(8, top + 28, f"({what})", size=10, fill="#4a5568")]
    for page in range(m.capacity):
        held = m.owners.get(page, [])
        kind = "doubled" if page in m.doubled else "leaked" if page in m.leaked else "held" if held else "free"
        fill = ("#ffffff" if not held else COLOURS["draining"] if all(r in m.ended for r in held)
                else COLOURS["allocated"])
        why = {"doubled": " - in two block tables", "leaked": " - leaked: never released after the last snapshot"}
        tip = esc(f"page {page}: " + (f"held by {', '.join(held[:4])}" if held else "free") + why.get(kind, ""), 300)
        px = _LABEL_W + page * cell_w
        edge = (f' stroke="{MARK}" stroke-width="3"' if kind in ("doubled", "leaked") else ' stroke="#a0aec0"')
        parts.append(f'<g class="page {kind}" data-page="{page}">'
                     + rect(px + 1, top, cell_w - 2, _CELL_H, fill, tip, extra=edge)
                     + (text(px + cell_w / 2, top + 15, str(page), size=9, anchor="middle",
                             fill="#1a202c" if not held else "#ffffff") if cell_w >= 16 else "") + "</g>")
    if m.unlisted:
        px = _LABEL_W + m.capacity * cell_w + 10
        tip = esc(f"{m.unlisted} page(s) counted in use (allocated_blocks) that no block table lists: leaked, "
                  f"ids unknown", 300)
        parts.append(f'<g class="page unlisted" data-pages="{m.unlisted}">'
                     + "".join(rect(px + i * cell_w + 1, top, cell_w - 2, _CELL_H, "#fff0f8",
                                    tip, extra=f' stroke="{MARK}" stroke-width="3" stroke-dasharray="4 2"')
                               for i in range(m.unlisted)) + "</g>")
    notes = [_pages_said("in two block tables", sorted(m.doubled), m) if m.doubled else "",
             _pages_said("leaked (never released)", sorted(m.leaked), m) if m.leaked else "",
             f"{m.unlisted} page(s) counted in use that no block table lists (leaked; ids unknown)"
             if m.unlisted else ""]
    said = "; ".join(n for n in notes if n)
    parts.append(text(_LABEL_W, top + _CELL_H + 16, esc(said or "no page breaks a rule here", 300), size=11,
                      fill=MARK if said else "#4a5568", weight="bold" if said else "normal"))
    return parts


def _pages_said(what: str, pages: list[int], m: PageMap) -> str:
    held = ", ".join(f"page {p} ({' and '.join(m.owners[p][:2])})" for p in pages[:6])
    return f"{what}: {held}" + (f" and {len(pages) - 6} more" if len(pages) > 6 else "")
