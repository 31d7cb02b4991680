"""The picture of a failing lifecycle clause: its step script, the failing step marked, the pool after each step.

The script is the violation's replay (``LifecycleViolation``), read as text and
never run: each top-level statement is one step.  The pool's pages after a
step come from the kit's own model of the published contract
(``lifecycle.oracle.PoolOracle``) replaying the pool's operations (create,
append, fork, pin, unpin, release) and its recompute requests' (resume,
sample, preempt, cancel); from the first step the model cannot replay (a
transfer manager's call, say), the page says the pool is no longer drawn.
"""

from __future__ import annotations

import ast
from typing import Any

from ..lifecycle.clauses import LIFECYCLE_CLAUSES
from ..lifecycle.oracle import PoolOracle, pages_for
from .markup import MARK, esc, note, rect, svg, verdict

__all__ = ["MAX_STEPS", "lifecycle_section", "script_of", "steps_of"]

MAX_STEPS = 400
REPLAY_HEADER = "replay (runnable Python"
_OPS = {"create": 1, "release": 1, "fork": 2, "pin": 2, "unpin": 1, "append": 2}
_READS = {"read", "check"}
_PALETTE = ("#3182ce", "#38a169", "#d69e2e", "#805ad5", "#dd6b20", "#319795", "#b83280", "#718096")
_BAR_W = 260
_FAILING_ROW = f' class="fail" style="background:#fff0f8;outline:2px solid {MARK}"'


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
    except (SyntaxError, ValueError, RecursionError):
        return [(line, None, "the script does not parse") for line in script.splitlines() if line.strip()]
    model = _Model()
    stopped = ""
    steps = []
    for stmt in tree.body:
        code = ast.get_source_segment(script, stmt) or ""
        if isinstance(stmt, (ast.Import, ast.ImportFrom)):
            continue
        if not stopped:
            stopped = model.step(stmt) or ""
        steps.append((code, None if stopped or model.pool is None else _copy(model.pool), stopped))
    return steps


def _literals(nodes: list[ast.expr]) -> list[Any] | None:
    try:
        return [ast.literal_eval(node) for node in nodes]
    except (ValueError, TypeError, SyntaxError, RecursionError):
        return None


class _Request:
    """A RecomputeRequest as the contract has it: its owner, prompt, outputs and whether it holds pages."""

    def __init__(self, owner: Any, prompt: list[Any]) -> None:
        self.owner, self.prompt, self.outputs, self.active = owner, prompt, [], False


class _Model:
    """The pool (and its recompute requests) as the contract's model replays the script's steps."""

    def __init__(self) -> None:
        self.pool: PoolOracle | None = None
        self.name: str | None = None
        self.requests: dict[str, _Request] = {}

    def step(self, stmt: ast.stmt) -> str | None:
        """Replay one statement; why the model stops here, or None when it followed it."""
        if isinstance(stmt, (ast.Assert, ast.With, ast.Try)):
            return None  # a check, or a call the contract says fails and changes nothing
        call = stmt.value if isinstance(stmt, (ast.Expr, ast.Assign)) else None
        if not isinstance(call, ast.Call):
            return "a step the picture does not replay"
        callee, args = call.func, _literals(call.args)
        target = stmt.targets[0].id if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and \
            isinstance(stmt.targets[0], ast.Name) else None
        if isinstance(callee, ast.Name):
            return self._construct(callee.id, target, call)
        if not isinstance(callee, ast.Attribute) or not isinstance(callee.value, ast.Name):
            return "a step the picture does not replay"
        who, method = callee.value.id, callee.attr
        if self.pool is None or (who != self.name and who not in self.requests):
            return f"a call of {who} (the picture replays only the pool's and its requests' operations)"
        if args is None:
            return f"{who}.{method}(...) with arguments the picture does not read"
        try:
            return self._pool_call(method, args) if who == self.name else self._request_call(who, method, args)
        except (KeyError, ValueError, TypeError, IndexError):
            return f"{who}.{method}(...) on a state the model does not have"

    def _construct(self, cls: str, target: str | None, call: ast.Call) -> str | None:
        """``pool = PagedKV(capacity, block_size)`` or ``r0 = RecomputeRequest(pool, owner, prompt)``."""
        args = _literals(call.args)
        if cls == "PagedKV" and target and args and len(args) == 2 and \
                all(isinstance(a, int) and 0 < a <= 4096 for a in args):
            self.pool, self.name = PoolOracle(args[0], args[1]), target
            return None
        if cls == "RecomputeRequest" and target and self.pool is not None and len(call.args) == 3 and \
                isinstance(call.args[0], ast.Name) and call.args[0].id == self.name:
            rest = _literals(call.args[1:])
            if rest is not None and isinstance(rest[1], list):
                self.requests[target] = _Request(rest[0], rest[1])
                return None
        return f"a call of {cls} (the picture replays only the pool's and its requests' operations)"

    def _pool_call(self, method: str, args: list[Any]) -> str | None:
        pool = self.pool
        assert pool is not None
        if method in _READS:
            return None
        if method not in _OPS or len(args) != _OPS[method]:
            return f"pool.{method}(...) (not replayed)"
        if method == "append":
            return None if pool.append(args[0], args[1]) else "an append the model refuses (no free page)"
        getattr(pool, method)(*args)
        return None

    def _request_call(self, who: str, method: str, args: list[Any]) -> str | None:
        """resume() rebuilds prompt + outputs[:-1] when its pages fit, sample() feeds the pending output first,
        preempt() and cancel() free the request's pages."""
        pool, request = self.pool, self.requests[who]
        assert pool is not None
        if method == "resume" and not request.active:
            rows = [*request.prompt, *request.outputs[:-1]]
            if pages_for(len(rows), pool.block_size) <= pool.free():
                pool.create(request.owner)
                for row in rows:
                    pool.append(request.owner, row)
                request.active = True
        elif method == "sample" and request.active and len(args) == 1:
            if request.outputs and not pool.append(request.owner, request.outputs[-1]):
                return "a sample the model refuses (no free page)"
            request.outputs.append(args[0])
        elif method in ("preempt", "cancel") and request.active:
            pool.release(request.owner)
            request.active = False
        elif method not in ("check", "resume", "preempt", "cancel"):
            return f"{who}.{method}(...) (not replayed)"
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


def lifecycle_section(cid: str, message: str, *, with_text: bool = True) -> str:
    """One failing clause: its statement and message, then a table of its steps, the last (failing) one marked;
    ``with_text``: then the whole message (folded)."""
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
        rows.append(f"<tr{_FAILING_ROW if last else ''}><td>{i}</td><td><code>{esc(code, 300)}</code></td>"
                    f"<td>{mark}{state}</td></tr>")
    skipped = note(f"{left_out} earlier steps left out.") if left_out else ""
    if not steps:
        rows.append("<tr><td></td><td>(the message carries no step script)</td><td></td></tr>")
    return (f"<h2>{esc(cid, 120)}</h2><p><b>clause:</b> {esc(statement, 1000)}</p>"
            f"{verdict(esc(head, 2000))}{skipped}"
            '<table class="steps"><tr><th>step</th><th>operation</th><th>the pool after it (the contract\'s model: '
            'one box per page, coloured by owner, thick edge: pinned)</th></tr>' + "".join(rows) + "</table>"
            + (f"<details><summary>the failure text</summary><pre>{esc(message, 20_000)}</pre></details>"
               if with_text else ""))
