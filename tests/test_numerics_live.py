"""Numerics on reports without a schedule: a live server's client-side reports, an engine report with no rows."""

from __future__ import annotations

from typing import Iterator

import pytest

from pytest_cbatch.plugin import suite_dir

pytest.importorskip("torch", reason="the numerics tests need torch: pip install torch==2.13.0")


@pytest.fixture(scope="module")
def server_url() -> Iterator[str]:
    """``cbatch serve``'s server (its default settings, a fast tick) on a free loopback port."""
    pytest.importorskip("aiohttp", reason="the live tests need the live extra: pip install 'pytest-cbatch[live]'")
    from pytest_cbatch.live.server import ServerThread, create_server

    with ServerThread(create_server(tick_ms=2)) as url:
        yield url


def test_numerics_against_a_live_server_skip_as_not_observable(pytester: pytest.Pytester, server_url: str) -> None:
    """Every workload's checks skip: as not observable (no dispatch rows), or, for the preemption workload the
    server cannot be made to run, as unsupported; none fails, none compares with an empty reference."""
    result = pytester.runpytest(str(suite_dir() / "test_numerics.py"), f"--cbatch-impl={server_url}",
                                "--cbatch-tick-seconds=0.01", "-k", "float64 and not test_attention_kernels",
                                "-p", "no:cacheprovider", "-q", "-rs")
    outcomes = result.parseoutcomes()
    text = result.stdout.str()
    assert not outcomes.get("failed") and not outcomes.get("errors") and not outcomes.get("passed"), text
    skips = [line for line in text.splitlines() if line.startswith("SKIPPED")]
    hidden = [line for line in skips if "not observable from this report" in line]
    assert {"'demo'", "'chunked'", "'long'", "'long-preempt'"} <= {w for line in hidden for w in line.split()}, text
    assert all(line in hidden or "cannot make it preempt" in line for line in skips), text
    counted = sum(int(line.split("[")[1].split("]")[0]) for line in hidden)
    assert counted >= 20, text
    result.stdout.fnmatch_lines([f"*NOT OBSERVABLE: {counted} checks skipped*"])


def test_a_schedule_without_dispatch_rows_is_never_compared(pytester: pytest.Pytester) -> None:
    """An engine report that lists no dispatch for a workload skips its numerics instead of comparing logits
    with an empty reference (the contract clauses judge the missing rows)."""
    pytester.makepyfile(rowless="""
        from pytest_cbatch.reference.scheduler_sim import simulate as reference

        def simulate(trace, **config):
            report = reference(trace, **config)
            report["events"] = [e for e in report["events"] if e["event"] != "dispatch"]
            return report
    """)
    result = pytester.runpytest(str(suite_dir() / "test_numerics.py"), "--cbatch-impl=rowless.py",
                                "-k", "float64 and demo and not test_attention_kernels", "-p", "no:cacheprovider",
                                "-q", "-rs")
    outcomes = result.parseoutcomes()
    assert outcomes.get("skipped") and not outcomes.get("failed") and not outcomes.get("passed"), result.stdout.str()
    result.stdout.fnmatch_lines(["*workload 'demo' has no dispatch rows, so there is no schedule to compute*"])
