"""Prometheus text exposition with vLLM's metric names, and a reader for the same format.

The embedded server exports (label ``model_name``):

* ``vllm:num_requests_running``, ``vllm:num_requests_waiting`` (gauges);
* ``vllm:kv_cache_usage_perc`` (gauge, allocated pages / capacity, 0..1);
* ``vllm:num_preemptions_total``, ``vllm:prompt_tokens_total``,
  ``vllm:generation_tokens_total`` (counters);
* ``vllm:time_to_first_token_seconds``, ``vllm:inter_token_latency_seconds``
  (histograms, server-side: from the request's arrival to each token's
  delivery) and ``vllm:iteration_tokens_total`` (histogram of the tokens one
  engine step ran).
"""

from __future__ import annotations

import bisect
import math
import re
from dataclasses import dataclass, field
from typing import Mapping, Sequence

__all__ = ["Histogram", "ServerMetrics", "parse_metrics", "metric_total", "labelled_total"]

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)
ITERATION_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)


@dataclass
class Histogram:
    """A cumulative-bucket histogram (``le`` upper bounds plus ``+Inf``)."""

    buckets: Sequence[float]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    count: int = 0

    def __post_init__(self) -> None:
        self.counts = [0] * (len(self.buckets) + 1)

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.total += value
        self.count += 1

    def lines(self, name: str, labels: str) -> list[str]:
        out, running = [], 0
        for bound, n in zip([*self.buckets, math.inf], self.counts):
            running += n
            le = "+Inf" if bound == math.inf else f"{bound:g}"
            out.append(f'{name}_bucket{{{labels},le="{le}"}} {running}')
        out += [f"{name}_sum{{{labels}}} {self.total!r}", f"{name}_count{{{labels}}} {self.count}"]
        return out


@dataclass
class ServerMetrics:
    """The server's counters and histograms; gauges come from the scheduler's pool_stats at render time."""

    ttft: Histogram = field(default_factory=lambda: Histogram(TTFT_BUCKETS))
    itl: Histogram = field(default_factory=lambda: Histogram(ITL_BUCKETS))
    iteration_tokens: Histogram = field(default_factory=lambda: Histogram(ITERATION_BUCKETS))
    prompt_tokens: int = 0
    generation_tokens: int = 0

    def render(self, model: str, stats: Mapping[str, object]) -> str:
        labels = f'model_name="{model}"'
        running, waiting = stats.get("running", []), stats.get("waiting", [])
        capacity = stats.get("capacity") or 1
        gauges = {
            "vllm:num_requests_running": ("Number of requests in model execution batches.", len(running)),
            "vllm:num_requests_waiting": ("Number of requests waiting to be processed.", len(waiting)),
            "vllm:kv_cache_usage_perc": ("KV-cache usage. 1 means 100 percent usage.",
                                         stats.get("allocated_blocks", 0) / capacity),
        }
        counters = {
            "vllm:num_preemptions_total": ("Cumulative number of preemptions.", stats.get("preemptions", 0)),
            "vllm:prompt_tokens_total": ("Number of prefill tokens processed.", self.prompt_tokens),
            "vllm:generation_tokens_total": ("Number of generation tokens processed.", self.generation_tokens),
        }
        lines: list[str] = []
        for kind, table in (("gauge", gauges), ("counter", counters)):
            for name, (help_text, value) in table.items():
                lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}", f"{name}{{{labels}}} {value}"]
        for name, help_text, hist in (
            ("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", self.ttft),
            ("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", self.itl),
            ("vllm:iteration_tokens_total", "Histogram of number of tokens per engine_step.", self.iteration_tokens),
        ):
            lines += [f"# HELP {name} {help_text}", f"# TYPE {name} histogram", *hist.lines(name, labels)]
        return "\n".join(lines) + "\n"


_SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(\{[^}]*\})?\s+(\S+)")


def parse_metrics(text: str) -> dict[str, float]:
    """``{name{labels}: value}`` of every sample line of a Prometheus text body (comments skipped)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if m:
            try:
                out[m.group(1) + (m.group(2) or "")] = float(m.group(3))
            except ValueError:
                continue
    return out


def metric_total(samples: Mapping[str, float], name: str) -> float | None:
    """Sum of ``name`` over all its label sets, or None when the body has no such sample."""
    values = [v for key, v in samples.items() if key == name or key.startswith(name + "{")]
    return sum(values) if values else None


def labelled_total(samples: Mapping[str, float], name: str, label: str, value: str) -> float:
    """Sum of ``name`` over the label sets where ``label="value"`` (0 when there is none)."""
    pattern = re.compile(rf'[{{,]{re.escape(label)}="{re.escape(value)}"[,}}]')
    return sum(v for key, v in samples.items() if key.startswith(name + "{") and pattern.search(key))
