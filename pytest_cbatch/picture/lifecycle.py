"""The picture of a failing lifecycle clause: its step script, the failing step marked, the pool after each step.

The script is the violation's replay (``LifecycleViolation``), read as text and
never run: each top-level statement is one step.  The pool's pages after a
step come from the kit's own model of the published contract
(``lifecycle.oracle.PoolOracle``) replaying the pool's operations (create,
append, fork, pin, unpin, release); from the first step the model cannot replay
(a request's or a transfer manager's call, or an operation the contract says
must fail), the page says the pool is no longer drawn.
"""

from __future__ import annotations

import ast
from typing import Any

from ..lifecycle.clauses import LIFECYCLE_CLAUSES
from ..lifecycle.oracle import PoolOracle
from .markup import MARK, esc, note, rect, svg, verdict

__all__ = ["MAX_STEPS", "lifecycle_section", "script_of", "steps_of"]

MAX_STEPS = 400
REPLAY_HEADER = "replay (runnable Python"
_OPS = {"create": 1, "release": 1, "fork": 2, "pin": 2, "unpin": 1, "append": 2}
_READS = {"read", "check"}
_PALETTE = ("#3182ce", "#38a169", "#d69e2e", "#805ad5", "#dd6b20", "#319795", "#b83280", "#718096")
_BAR_W = 260


def script_of(message: str) -> str:
    """The replay script inside a lifecycle violation's message (its lines after the replay header), or ''."""
    lines = message.splitlines()
    start = next((i + 1 for i, line in enumerate(lines) if REPLAY_HEADER in line), None)
    if start is None:
        return ""
    return "\n".join(line[4:] if line.startswith("    ") else line.strip() for line in lines[start:])


def steps_of(script: str) -> list[tuple[str, PoolOracle | None, str]]:
    """Each step of ``script``: its code, a copy of the modelled pool after it (None once not modelled), and why
    the pool is not modelled from that step on ('' while it is)."""
    try:
        tree = ast.parse(script)
    except (SyntaxError, ValueError):
        return [(line, None, "the script does not parse") for line in script.splitlines() if line.strip()]
    pool: PoolOracle | None = None
    variable, stopped = None, ""
    steps = []
    for stmt in tree.body:
        code = ast.get_source_segment(script, stmt) or ""
        if isinstance(stmt, (ast.Import, ast.ImportFrom)):
            continue
        if not stopped:
            made = _constructed(stmt)
            if made is not None:
                variable, pool = made[0], PoolOracle(*made[1])
            else:
                why = _apply(pool, variable, stmt)
                stopped = why or ""
        steps.append((code, None if stopped or pool is None else _copy(pool), stopped))
    return steps


def _constructed(stmt: ast.stmt) -> tuple[str, tuple[int, int]] | None:
    """``name = PagedKV(capacity, block_size)``: the name and the sizes."""
    if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name) and \
            isinstance(stmt.value, ast.Call) and isinstance(stmt.value.func, ast.Name) and \
            stmt.value.func.id == "PagedKV":
        args = _literals(stmt.value.args)
        if args is not None and len(args) == 2 and all(isinstance(a, int) and 0 < a <= 4096 for a in args):
            return stmt.targets[0].id, (args[0], args[1])
    return None


def _literals(nodes: list[ast.expr]) -> list[Any] | None:
    try:
        return [ast.literal_eval(node) for node in nodes]
    except (ValueError, TypeError, SyntaxError, RecursionError):
        return None


def _apply(pool: PoolOracle | None, variable: str | None, stmt: ast.stmt) -> str | None:
    """Replay one step on the model; why the model stops here, or None when it followed the step."""
    if isinstance(stmt, (ast.Assert, ast.With, ast.Try)):
        return None  # a check, or a call the contract says fails and changes nothing
    call = stmt.value if isinstance(stmt, (ast.Expr, ast.Assign)) else None
    callee = call.func if isinstance(call, ast.Call) else None
    if isinstance(callee, ast.Attribute) and isinstance(callee.value, ast.Name):
        who = callee.value.id
    elif isinstance(callee, ast.Name):
        who = callee.id
    else:
        return "a step the picture does not replay"
    if pool is None or who != variable or not isinstance(callee, ast.Attribute):
        return f"a call of {who} (the picture replays only the pool's own operations)"
    method = callee.attr
    if method in _READS:
        return None
    args = _literals(call.args)  # type: ignore[union-attr]
    if method not in _OPS or args is None or len(args) != _OPS[method]:
        return f"pool.{method}(...) (not replayed)"
    try:
        if method == "append":
            if not pool.append(args[0], args[1]):
                return "an append the model refuses (no free page)"
        else:
            getattr(pool, method)(*args)
    except (KeyError, ValueError, TypeError, IndexError):
        return f"pool.{method}(...) on a state the model does not have"
    return None


def _copy(pool: PoolOracle) -> PoolOracle:
    out = PoolOracle(pool.capacity, pool.block_size)
    out.tables = {k: list(v) for k, v in pool.tables.items()}
    out.pins = dict(pool.pins)
    out.rows = {k: list(v) for k, v in pool.rows.items()}
    return out


def _pool_svg(pool: PoolOracle, colours: dict[Any, str]) -> str:
    """The pool after a step: one box per page, coloured by its first owner, a thick edge when pinned."""
    w = _BAR_W / pool.capacity
    parts = []
    live = sorted(pool.rows)
    for i in range(pool.capacity):
        page = live[i] if i < len(live) else None
        if page is None:
            parts.append(rect(i * w + 1, 2, w - 2, 16, "#ffffff", "free page", ' stroke="#a0aec0"'))
            continue
        owners = sorted(map(str, pool.owners_of(page)))
        pins = sorted(map(str, pool.pins_of(page)))
        colour = colours.setdefault(owners[0] if owners else None, _PALETTE[len(colours) % len(_PALETTE)])
        tip = esc(f"page of {', '.join(owners) or 'no owner'}"
                  + (f"; pinned by {', '.join(pins)}" if pins else "") + f"; {len(pool.rows[page])} row(s)", 300)
        edge = ' stroke="#1a202c" stroke-width="3"' if pins else ""
        parts.append(rect(i * w + 1, 2, w - 2, 16, colour if owners else "#cbd5e0", tip, edge))
    return svg(_BAR_W + 2, 20, parts, esc(f"{len(live)} of {pool.capacity} pages in use"))


def lifecycle_section(cid: str, message: str) -> str:
    """One failing clause: its statement and message, then a table of its steps, the last (failing) one marked."""
    head = message.splitlines()[0] if message else cid
    statement = LIFECYCLE_CLAUSES.get(cid, "")
    steps = steps_of(script_of(message))
    rows = []
    left_out = max(0, len(steps) - MAX_STEPS)
    colours: dict[Any, str] = {}
    for i, (code, pool, why) in enumerate(steps[left_out:], left_out + 1):
        last = i == len(steps)
        if pool is not None:
            state = (_pool_svg(pool, colours) + f" {pool.free()} free of {pool.capacity}"
                     + "".join(f" · {esc(o, 20)}: {len(t)}" for o, t in list(pool.tables.items())[:6]))
        else:
            state = f'<span style="color:#718096">not drawn from here: {esc(why, 120)}</span>' if why else ""
        mark = f'<b style="color:{MARK}">✖ fails here</b><br>' if last else ""
        rows.append(f'<tr{" class=fail" if last else ""}><td>{i}</td><td><code>{esc(code, 300)}</code></td>'
                    f"<td>{mark}{state}</td></tr>")
    skipped = note(f"{left_out} earlier steps left out.") if left_out else ""
    if not steps:
        rows.append("<tr><td></td><td>(the message carries no step script)</td><td></td></tr>")
    return (f"<h2>{esc(cid, 120)}</h2><p><b>clause:</b> {esc(statement, 1000)}</p>"
            f"{verdict(esc(head, 2000))}{skipped}"
            '<table class="steps"><tr><th>step</th><th>operation</th><th>the pool after it (the contract\'s model: '
            'one box per page, coloured by owner, thick edge: pinned)</th></tr>' + "".join(rows) + "</table>"
            f"<details><summary>the failure text</summary><pre>{esc(message, 20_000)}</pre></details>")
