"""``cbatch load --plot``: throughput, TTFT and TPOT against the level, the knee shaded as an interval (matplotlib).

The knee is drawn as the course's load harness states it: between the last
level that still gained (within ``--knee-threshold`` of linear scaling) and the
first that did not.
"""

from __future__ import annotations

from typing import Any, Sequence

from . import require

__all__ = ["knee_interval", "plot_sweep", "sweep_figure"]

_PERCENTILES = (("p99", "s", "--", 0.55), ("median", "o", "-", 1.0))  # the median drawn last, on top


def knee_interval(results: Sequence[dict[str, Any]]) -> tuple[float, float] | None:
    """(last level that still gained, first level that did not), or None when no level is marked the knee."""
    for i, r in enumerate(results):
        if r.get("knee") and i > 0:
            return results[i - 1]["level"], r["level"]
    return None


def plot_sweep(results: Sequence[dict[str, Any]], path: str, *, mode: str = "closed", title: str = "") -> None:
    """Write ``sweep_figure(results, mode=mode, title=title)`` as a PNG."""
    plt = require("matplotlib.pyplot", "cbatch load --plot")
    fig = sweep_figure(results, mode=mode, title=title)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def sweep_figure(results: Sequence[dict[str, Any]], *, mode: str = "closed", title: str = "") -> Any:
    """Three panels, each against the level on a log-2 axis: output tokens/s; TTFT p50 and p99 (ms); TPOT p50
    and p99 (ms).  The knee is a shaded interval on every panel."""
    matplotlib = require("matplotlib", "cbatch load --plot")
    matplotlib.use("Agg")
    plt = require("matplotlib.pyplot", "cbatch load --plot")
    xs = [r["level"] for r in results]
    fig, axes = plt.subplots(1, 3, figsize=(13, 4))
    throughput, ttft, tpot = axes
    throughput.plot(xs, [r["output_throughput"] for r in results], "o-", color="#2b6cb0", label="output tokens/s")
    throughput.set_ylabel("output throughput (tokens/s)")
    for ax, name, colour in ((ttft, "ttft", "#c05621"), (tpot, "tpot", "#2f855a")):
        for p, marker, style, alpha in _PERCENTILES:
            ax.plot(xs, [r[f"{p}_{name}_ms"] for r in results], marker + style, color=colour, alpha=alpha,
                    markersize=6 if p == "median" else 5, label=f"{name.upper()} {'p50' if p == 'median' else p}")
        ax.set_ylabel(f"{name.upper()} (ms)")
        ax.set_ylim(bottom=0)
    throughput.set_ylim(bottom=0)
    interval = knee_interval(results)
    for ax in axes:
        ax.set_xlabel("concurrency (requests in flight)" if mode == "closed" else "request rate (requests/s)")
        if len(xs) > 1 and min(xs) > 0:
            ax.set_xscale("log", base=2)
            ax.set_xticks(xs, [f"{x:g}" for x in xs])
        ax.grid(True, alpha=0.3)
        if interval:
            ax.axvspan(*interval, color="#e53e3e", alpha=0.12,
                       label=f"knee: between {interval[0]:g} and {interval[1]:g}")
        ax.legend(fontsize=8, loc="best")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig
