"""``cbatch load``: the load sweep, with vLLM ``bench serve``'s metric definitions (see ``metrics``).

Closed loop (``--concurrency 1 2 4 ...``): per level, exactly N workers each
start a new request the instant their previous one ends, until
``--requests-per-level`` measured requests are done; the first ``--warmup``
requests of a level are sent the same way but not measured.  Open loop
(``--request-rate R ...``): arrivals at R requests/s with Poisson gaps, or
gamma gaps of shape ``--burstiness`` (``theta = 1 / (R * burstiness)``, as in
``bench serve``), while ``--max-concurrency`` caps how many run at once, so
the achieved rate may be lower than asked when the server falls behind.

Every request has a fixed output length (``max_tokens`` with ``ignore_eos``)
and a distinct pseudo-random integer prompt (``--seed``, the level and the
request number; ``--num-prompts`` cycles a fixed pool instead).  Failures are
counted, never dropped.  Achieved concurrency is the time-average of requests
in flight (sum of E2EL over the measured interval), next to the most seen.
The knee is the first level whose marginal throughput gain falls below
``--knee-threshold`` of linear scaling.  The JSON is rewritten after every
level, so an interrupted run keeps the levels it finished.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import sys
import time
from dataclasses import dataclass
from typing import Any, Sequence

from .client import Stream, build_payload, pick_model, prompt_words, session, stream, url_for
from .metrics import knee, summarize

__all__ = ["LoadOptions", "run_sweep", "format_table", "write_json"]


@dataclass
class LoadOptions:
    base_url: str
    levels: list[float]
    mode: str = "closed"                  # "closed": levels are concurrencies; "open": request rates
    requests_per_level: int = 64
    warmup: int = 4
    input_len: int = 32
    output_len: int = 16
    ignore_eos: bool = True
    num_prompts: int | None = None
    knee_threshold: float = 0.5
    api: str = "completions"
    model: str | None = None
    timeout: float = 60.0
    seed: int = 0
    burstiness: float = 1.0
    max_concurrency: int | None = None
    slo_ms: dict[str, float] | None = None


class _Level:
    """One level's requests: prompts, in-flight accounting and the measured streams."""

    def __init__(self, opts: LoadOptions, client: Any, url: str, model: str, label: str, progress: Any) -> None:
        self.opts, self.client, self.url, self.model, self.label = opts, client, url, model, label
        self.progress = progress
        self.sent = 0
        self.in_flight = 0
        self.peak = 0
        self.measured: list[Stream] = []

    def _prompt(self, n: int) -> str:
        key = f"{n % self.opts.num_prompts}" if self.opts.num_prompts else f"{self.label}/{n}"
        return prompt_words(self.opts.seed, key, self.opts.input_len)

    async def one(self, origin: float) -> None:
        n = self.sent
        self.sent += 1
        payload = build_payload(self.opts.api, self.model, self._prompt(n), self.opts.output_len,
                                ignore_eos=self.opts.ignore_eos)
        state = Stream(self.url, sent=time.perf_counter() - origin, prompt_tokens=self.opts.input_len)
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        try:
            await stream(self.client, self.url, payload, state, lambda: time.perf_counter() - origin)
        finally:
            self.in_flight -= 1
        if n >= self.opts.warmup:
            self.measured.append(state)
            self.progress(len(self.measured))


async def _closed(level: _Level, workers: int, total: int, origin: float) -> None:
    async def worker() -> None:
        while level.sent < total:
            await level.one(origin)

    await asyncio.gather(*(worker() for _ in range(workers)))


async def _open(level: _Level, rate: float, total: int, origin: float, opts: LoadOptions) -> None:
    rng = random.Random(f"{opts.seed}/arrivals/{rate}")
    gate = asyncio.Semaphore(opts.max_concurrency) if opts.max_concurrency else None

    async def gated() -> None:
        if gate is None:
            await level.one(origin)
            return
        async with gate:
            await level.one(origin)

    tasks = []
    for _ in range(total):
        tasks.append(asyncio.create_task(gated()))
        if rate != float("inf"):
            await asyncio.sleep(rng.gammavariate(opts.burstiness, 1.0 / (rate * opts.burstiness)))
    await asyncio.gather(*tasks)


def _window(streams: Sequence[Stream]) -> tuple[float, float]:
    start = min(s.sent for s in streams)
    end = max((s.ended if s.ended is not None else s.sent) for s in streams)
    return start, end


async def _sweep(opts: LoadOptions, out_json: str | None, show: Any) -> list[dict[str, Any]]:
    url = url_for(opts.base_url, "/chat/completions" if opts.api == "chat" else "/completions")
    results: list[dict[str, Any]] = []
    async with session(opts.timeout) as client:
        model = await pick_model(client, opts.base_url, opts.model, "--model NAME")
        for value in opts.levels:
            label = f"c={value:g}" if opts.mode == "closed" else f"rate={value:g}/s"
            total = opts.warmup + opts.requests_per_level
            level = _Level(opts, client, url, model, label, lambda done: show(label, done, opts.requests_per_level))
            origin = time.perf_counter()
            if opts.mode == "closed":
                await _closed(level, int(value), total, origin)
            else:
                await _open(level, value, total, origin, opts)
            start, end = _window(level.measured)
            records = [s.record("finished" if s.done else "rejected") for s in level.measured]
            result = summarize(records, end - start, slo_ms=opts.slo_ms)
            busy = sum((s.ended or s.sent) - s.sent for s in level.measured)
            errors = sorted({s.error for s in level.measured if s.error})
            result.update({
                "level": value, "max_concurrency": int(value) if opts.mode == "closed" else opts.max_concurrency,
                "request_rate": value if opts.mode == "open" else None, "burstiness": opts.burstiness,
                "achieved_concurrency": busy / (end - start) if end > start else 0.0,
                "peak_concurrency": level.peak, "model_id": model, "errors": errors[:5],
            })
            results.append(result)
            _mark_knee(results, opts.knee_threshold)
            if out_json:
                write_json(out_json, opts, results)
    return results


def _mark_knee(results: list[dict[str, Any]], threshold: float) -> None:
    at = knee([r["level"] for r in results], [r["output_throughput"] for r in results], threshold)
    for i, r in enumerate(results):
        r["knee"] = i == at


def run_sweep(opts: LoadOptions, *, out_json: str | None = None, stream_to: Any = None) -> list[dict[str, Any]]:
    """Run every level (LiveError naming the URL when the server cannot be used); rewrite ``out_json`` per level.

    Progress goes to ``stream_to`` (default: the current ``sys.stderr``), a bar when it is a terminal.
    """
    stream_to = stream_to or sys.stderr
    tty = hasattr(stream_to, "isatty") and stream_to.isatty()

    def show(label: str, done: int, total: int) -> None:
        if tty:
            bar = "#" * (30 * done // total)
            stream_to.write(f"\r{label:>12} [{bar:<30}] {done}/{total}")
            if done == total:
                stream_to.write("\n")
        elif done == total:
            stream_to.write(f"{label}: {done}/{total} requests\n")
        stream_to.flush()

    from .replay import run_coroutine

    return run_coroutine(_sweep(opts, out_json, show))


def write_json(path: str, opts: LoadOptions, results: list[dict[str, Any]]) -> None:
    """The sweep so far as JSON (vLLM's result keys per level), written atomically."""
    knees = [r["level"] for r in results if r.get("knee")]
    doc = {"base_url": opts.base_url, "mode": opts.mode, "api": opts.api, "input_len": opts.input_len,
           "output_len": opts.output_len, "ignore_eos": opts.ignore_eos, "knee_threshold": opts.knee_threshold,
           "knee": knees[0] if knees else None, "levels": results}
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(doc, fh, indent=2)
        fh.write("\n")
    os.replace(tmp, path)


def format_table(results: list[dict[str, Any]], mode: str = "closed") -> str:
    """One line per level: concurrency, throughput, TTFT/TPOT/ITL/E2EL median and p99 (ms), failures."""
    head = ("conc" if mode == "closed" else "rate req/s", "achieved conc", "req/s", "out tok/s",
            *(f"{name} {q} ms" for name in ("TTFT", "TPOT", "ITL", "E2EL") for q in ("p50", "p99")), "failed", "")
    rows = [head]
    for r in results:
        rows.append((f"{r['level']:g}", f"{r['achieved_concurrency']:.2f}", f"{r['request_throughput']:.2f}",
                     f"{r['output_throughput']:.1f}",
                     *(f"{r[f'{k}_{m}_ms']:.1f}" for m in ("ttft", "tpot", "itl", "e2el") for k in ("median", "p99")),
                     str(r["failed"]), "<- knee" if r.get("knee") else ""))
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    return "\n".join("  ".join(cell.rjust(w) for cell, w in zip(row, widths)).rstrip() for row in rows)

