"""The picture of a failing lifecycle clause: its step script, the failing step marked, the pool after each step.

The script is the violation's replay (``LifecycleViolation``), read as text and
never run: each top-level statement is one step.  The pool after a step is
the one the kit's own model of the published contract
(``lifecycle.oracle.PoolOracle``) held when the machine had run that step: the
failure records it line by line (``Verdict.steps``), for every part alike,
transfer managers' calls included.  The model holds only names the kit chose
or the machine accepted as plain data (a transfer's destination owner and
pins, which the implementation names); the page escapes and clips them.
"""

from __future__ import annotations

import ast
from typing import Sequence

from ..lifecycle.clauses import LIFECYCLE_CLAUSES
from ..lifecycle.oracle import PoolState
from .markup import MARK, clip, esc, note, rect, svg, verdict

__all__ = ["MAX_STEPS", "Steps", "lifecycle_section", "script_of", "steps_of"]

MAX_STEPS = 400
REPLAY_HEADER = "replay (runnable Python"
_PALETTE = ("#3182ce", "#38a169", "#d69e2e", "#805ad5", "#dd6b20", "#319795", "#b83280", "#718096")
_BAR_W = 260
_FAILING_ROW = f' class="fail" style="background:#fff0f8;outline:2px solid {MARK}"'
_SHOWN_OWNERS = 6

Steps = Sequence[tuple[str, "PoolState | None"]]
"""A failure's replay, line by line, each with the model's pool after it (``lifecycle.Verdict.steps``)."""


def script_of(message: str) -> str:
    """The replay script inside a lifecycle violation's message (its lines after the replay header), or ''."""
    lines = message.splitlines()
    start = next((i + 1 for i, line in enumerate(lines) if REPLAY_HEADER in line), None)
    if start is None:
        return ""
    return "\n".join(line[4:] if line.startswith("    ") else line.strip() for line in lines[start:])


def steps_of(lines: Sequence[str], pools: Sequence[PoolState | None] = ()) -> list[tuple[str, PoolState | None]]:
    """Each top-level statement of the script ``lines`` (imports left out): its code and the pool after its last
    line (``pools[i]`` is the pool after ``lines[i]``; None where ``pools`` has none).  A script that does not
    parse is taken a line a step."""
    def pool(line: int) -> PoolState | None:
        return pools[line] if 0 <= line < len(pools) else None

    script = "\n".join(lines)
    try:
        tree = ast.parse(script)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return [(line, pool(i)) for i, line in enumerate(lines) if line.strip()]
    return [(ast.get_source_segment(script, stmt) or "", pool((stmt.end_lineno or stmt.lineno) - 1))
            for stmt in tree.body if not isinstance(stmt, (ast.Import, ast.ImportFrom))]


def _names(names: Sequence[object]) -> list[str]:
    """Owner or pin names as bounded text (the implementation names a transfer's destination and pins)."""
    return [clip(name, 60) for name in names[:_SHOWN_OWNERS]] + (["…"] if len(names) > _SHOWN_OWNERS else [])


def _pool_svg(pool: PoolState, colours: dict[str, str]) -> str:
    """The pool after a step: one box per page, coloured by its first owner, a thick edge when pinned."""
    w = _BAR_W / pool.capacity
    parts = []
    for i in range(pool.capacity):
        if i >= len(pool.pages):
            parts.append(rect(i * w + 1, 2, w - 2, 16, "#ffffff", "free page", ' stroke="#a0aec0"'))
            continue
        owners, pins, rows = pool.pages[i]
        owned, pinned = _names(owners), _names(pins)
        colour = colours.setdefault(owned[0], _PALETTE[len(colours) % len(_PALETTE)]) if owned else "#cbd5e0"
        tip = esc(f"page of {', '.join(owned) or 'no owner'}"
                  + (f"; pinned by {', '.join(pinned)}" if pinned else "") + f"; {rows} row(s)", 300)
        edge = ' stroke="#1a202c" stroke-width="3"' if pins else ""
        parts.append(rect(i * w + 1, 2, w - 2, 16, colour, tip, edge))
    return svg(_BAR_W + 2, 20, parts, esc(f"{len(pool.pages)} of {pool.capacity} pages in use"))


def lifecycle_section(cid: str, message: str, steps: Steps = (), *, with_text: bool = True) -> str:
    """One failing clause: its statement and message, then a table of its steps, the last (failing) one marked,
    each with the pool after it as ``steps`` records it (without ``steps``, the script is read from ``message``
    and no pool is drawn); ``with_text``: then the whole message (folded)."""
    head = message.splitlines()[0] if message else cid
    statement = LIFECYCLE_CLAUSES.get(cid, "")
    if steps:
        table = steps_of([line for line, _ in steps], [pool for _, pool in steps])
    else:
        table = steps_of(script_of(message).splitlines())
    rows = []
    left_out = max(0, len(table) - MAX_STEPS)
    colours: dict[str, str] = {}
    for i, (code, pool) in enumerate(table[left_out:], left_out + 1):
        last = i == len(table)
        state = "" if pool is None else (
            _pool_svg(pool, colours) + f" {pool.free()} free of {pool.capacity}"
            + "".join(f" · {esc(owner, 20)}: {count}" for owner, count in pool.tables[:_SHOWN_OWNERS]))
        mark = f'<b style="color:{MARK}">✖ fails here</b><br>' if last else ""
        rows.append(f"<tr{_FAILING_ROW if last else ''}><td>{i}</td><td><code>{esc(code, 300)}</code></td>"
                    f"<td>{mark}{state}</td></tr>")
    notes = note(f"{left_out} earlier steps left out.") if left_out else ""
    if table and not steps:
        notes += note("This failure's text carries no record of the pool: its steps are listed without it.")
    if not table:
        rows.append("<tr><td></td><td>(the message carries no step script)</td><td></td></tr>")
    return (f"<h2>{esc(cid, 120)}</h2><p><b>clause:</b> {esc(statement, 1000)}</p>"
            f"{verdict(esc(head, 2000))}{notes}"
            '<table class="steps"><tr><th>step</th><th>operation</th><th>the pool after it (the contract\'s model: '
            'one box per page, coloured by owner, thick edge: pinned)</th></tr>' + "".join(rows) + "</table>"
            + (f"<details><summary>the failure text</summary><pre>{esc(message, 20_000)}</pre></details>"
               if with_text else ""))
