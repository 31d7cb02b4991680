"""Runaways end fast and stay small: a stopped call's memory is given back, the breaker shortens the limit
after a run of timeouts (every workload still runs), and an ``exec:`` program's failure shows its stderr's last lines.

Limits here are small so each runaway costs seconds; nothing asserts how long anything took (the
breaker is checked by counting the implementation's calls, the memory by the run's peak RSS).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from test_runaway import failure_text, run_suite

from pytest_cbatch.bounded import Bounds
from pytest_cbatch.breaker import Breaker
from pytest_cbatch.impls import PythonImplementation, resolve_impl
from pytest_cbatch.plugin import suite_dir
from pytest_cbatch.reference.scheduler_sim import demo_trace
from pytest_cbatch.reference.scheduler_sim import simulate as reference_simulate
from pytest_cbatch.runner import Judge
from pytest_cbatch.workloads import BASE_CONFIG

# Allocates in a loop until it is stopped (a cap far above any limit here, so a broken limit cannot take the
# machine): each call is stopped for memory at the default limit.
HOARDS = """
    def simulate(trace, **config):
        hoard = []
        while len(hoard) < 8192:
            hoard.append(bytearray(1 << 20))
        return {}
"""

# Loops on every call, counting its calls in calls.txt beside it.
LOOPS = """
    import os

    def simulate(trace, **config):
        with open(os.path.join(os.path.dirname(__file__), "calls.txt"), "a") as fh:
            fh.write("call\\n")
        while True:
            pass
"""

PEAK = """
import resource, sys
import pytest
code = pytest.main(sys.argv[1:])
print("PEAK_KIB", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
sys.exit(code)
"""


def test_a_runaway_that_hoards_memory_keeps_the_run_under_2_gib(tmp_path: Path) -> None:
    """Default options: each stopped call's memory is given back before the next call, so the peak is one
    call's growth over the baseline, not the sum of every stopped call's."""
    (tmp_path / "hoards.py").write_text(textwrap.dedent(HOARDS))
    (tmp_path / "peak.py").write_text(PEAK)
    others = sorted(p for p in suite_dir().glob("test_*.py") if p.name != "test_contract.py")
    done = subprocess.run(
        [sys.executable, "peak.py", "--cbatch-impl=hoards.py", "-p", "no:cacheprovider", "-q", "-rN",
         "-k", "completes and (reservation or budget_1 or idle_gaps)",
         *(f"--ignore={p}" for p in others)],
        cwd=tmp_path, capture_output=True, text=True, timeout=600)
    out = done.stdout
    # -rN: no short summary, which repeats each message in full where CI is set
    assert "3 failed" in out and out.count("grew the process's memory by") == 3, out[-3000:]
    peak_mib = int(out.rsplit("PEAK_KIB", 1)[1].split()[0]) / 1024
    assert peak_mib < 2048, f"peak RSS {peak_mib:.0f} MiB over 3 stopped calls"


def test_after_a_run_of_timeouts_every_workload_still_runs_at_the_short_limit(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(loops=LOOPS)
    pytester.makeini("[pytest]\ncbatch_max_timeouts = 2\n")
    result = run_suite(pytester, "--cbatch-impl=loops.py", "--cbatch-timeout=2",
                       "-k", "completes and (demo or reservation or budget_1 or idle_gaps)")
    result.assert_outcomes(failed=5)  # demo, demo_serial and the three others
    calls = (pytester.path / "calls.txt").read_text().splitlines()
    assert len(calls) == 5, f"{len(calls)} calls for 5 workloads: a workload judged was not run"
    first = failure_text(result, "test_contract[completes-demo]")
    assert "did not finish within 2 s" in first and "short limit" not in first, first
    later = failure_text(result, "test_contract[completes-idle_gaps]")
    assert "did not finish within 1 s" in later and "the short limit of 1 s instead of 2 s" in later, later
    assert "--cbatch-max-timeouts=2" in later, later


def test_the_breaker_counts_timeouts_in_a_row_and_a_call_that_finishes_restores_the_full_limit() -> None:
    breaker = Breaker(2)
    for timed_out in (True, False, True):
        breaker.note(timed_out)
    assert not breaker.tripped and breaker.seconds(60) == 60  # a call that returned ended the streak
    breaker.note(True)
    assert breaker.tripped and "--cbatch-max-timeouts=2" in breaker.why_short(60)
    assert (breaker.seconds(60), breaker.seconds(5), breaker.seconds(0.5), breaker.seconds(900)) == (6, 1, 0.5, 10)
    never = Breaker(0)
    for _ in range(10):
        never.note(True)
    assert not never.tripped and never.seconds(60) == 60

    def loops_on_more_than_one_line(trace: list, **config: object) -> dict:
        while len(trace) > 1:
            pass
        return reference_simulate(trace, **config)

    impl = PythonImplementation("loops", loops_on_more_than_one_line, "test", Bounds(seconds=1.5))
    impl.breaker = Breaker(1)
    one_line = demo_trace()[:1]
    first, second = impl.run(demo_trace(), BASE_CONFIG), impl.run(demo_trace(), BASE_CONFIG)
    assert first.stopped and "did not finish within 1.5 s" in first.stopped, first
    assert second.stopped and "did not finish within 1 s" in second.stopped, second
    assert "the short limit of 1 s instead of 1.5 s" in second.stopped and second.seconds >= 0.9, second
    assert impl.run(one_line, BASE_CONFIG).report is not None  # it ran, at the short limit, and finished
    third = impl.run(demo_trace(), BASE_CONFIG)
    assert third.stopped and "within 1.5 s" in third.stopped and "short" not in third.stopped, third


def test_an_exec_failure_shows_the_last_lines_of_its_stderr(tmp_path: Path) -> None:
    script = tmp_path / "crash.py"
    script.write_text(textwrap.dedent("""
        import sys
        sys.stderr.write("noise\\n" * 50)
        sys.stderr.write("Traceback (most recent call last):\\n  File 'sched.js', line 12, in admit\\n")
        sys.stderr.write("TypeError: cannot read properties of undefined (reading 'admission')\\n")
        sys.stderr.write("Node.js v20.11.1\\n")
        sys.exit(1)
    """))
    judge = Judge(resolve_impl(f"exec:{sys.executable} {script}"))
    result = judge.judge("completes", demo_trace(), BASE_CONFIG)
    assert result.status == "fail", result
    assert "line 12, in admit" in result.stack and "reading 'admission'" in result.stack, result.stack
    assert result.stack.rstrip().endswith("Node.js v20.11.1") and result.stack.count("noise") < 50, result.stack
