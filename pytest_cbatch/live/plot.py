"""``cbatch load --plot``: throughput and latency percentiles against the level, knee marked (matplotlib)."""

from __future__ import annotations

from typing import Any, Sequence

from . import require

__all__ = ["plot_sweep"]


def plot_sweep(results: Sequence[dict[str, Any]], path: str, *, mode: str = "closed", title: str = "") -> None:
    """Write a two-panel PNG: output tok/s (left), TTFT and TPOT p50/p99 in ms (right), log-2 x axis."""
    matplotlib = require("matplotlib", "cbatch load --plot")
    matplotlib.use("Agg")
    plt = require("matplotlib.pyplot", "cbatch load --plot")
    xs = [r["level"] for r in results]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    left.plot(xs, [r["output_throughput"] for r in results], "o-", label="output tok/s")
    left.set_ylabel("output tokens/s")
    for name, style in (("ttft", "-"), ("tpot", "--")):
        for p, marker in (("median", "o"), ("p99", "s")):
            right.plot(xs, [r[f"{p}_{name}_ms"] for r in results], marker + style, label=f"{name.upper()} {p}")
    right.set_ylabel("ms")
    right.legend(fontsize=8)
    for ax in (left, right):
        ax.set_xlabel("concurrency" if mode == "closed" else "request rate (1/s)")
        if len(xs) > 1 and min(xs) > 0:
            ax.set_xscale("log", base=2)
        ax.grid(True, alpha=0.3)
        for r in results:
            if r.get("knee"):
                ax.axvline(r["level"], color="red", linestyle=":", label="knee")
    left.legend(fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
