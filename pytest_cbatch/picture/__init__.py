"""Pictures of schedules: self-contained HTML pages (plain SVG, no script, no network) of a failing run.

Imported only when a picture is written.  ``schedule_page`` draws a contract
run (a lane per request, the KV pages, the violations marked, the trace and
the replay command below); ``schedule_fragment`` is the same figure as an HTML
fragment for Gradescope's HTML output; ``lifecycle_page`` draws a lifecycle
part's failing step scripts; ``failure_page`` is the page the
pytest plugin and the grader write beside a failing trace.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from ..words import counted
from .draw import Pin, legend, schedule_svg
from .markup import FIGURE, esc, note, number, page, side_by_side, verdict
from .schedule import schedule_of

__all__ = ["MAX_PINS", "MAX_TEXT", "MAX_TRACE_LINES", "failure_page", "lifecycle_page", "schedule_fragment",
           "schedule_page"]

MAX_PINS = 8
MAX_TRACE_LINES = 300
MAX_TEXT = 20_000
MAX_SIDE_BY_SIDE = 12


def _pins(report: Mapping[str, Any] | None, violations: Sequence[Any]) -> list[Pin]:
    """Where each violation happened: its time, else the time of the event it names, and its request."""
    events = report.get("events") if isinstance(report, Mapping) else None
    pins = []
    for i, v in enumerate(violations[:MAX_PINS], 1):
        t = number(getattr(v, "time", None))
        index = getattr(v, "event_index", None)
        event = events[index] if isinstance(events, list) and isinstance(index, int) and 0 <= index < len(events) \
            and isinstance(events[index], Mapping) else {}
        if t is None:
            t = number(event.get("time"))
        request = getattr(v, "request", None)
        message = str(getattr(v, "message", v)).split("\n", 1)[0]   # a side-by-side table is drawn apart
        pins.append(Pin(i, message, t, request if isinstance(request, str) else None,
                        cell=event.get("event") == "dispatch"))
    return pins


def _figure(report: Mapping[str, Any] | None, violations: Sequence[Any]) -> list[str]:
    if not isinstance(report, Mapping):
        return [note("The implementation gave no report to draw (see the text below).")]
    pins = _pins(report, violations)
    at = next((p.time for p in pins if p.time is not None), None)
    snapshot = next((i for v in violations[:MAX_PINS] if isinstance(i := getattr(v, "event_index", None), int)
                     and _is_snapshot(report, i)), None)
    s = schedule_of(report, focus=[p.request for p in pins if p.request], at=at, snapshot=snapshot)
    notes = [note(f"Left out to keep this page small: {esc(o, 300)}.") for o in s.omitted]
    return [legend(), *notes, f'<div style="{FIGURE}">{schedule_svg(s, pins)}</div>']


def _is_snapshot(report: Mapping[str, Any], index: int) -> bool:
    events = report.get("events")
    return isinstance(events, list) and 0 <= index < len(events) and isinstance(events[index], Mapping) \
        and events[index].get("event") == "snapshot"


def _violations_html(violations: Sequence[Any]) -> str:
    items = [f"{i}. {esc(_headline(v) if _schedules(v) else str(v), 600)}"
             for i, v in enumerate(violations[:MAX_PINS], 1)]
    if len(violations) > MAX_PINS:
        items.append(f"... {len(violations) - MAX_PINS} more (in the text below)")
    return verdict("\n".join(items)) + "".join(side_by_side(n, rows) for n, v in enumerate(violations[:MAX_PINS], 1)
                                               if (rows := _schedules(v)))


def _headline(v: Any) -> str:
    """A violation as one line: its first (a side-by-side's table is drawn, not written)."""
    return str(v).split("\n", 1)[0]


def _schedules(v: Any) -> list[tuple[Any, str, str, bool]]:
    """A course_results violation's two schedules from where they part (``contract.course.SideBySide``), or []."""
    rows = getattr(v, "schedules", None)
    if not isinstance(rows, tuple):
        return []
    return [row for row in rows[:MAX_SIDE_BY_SIDE] if isinstance(row, tuple) and len(row) == 4]


def schedule_fragment(report: Mapping[str, Any] | None, violations: Sequence[Any]) -> str:
    """The numbered violations and the schedule figure, as an HTML fragment (no page shell, no style sheet)."""
    return "\n".join([_violations_html(violations), *_figure(report, violations)])


def schedule_page(*, heading: str, lead: str, report: Mapping[str, Any] | None, violations: Sequence[Any],
                  trace: Sequence[Mapping[str, Any]], replay: str, text: str = "") -> str:
    """The page of one run: ``lead`` (what was judged), the violations, the figure, then the trace, the replay
    command and the full failure text."""
    from ..explain import trace_jsonl

    lines = trace_jsonl(trace[:MAX_TRACE_LINES]).splitlines()
    if len(trace) > MAX_TRACE_LINES:
        lines.append(f"... {len(trace) - MAX_TRACE_LINES} more lines (in the replay file)")
    box = _violations_html(violations) if violations else verdict("no clause violated on this trace", ok=True)
    body = [f"<p>{esc(lead, 1000)}</p>", box, *_figure(report, violations),
            f"<h2>trace ({counted(len(trace), 'line')})</h2><pre>{esc(chr(10).join(lines), 200_000)}</pre>",
            f"<h2>replay</h2><pre>{esc(replay, 4000)}</pre>"]
    if text:
        body.append(f"<details><summary>the failure text</summary><pre>{esc(text, MAX_TEXT)}</pre></details>")
    return page(heading, body)


def failure_page(*, spec: str, clause: str, workload: str, violations: Sequence[Any],
                 trace: Sequence[Mapping[str, Any]], report: Mapping[str, Any] | None, replay: str,
                 text: str = "") -> str:
    """The page of a failing contract test: clause ``clause`` on ``workload`` with implementation ``spec``."""
    from ..explain import clause_statement

    return schedule_page(heading=f"[{clause}] failed on workload {workload!r} with {spec}",
                         lead=f"clause: {clause_statement(clause)}", report=report, violations=violations, trace=trace,
                         replay=replay, text=text)


def lifecycle_page(*, heading: str, failures: Sequence[tuple[str, str, Sequence[tuple[str, Any]]]],
                   rerun: str) -> str:
    """The page of a lifecycle part: for each failing clause (id, message, steps: its ``Verdict.steps``), its
    steps, the failing one marked, the pool's pages after each step."""
    from .lifecycle import lifecycle_section

    body = [lifecycle_section(cid, message, steps) for cid, message, steps in failures[:MAX_PINS]]
    if len(failures) > MAX_PINS:
        body.append(note(f"{len(failures) - MAX_PINS} more failing clauses (in the text)."))
    if not failures:
        body.append(verdict("every clause holds", ok=True))
    body.append(f"<h2>rerun</h2><pre>{esc(rerun, 2000)}</pre>")
    return page(heading, body)
