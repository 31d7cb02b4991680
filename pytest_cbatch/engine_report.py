"""Assembling an engine adapter's report from the events it recorded (public helper for adapters).

An adapter that drives a real engine tick by tick collects the contract's events; the report's
requests table and summary counts follow from them and the request statuses alone, the same way
for every engine, so adapters share this instead of each writing it.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

__all__ = ["EventLog", "engine_report", "row_phase", "dispatch_event"]

TERMINAL = ("finished", "cancelled", "rejected")


def engine_report(*, config: Mapping[str, Any], arrivals: Mapping[str, Mapping[str, Any]],
                  status: Mapping[str, str], events: Sequence[dict[str, Any]], dispatches: int, fed: int,
                  free_blocks: int, engine: str) -> dict[str, Any]:
    """The report (schema_version 1, synthetic ticks) for ``events``: per request the times of its
    first admit, its terminal event and its token events; ``status`` gives each request's end
    status; ``dispatches``, ``fed`` (input tokens dispatched) and ``free_blocks`` (at the end) go
    into the summary with ``engine`` (a name and version)."""
    requests: dict[str, dict[str, Any]] = {}
    for rid, line in arrivals.items():
        mine = [ev for ev in events if ev.get("id") == rid]
        times = [ev["time"] for ev in mine if ev["event"] == "token"]
        admitted = next((ev["time"] for ev in mine if ev["event"] == "admit"), None)
        end = next(ev["time"] for ev in mine if ev["event"] in TERMINAL)
        requests[rid] = {
            "status": status[rid], "arrival": line["time"], "admitted": admitted, "end": end,
            "output_tokens": len(times), "token_times": times,
            "queue_ticks": None if admitted is None else admitted - line["time"],
            "ttft_ticks": times[0] - line["time"] if times else None,
            "itl_ticks": [b - a for a, b in zip(times, times[1:])],
        }
    ended = list(status.values())
    return {
        "schema_version": 1,
        "time_unit": "synthetic_tick",
        "config": dict(config),
        "requests": requests,
        "events": list(events),
        "summary": {
            "drained_at_tick": events[-1]["time"] if events else 0,
            "dispatches": dispatches,
            "processed_input_tokens": fed,
            "free_blocks": free_blocks,
            **{kind: ended.count(kind) for kind in TERMINAL},
            "engine": engine,
        },
    }


def row_phase(*, has_output: bool, before: int, known: int, preempted: bool) -> str:
    """The phase of a dispatched row: ``decode`` when the request has an output and the row starts at
    its last known token (it feeds only the newest sampled token), ``recompute`` for a preempted
    request rebuilding the rows it lost, else ``prefill``.  ``before`` is the number of the
    request's tokens computed before the row, ``known`` the tokens it has (prompt and outputs)."""
    if has_output and before >= known - 1:
        return "decode"
    return "recompute" if preempted else "prefill"


def dispatch_event(t: int, rows: Sequence[tuple[str, str, int]], token_budget: int) -> dict[str, Any]:
    """The dispatch event at ``t`` for ``rows`` of (request id, phase, input tokens)."""
    work = [{"id": rid, "phase": phase, "input_tokens": n} for rid, phase, n in rows]
    used = sum(n for _, _, n in rows)
    return {"time": t, "event": "dispatch", "work": work, "unused_budget": token_budget - used}


class EventLog:
    """The events an engine adapter records in order, with the dispatch counts its report's summary
    needs (``dispatches``, ``fed``): ``emit`` one event, ``dispatch`` one forward pass."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self.dispatches = 0
        self.fed = 0

    def emit(self, t: int, kind: str, rid: str | None = None, **fields: Any) -> None:
        """Record the event ``kind`` at ``t`` (naming request ``rid`` when given) with ``fields``."""
        event: dict[str, Any] = {"time": t, "event": kind}
        if rid is not None:
            event["id"] = rid
        event.update(fields)
        self.events.append(event)

    def dispatch(self, t: int, rows: Sequence[tuple[str, str, int]], token_budget: int) -> None:
        """Record the dispatch of ``rows`` (request id, phase, input tokens) at ``t`` and count it."""
        self.dispatches += 1
        self.fed += sum(n for _, _, n in rows)
        self.events.append(dispatch_event(t, rows, token_budget))
