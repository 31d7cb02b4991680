"""Assembling an engine adapter's report from the events it recorded (public helper for adapters).

An adapter that drives a real engine tick by tick validates its trace and config
(``engine_run_input``, ``pool_tokens``), records the contract's events (``EventLog``), wraps a
failing engine step into one RuntimeError message (``engine_step``) and builds the report
(``engine_report``): the report's requests table and summary counts follow from the events and the
request statuses alone, the same way for every engine, so adapters share this instead of each
writing it.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Callable, Iterator, Mapping, Sequence

from pytest_cbatch.reference.scheduler_sim import validate_config, validate_trace

__all__ = ["EventLog", "engine_report", "row_phase", "dispatch_event", "engine_run_input", "engine_step",
           "pool_tokens"]

TERMINAL = ("finished", "cancelled", "rejected")


def engine_run_input(trace: Sequence[dict[str, Any]], *, capacity: int, block_size: int, token_budget: int,
                     max_active: int, prefill_chunk: int, release_delay: int, policy: str,
                     admission: str | None = None) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The validated kit config (``admission`` only when given) and the validated, sorted trace lines
    of an engine run, in that order of checking; ValueError names the first bad setting or line."""
    config: dict[str, Any] = {"capacity": capacity, "block_size": block_size, "token_budget": token_budget,
                              "max_active": max_active, "prefill_chunk": prefill_chunk,
                              "release_delay": release_delay, "policy": policy}
    if admission is not None:
        config["admission"] = admission
    config = validate_config(config)
    return config, validate_trace(trace)


def pool_tokens(config: Mapping[str, Any], max_position_embeddings: int) -> int:
    """``capacity * block_size`` of a validated kit config, the tokens the whole pool holds (an engine's
    context length); NotImplementedError when the model's ``max_position_embeddings`` is smaller."""
    tokens = config["capacity"] * config["block_size"]
    if tokens > max_position_embeddings:
        raise NotImplementedError(f"capacity * block_size = {tokens} exceeds the model's max_position_embeddings "
                                  f"{max_position_embeddings}")
    return tokens


@contextmanager
def engine_step(what: str, t: int, unfinished: Callable[[], str]) -> Iterator[None]:
    """Any exception the engine's step ``what`` raises inside the block becomes a RuntimeError
    "``what`` failed at tick ``t``: Type: message; unfinished: ...", chained to it; ``unfinished``
    is asked for the requests still open only when the step fails."""
    try:
        yield
    except Exception as exc:
        raise RuntimeError(f"{what} failed at tick {t}: {type(exc).__name__}: {exc}; "
                           f"unfinished: {unfinished()}") from exc


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
