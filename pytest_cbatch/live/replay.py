"""The ``http://`` implementation: replay a trace against an OpenAI-compatible streaming server.

``--cbatch-impl=http://HOST:PORT[/v1]`` (completions route) or
``http://HOST:PORT/v1/chat/completions`` (chat route).  One trace tick lasts
``tick_seconds`` (``--cbatch-tick-seconds``, default 0.05).

* An arrival at tick t is sent at (or just after) ``t * tick_seconds``: a
  prompt of ``prompt_tokens`` distinct pseudo-random integer words seeded by
  the request id, ``max_tokens = output_tokens``, ``ignore_eos``, streaming
  with usage.  Its ``arrival`` event is the send moment, and TTFT runs from it.
* A cancel at tick t acts at (or just after) ``t * tick_seconds``: a stream
  still open is closed (``cancelled``); a stream that already ended, or
  whose last token frame already carried a ``finish_reason`` (the server has
  finished the request; only its usage frame and ``[DONE]`` are still on the
  way), answers ``cancel_ignored`` with the status it ended with.
* ``token`` events: one per token with ``output_index`` 1, 2, 3, ... (the
  tokens of one data frame share its timestamp; when the server sends its
  running usage count in every frame, the indices are the ones it claims, so
  a repeated frame shows as a repeated index).  ``finished`` when the stream
  ends with ``[DONE]``, stamped at the last token's frame; ``rejected`` for an
  HTTP error, a refused connection, a malformed stream or one that ended
  without ``[DONE]`` or a finish_reason (the event's ``reason`` says which).
* A client that falls behind: "just after" means within the contract's slack
  (``replay_slack``: 1 s, or 20 ticks when that is more).  A run in which an
  arrival or a cancel went out later than that measured the client (starved
  by a loaded machine), not the server: it is cancelled and replayed, three
  tries in all, and only a run that kept the schedule is reported.
* Tokens the stream cannot count: when some stream carried neither token ids,
  logprobs tokens nor a running usage count, and its final usage does not
  confirm one token per frame (``transformers serve`` puts several tokens in
  a frame and its usage in the last one), per-token times are unknown.  The
  report then has no ``token`` events (``observed`` lacks ``token``, so the
  clauses that need them skip as not observable): each row's
  ``output_tokens`` is the server's usage count (one per text frame where it
  sent none), ``token_times`` is empty, ``frame_times`` holds the frames'
  times, TTFT runs to the first text frame and ITL has one entry per frame
  (as vLLM's bench serve computes it); finish and usage are still judged.
* A server that served nothing is no pass: when no
  request got a token or finished and a request that fits the workload's
  pool was refused with an HTTP error status, the run gives no report and ``completes`` fails with the
  first refusal (URL, HTTP status, the server's words).  Each request's own
  refusal stays ``rejected`` with its reason in reports that have one.
* A route that refused the client's optional fields (:mod:`.fields`) is
  named in ``server.notes``, with ``server.ignore_eos`` false: its requests
  may end early at an end-of-sequence token, which ``finished_outputs_complete``
  admits for a row whose ``finish_reason`` is ``stop``.

Capabilities, honestly: a client cannot set a server's capacity, block size,
budgets, policy or admission.  Scheduler settings are recorded in the
report's config as asked (with ``tick_seconds``), never as the server's real
ones, which stay unknown.  Workloads with ``admission="optimistic"`` are
refused as unsupported: they exist to force preemption, which a client
cannot cause, so they would only repeat plain traffic.
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from typing import Any, Mapping
from urllib.parse import urlsplit

from ..contract import CLAIMS
from ..contract.core import replay_slack, required_blocks
from ..impls import Implementation, ImplementationError, Refused
from ..reference.scheduler_sim import validate_config, validate_trace
from . import LiveError, MissingExtra, fields, metrics, require
from .client import Stream, build_payload, pick_model, prompt_words, session, stream, url_for

__all__ = ["HttpImplementation", "replay", "OBSERVED", "TIME_UNIT", "REPLAY_ATTEMPTS"]

TIME_UNIT = "seconds"
OBSERVED = ("arrival", "token", "finished", "cancelled", "cancel_ignored", "rejected")
REPLAY_ATTEMPTS = 3
_RANK = {"arrival": 0, "token": 1, "finished": 2, "cancelled": 2, "rejected": 2, "cancel_ignored": 3}


def split_spec(spec: str) -> tuple[str, str]:
    """``(base_url, api)`` of an ``http(s)://`` SPEC; ImplementationError (saying what is wrong, the caller
    names the SPEC) for anything else."""
    parts = urlsplit(spec)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ImplementationError("expected http://HOST:PORT[/v1]")
    path = parts.path.rstrip("/")
    api = "completions"
    for suffix, name in (("/chat/completions", "chat"), ("/completions", "completions")):
        if path.endswith(suffix):
            path, api = path[: -len(suffix)], name
            break
    if path not in ("", "/v1"):
        raise ImplementationError(f"the path must be empty, /v1, /v1/completions or /v1/chat/completions, "
                                  f"got {parts.path!r}")
    return f"{parts.scheme}://{parts.netloc}{path}", api


class HttpImplementation(Implementation):
    """A live server, driven over HTTP; reports carry ``time_unit: "seconds"``."""

    claims = CLAIMS  # a client sees no pool and measures seconds: its reports may say so

    def __init__(self, spec: str, *, tick_seconds: float = 0.05, timeout: float = 60.0, seed: int = 0,
                 model: str | None = None) -> None:
        try:
            require("aiohttp", "a live server")
        except MissingExtra as exc:
            raise ImplementationError(str(exc)) from None
        if not (isinstance(tick_seconds, (int, float)) and math.isfinite(tick_seconds) and tick_seconds > 0):
            raise ImplementationError(f"--cbatch-tick-seconds must be a positive number, got {tick_seconds!r}")
        self.spec = spec
        self.base_url, self.api = split_spec(spec)
        self.tick_seconds = float(tick_seconds)
        self.timeout = timeout
        self.seed = seed
        self.model = model
        self.source = (f"live server {self.base_url} ({self.api} route), {self.tick_seconds:g} s per tick"
                       + (f", model {model!r}" if model else ""))
        self.namespace = None

    def unsupported_reason(self, config: Mapping[str, Any]) -> str | None:
        if config.get("admission") == "optimistic":
            return (f"{self.spec} is a live server: a client cannot make it preempt, so optimistic-admission "
                    f"workloads would only repeat plain traffic")
        return None

    def _call(self, trace: list[dict[str, Any]], config: dict[str, Any]) -> dict[str, Any]:
        try:
            lines = validate_trace(trace)
            validate_config(config)
        except ValueError as exc:
            raise Refused(str(exc)) from None
        try:
            report = run_coroutine(replay(lines, config, self.base_url, api=self.api, tick_seconds=self.tick_seconds,
                                          timeout=self.timeout, seed=self.seed, model=self.model))
        except LiveError as exc:
            raise Refused(str(exc)) from None
        refusal = served_nothing(report, lines, config)
        if refusal:
            raise Refused(refusal)
        return report


def served_nothing(report: Mapping[str, Any], trace: list[dict[str, Any]], config: Mapping[str, Any]) -> str | None:
    """Why a client-side report shows a server that served nothing of a workload it should have (module
    docstring), or None."""
    rows = report["requests"]
    if any(r["status"] == "finished" or r["output_tokens"] or r.get("frame_times") for r in rows.values()):
        return None
    fits = [line["id"] for line in trace if line["event"] == "arrival" and rows[line["id"]].get("http_status")
            and required_blocks(line["prompt_tokens"], line["output_tokens"], config["block_size"])
            <= config["capacity"]]
    if not fits:
        return None
    refused = sum(1 for r in rows.values() if r["status"] == "rejected")
    return (f"the server refused every request it was sent ({refused} of {len(rows)} rejected, none served), "
            f"among them {fits[0]!r}, which fits the workload's pool: {rows[fits[0]].get('error')}")


def run_coroutine(coro: Any) -> Any:
    """``asyncio.run(coro)``, in a helper thread when this thread already runs an event loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = asyncio.run(coro)
        except BaseException as exc:   # re-raised in the caller's thread
            box["error"] = exc

    thread = threading.Thread(target=target)
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box["value"]


async def replay(trace: list[dict[str, Any]], config: Mapping[str, Any], base_url: str, *, api: str = "completions",
                 tick_seconds: float = 0.05, timeout: float = 60.0, seed: int = 0,
                 attempts: int = REPLAY_ATTEMPTS, model: str | None = None) -> dict[str, Any]:
    """Replay a validated, time-sorted ``trace`` and return the client-side report (module docstring).

    A replay whose client fell behind the trace's schedule by more than the
    contract's slack (a starved client, not the server) is void: it is
    cancelled and replayed, ``attempts`` times in all, and LiveError says so
    when none kept the schedule.  ``model`` is the model asked for (None: the
    one ``/v1/models`` lists; LiveError says how to name one when it lists
    none or several).
    """
    slack = replay_slack(tick_seconds)
    lags: list[float] = []
    async with session(timeout) as client:
        model = await pick_model(client, base_url, model)
        for _ in range(attempts):
            report, lag = await _replay_once(client, model, trace, config, base_url, api, tick_seconds, timeout,
                                             seed, slack)
            if report is not None:
                return report
            lags.append(lag)
    raise LiveError(f"{base_url}: the client fell behind the trace's schedule by {', '.join(f'{g:.2f}' for g in lags)} "
                    f"s in {attempts} tries (the contract allows {slack:g} s): this machine is too loaded for "
                    f"{tick_seconds:g} s per tick; give a larger --cbatch-tick-seconds")


async def _replay_once(client: Any, model: str, trace: list[dict[str, Any]], config: Mapping[str, Any],
                       base_url: str, api: str, tick_seconds: float, timeout: float, seed: int,
                       slack: float) -> tuple[dict[str, Any] | None, float]:
    """One replay: (the report, 0) or, when an arrival or a cancel went out more than ``slack`` seconds
    after its scheduled moment, (None, how late it was)."""
    url = url_for(base_url, "/chat/completions" if api == "chat" else "/completions")
    origin = time.perf_counter()

    def clock() -> float:
        return time.perf_counter() - origin

    events: list[dict[str, Any]] = []
    streams: dict[str, Stream] = {}
    tasks: dict[str, asyncio.Task[Stream]] = {}
    cancelled: dict[str, float] = {}
    try:
        for line in trace:
            due = line["time"] * tick_seconds
            if due > clock():
                await asyncio.sleep(due - clock())
            now, rid = clock(), line["id"]
            if now - due > slack:
                return None, now - due
            if line["event"] == "arrival":
                state = streams[rid] = Stream(url, sent=now, prompt_tokens=line["prompt_tokens"])
                payload = build_payload(api, model, prompt_words(seed, rid, line["prompt_tokens"]),
                                        line["output_tokens"])
                events.append({"time": now, "event": "arrival", "id": rid})
                tasks[rid] = asyncio.create_task(stream(client, url, payload, state, clock))
                continue
            state = streams[rid]
            if rid in cancelled or state.done or state.error or state.finish_reason:
                status = "cancelled" if rid in cancelled else _status(state)
                events.append({"time": now, "event": "cancel_ignored", "id": rid, "status": status})
                continue
            tasks[rid].cancel()
            cancelled[rid] = now
            events.append({"time": now, "event": "cancelled", "id": rid})
        await asyncio.wait(list(tasks.values()), timeout=timeout + 5.0)
    finally:
        for task in tasks.values():
            task.cancel()
        await asyncio.gather(*tasks.values(), return_exceptions=True)
    duration = clock()
    per_token = all(state.counts_known for state in streams.values())
    requests = {}
    for rid, state in streams.items():
        row, own = _request(rid, state, cancelled.get(rid), per_token)
        requests[rid] = row
        events += own
    events.sort(key=lambda e: (e["time"], _RANK[e["event"]]))
    counts = {k: sum(1 for r in requests.values() if r["status"] == k) for k in ("finished", "cancelled", "rejected")}
    route = fields.for_route(url)
    notes = [n for n in (route.note(),) if n]
    if not per_token:
        notes.append("the stream carries neither token ids, logprobs tokens nor a running usage count, and its "
                     "frames hold several tokens: tokens are counted from the server's final usage and the report "
                     "has no per-token events (TTFT, ITL per frame, finish and usage are still judged)")
    return {
        "schema_version": 1,
        "time_unit": TIME_UNIT,
        "observed": [kind for kind in OBSERVED if per_token or kind != "token"],
        "config": {**config, "tick_seconds": tick_seconds},
        "server": {"url": base_url, "api": api, "model": model, "ignore_eos": not route.refused, "notes": notes},
        "requests": requests,
        "events": events,
        "summary": {**counts, "duration": duration},
    }, 0.0


def _status(state: Stream) -> str:
    """How a stream that was not cancelled ended (or is ending: a finish_reason before ``[DONE]`` is finished)."""
    if state.error:
        return "rejected"
    return "finished" if state.done or state.finish_reason else "rejected"


def _request(rid: str, state: Stream, cancelled_at: float | None,
             per_token: bool = True) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The requests-table row of one stream and its token and terminal events (no token events unless
    ``per_token``: then the row counts the server's usage and keeps the frames' times)."""
    status = "cancelled" if cancelled_at is not None else _status(state)
    own = [{"time": f.time, "event": "token", "id": rid, "output_index": f.first_index + k}
           for f in state.frames for k in range(f.tokens)] if per_token else []
    token_times = [e["time"] for e in own]
    last_frame = state.frames[-1].time if state.frames else None
    if status == "cancelled":
        end = cancelled_at
    elif status == "finished":
        end = last_frame if last_frame is not None else state.ended
        own.append({"time": end, "event": "finished", "id": rid})
    else:
        end = state.ended if state.ended is not None else state.sent
        reason = state.error or "the request did not complete"
        own.append({"time": end, "event": "rejected", "id": rid, "reason": reason})
    record = state.record(status)
    row = {
        "status": status, "arrival": state.sent, "admitted": None, "end": end,
        "output_tokens": len(token_times) if per_token else (state.usage_tokens if state.usage_tokens is not None
                                                             else state.tokens),
        "token_times": token_times, "queue_ticks": None,
        "ttft_ticks": metrics.ttft(record), "itl_ticks": metrics.itl(record),
        "tpot": metrics.tpot(record) if status == "finished" else None,
        "e2el": metrics.e2el(record) if status == "finished" else None,
        "usage_completion_tokens": state.usage_tokens, "finish_reason": state.finish_reason,
    }
    if not per_token:
        row["frame_times"] = [f.time for f in state.frames]
    if state.error:
        row["error"] = state.error
    if state.http_status is not None:
        row["http_status"] = state.http_status
    return row, own
