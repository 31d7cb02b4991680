"""Client-side latency metrics, defined exactly as vLLM's ``bench serve`` defines them.

For one request sent at ``st``, with one timestamp per data frame:

* TTFT = time of the first frame that carries a token - ``st``;
* ITL = one entry per token-bearing frame after the first: the gap between
  its timestamp and the previous token-bearing frame's.  A frame carrying k
  tokens is one entry (k tokens, one gap), as in ``bench serve``, so the ITL
  list is the differences of consecutive *distinct* token times;
* E2EL (latency) = time of the last frame with choices - ``st``;
* TPOT = (E2EL - TTFT) / (n - 1), only for n > 1 output tokens (n is the
  server's usage count when it sent one, else the tokens counted from frames).

Frames without a token (a role-only chat delta, an empty text without token
ids) contribute neither a TTFT nor an ITL entry.  A request that produced no
token, was cancelled, or ended in an error is a failure: it is counted in
``failed`` (never dropped) and contributes to no latency list.

Per level (``summarize``): ``request_throughput = completed / duration``,
``output_throughput = sum(output tokens of completed requests) / duration``,
``total_token_throughput = (input + output tokens of completed) / duration``;
mean, median, std (population) and percentiles of each list in milliseconds,
percentiles by linear interpolation (numpy's default).  Goodput counts the
completed requests meeting every given SLO (``ttft``, ``tpot``, ``e2el`` in
ms; a one-token request's TPOT counts as 0 there, as in ``bench serve``).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Iterable, Mapping, Sequence

__all__ = ["RequestRecord", "ttft", "itl", "e2el", "tpot", "percentile", "summarize", "knee", "METRICS"]

METRICS = ("ttft", "tpot", "itl", "e2el")


@dataclass
class RequestRecord:
    """One request as a client saw it: the send moment and its token-bearing frames.

    ``frame_times[i]`` is the timestamp of the i-th frame that carried tokens
    and ``frame_tokens[i]`` how many; ``last_frame`` is the timestamp of the
    last frame with choices (token-bearing or not).  ``usage_tokens`` is the
    server's final ``completion_tokens``, if it sent one.  ``status`` is
    ``finished``, ``cancelled`` or ``rejected``; ``error`` says why a request
    was rejected.
    """

    sent: float
    prompt_tokens: int = 0
    frame_times: list[float] = field(default_factory=list)
    frame_tokens: list[int] = field(default_factory=list)
    last_frame: float | None = None
    usage_tokens: int | None = None
    status: str = "finished"
    error: str | None = None

    @property
    def counted_tokens(self) -> int:
        return sum(self.frame_tokens)

    @property
    def output_tokens(self) -> int:
        """The server's usage count when present, else the tokens counted from the frames."""
        return self.usage_tokens if self.usage_tokens is not None else self.counted_tokens

    @property
    def success(self) -> bool:
        return self.status == "finished" and self.error is None and self.counted_tokens > 0


def ttft(r: RequestRecord) -> float | None:
    """Seconds from send to the first token-bearing frame; None when no token arrived."""
    return r.frame_times[0] - r.sent if r.frame_times else None


def itl(r: RequestRecord) -> list[float]:
    """Gaps between consecutive token-bearing frames (one entry per frame after the first)."""
    t = r.frame_times
    return [b - a for a, b in zip(t, t[1:])]


def e2el(r: RequestRecord) -> float | None:
    """Seconds from send to the last frame with choices; None when no such frame arrived."""
    return None if r.last_frame is None else r.last_frame - r.sent


def tpot(r: RequestRecord) -> float | None:
    """(E2EL - TTFT) / (n - 1) for n > 1 output tokens, else None."""
    n, first, last = r.output_tokens, ttft(r), e2el(r)
    if n <= 1 or first is None or last is None:
        return None
    return (last - first) / (n - 1)


def percentile(values: Sequence[float], p: float) -> float:
    """The p-th percentile by linear interpolation between closest ranks (numpy's default); 0 for no values."""
    if not values:
        return 0.0
    xs = sorted(values)
    rank = (len(xs) - 1) * p / 100.0
    lo = math.floor(rank)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (rank - lo)


def _stats(name: str, values_s: Sequence[float], percentiles: Iterable[float]) -> dict[str, float]:
    ms = [v * 1000.0 for v in values_s]
    out = {
        f"mean_{name}_ms": statistics.fmean(ms) if ms else 0.0,
        f"median_{name}_ms": statistics.median(ms) if ms else 0.0,
        f"std_{name}_ms": statistics.pstdev(ms) if len(ms) > 1 else 0.0,
    }
    for p in percentiles:
        out[f"p{p:g}_{name}_ms"] = percentile(ms, p)
    return out


def summarize(
    records: Sequence[RequestRecord],
    duration: float,
    *,
    percentiles: Sequence[float] = (50, 90, 99),
    slo_ms: Mapping[str, float] | None = None,
) -> dict[str, float | int]:
    """vLLM ``bench serve`` result keys for one measured interval of ``duration`` seconds."""
    done = [r for r in records if r.success]
    ttfts = [ttft(r) for r in done]
    tpots = [t for t in map(tpot, done) if t is not None]
    itls = [gap for r in done for gap in itl(r)]
    e2els = [e2el(r) for r in done]
    out_tokens = sum(r.output_tokens for r in done)
    in_tokens = sum(r.prompt_tokens for r in done)
    dur = duration if duration > 0 else math.inf
    result: dict[str, float | int] = {
        "duration": duration,
        "completed": len(done),
        "failed": len(records) - len(done),
        "total_input_tokens": in_tokens,
        "total_output_tokens": out_tokens,
        "request_throughput": len(done) / dur,
        "output_throughput": out_tokens / dur,
        "total_token_throughput": (in_tokens + out_tokens) / dur,
    }
    if slo_ms:
        good = 0
        for r in done:
            seen = {"ttft": ttft(r), "tpot": tpot(r) or 0.0, "e2el": e2el(r)}
            if all((seen[k] or 0.0) * 1000.0 <= limit for k, limit in slo_ms.items()):
                good += 1
        result["request_goodput"] = good / dur
    for name, values in (("ttft", ttfts), ("tpot", tpots), ("itl", itls), ("e2el", e2els)):
        result.update(_stats(name, [v for v in values if v is not None], percentiles))
    return result


def knee(levels: Sequence[float], throughputs: Sequence[float], threshold: float) -> int | None:
    """Index of the first level whose marginal throughput gain falls below ``threshold`` of linear scaling.

    From level ``a`` (throughput ``Ta``) to ``b``, linear scaling would add
    ``Ta * (b / a - 1)``; the knee is the first ``b`` where the measured gain
    ``Tb - Ta`` is smaller than ``threshold`` times that.  None if every step
    scales well enough (or there are fewer than two levels).
    """
    for i in range(1, len(levels)):
        a, b = levels[i - 1], levels[i]
        ta, tb = throughputs[i - 1], throughputs[i]
        if a <= 0 or b <= a:
            continue
        if tb - ta < threshold * ta * (b / a - 1):
            return i
    return None
