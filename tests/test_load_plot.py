"""The load sweep's plot: the knee as the interval the course's harness states, every percentile visible, units."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_cbatch.live.load import _mark_knee
from pytest_cbatch.live.plot import knee_interval, plot_sweep, sweep_figure

matplotlib = pytest.importorskip("matplotlib", reason="the plot needs the plot extra")


def sweep(throughputs: list[float]) -> list[dict]:
    levels = [2 ** i for i in range(len(throughputs))]
    results = [{"level": level, "output_throughput": tput, "median_ttft_ms": 10.0 * level, "p99_ttft_ms": 30.0 * level,
                "median_tpot_ms": 5.0 + level, "p99_tpot_ms": 6.0 + level} for level, tput in zip(levels, throughputs)]
    _mark_knee(results, 0.5)
    return results


def test_the_knee_is_between_the_last_level_that_gained_and_the_first_that_did_not() -> None:
    results = sweep([100, 200, 390, 760, 900, 910])  # 8 -> 16 gains 140 of a linear 760: below half
    assert [r["level"] for r in results if r["knee"]] == [16]
    assert knee_interval(results) == (8, 16)
    assert knee_interval(sweep([100, 200, 400])) is None


def test_every_panel_has_units_the_knee_shaded_and_the_tpot_median_on_top(tmp_path: Path) -> None:
    results = sweep([100, 200, 390, 760, 900, 910])
    fig = sweep_figure(results, mode="closed")
    throughput, ttft, tpot = fig.axes
    assert throughput.get_ylabel() == "output throughput (tokens/s)"
    assert ttft.get_ylabel() == "TTFT (ms)" and tpot.get_ylabel() == "TPOT (ms)"
    assert all(ax.get_xlabel() == "concurrency (requests in flight)" for ax in fig.axes)
    for ax in fig.axes:
        spans = [p for p in ax.patches if p.get_label().startswith("knee")]
        assert len(spans) == 1 and spans[0].get_label() == "knee: between 8 and 16"
        span = spans[0].get_window_extent()  # in pixels: compare with where the axis puts 8 and 16
        left, right = ax.transData.transform([(8, 1), (16, 1)])[:, 0]
        assert span.x0 == pytest.approx(left, abs=0.5) and span.x1 == pytest.approx(right, abs=0.5)
    lines = {line.get_label(): line for line in tpot.get_lines()}
    assert set(lines) == {"TPOT p50", "TPOT p99"}
    assert tpot.get_lines()[-1].get_label() == "TPOT p50"  # drawn last: never hidden under the p99 line
    assert list(lines["TPOT p50"].get_ydata()) == [r["median_tpot_ms"] for r in results]
    assert sweep_figure(results, mode="open").axes[0].get_xlabel() == "request rate (requests/s)"
    plot_sweep(results, str(tmp_path / "sweep.png"))
    assert (tmp_path / "sweep.png").read_bytes()[:4] == b"\x89PNG"
