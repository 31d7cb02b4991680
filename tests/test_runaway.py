"""Runaway and crashing implementations: bounded calls, the implementation's own stack, nothing left behind.

Limits here are small (1-2 s) so each runaway costs seconds; nothing asserts how long anything took.
Where a test must show that a stopped test ended at once (no shrinking, no further examples), the
implementation counts its own calls in a file.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

from pytest_cbatch import bounded, cli
from pytest_cbatch.bounded import Bounds, CallStopped
from pytest_cbatch.impls import resolve_impl
from pytest_cbatch.plugin import suite_dir
from pytest_cbatch.reference.scheduler_faults import PagedKV as ReferencePagedKV
from pytest_cbatch.reference.scheduler_sim import demo_trace, simulate
from pytest_cbatch.workloads import BASE_CONFIG

# A student's serial loop that never ends when output_tokens is negative (the invalid input
# negative_output), and that spins on workload cancel_mid_prefill (its request "victim").
LOOPY = """
    from pytest_cbatch.reference.scheduler_sim import simulate as _s


    def _drain(output_tokens):
        produced = 0
        while produced != output_tokens:
            produced += 1


    def simulate(trace, **config):
        for line in trace:
            if line["event"] == "arrival":
                _drain(-1 if line["id"] == "victim" else line["output_tokens"])
        return _s(trace, **config)
"""

CRASHY = """
    from pytest_cbatch.reference.scheduler_sim import simulate as _s


    def _lookup(line):
        return line["prompt"]


    def simulate(trace, **config):
        if any(line["id"] == "victim" for line in trace):
            _lookup(trace[0])
        return _s(trace, **config)
"""

# Hangs on every trace, counting its calls in calls.txt beside it.
ALWAYS_HANGS = """
    import os
    import time

    def simulate(trace, **config):
        with open(os.path.join(os.path.dirname(__file__), "calls.txt"), "a") as fh:
            fh.write("call\\n")
        while True:
            time.sleep(0.01)
"""

# Grows without bound (up to a safety cap, so a broken memory limit costs a time limit, not the machine).
GROWS = """
    import time

    def simulate(trace, **config):
        hoard = []
        while len(hoard) < 150:
            hoard.append(b"\\x01" * (20 << 20))
        while True:
            time.sleep(0.01)
"""

# A PagedKV whose append spins from the fifth call on; every spin is counted in spins.txt.
LIFECYCLE_HANG = """
    import os
    from pytest_cbatch.reference.scheduler_sim import PagedKV as _Base

    class PagedKV(_Base):
        appends = 0

        def append(self, owner, token):
            PagedKV.appends += 1
            if PagedKV.appends >= 5:
                with open(os.path.join(os.path.dirname(__file__), "spins.txt"), "a") as fh:
                    fh.write("spin\\n")
                while True:
                    pass
            return super().append(owner, token)
"""


def line_of(path: Path, code: str) -> int:
    """The line number of the first line of ``path`` that holds ``code``."""
    return next(n for n, line in enumerate(path.read_text().splitlines(), 1) if code in line)


def run_suite(pytester: pytest.Pytester, *args: str, keep: tuple[str, ...] = ("test_contract.py",)) -> pytest.RunResult:
    """pytest in a subprocess with only the suite modules ``keep`` collected."""
    others = sorted(p for p in suite_dir().glob("test_*.py") if p.name not in keep)
    return pytester.runpytest_subprocess(*args, "-p", "no:cacheprovider", *(f"--ignore={p}" for p in others))


def failure_text(result: pytest.RunResult, test_id: str) -> str:
    """The failure section of one test in the run's output."""
    out = result.stdout.str()
    start = out.index(f"_ {test_id} _")
    end = min([i for i in (out.find("\n____", start + 1), out.find("\n=====", start + 1)) if i > 0])
    return out[start:end]


# -- the watchdog itself --------------------------------------------------------------------------------

def test_a_loop_on_another_thread_is_stopped_with_its_stack() -> None:
    caught: list[BaseException] = []

    def spin() -> None:
        while True:
            pass

    def worker() -> None:
        try:
            bounded.call(spin, bounds=Bounds(seconds=0.3))
        except CallStopped as exc:
            caught.append(exc)

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join(30)
    assert not thread.is_alive()
    assert caught and caught[0].reason == "time" and "in spin" in caught[0].stack, caught


def test_swallowing_the_stop_does_not_escape_it() -> None:
    def stubborn() -> str:
        for _ in range(3):  # caught twice, carried on, then returned normally
            try:
                while True:
                    pass
            except BaseException:
                pass
        return "done"

    with pytest.raises(CallStopped, match="did not finish within 0.3 s"):
        bounded.call(stubborn, bounds=Bounds(seconds=0.3))


def test_a_sleep_is_interrupted_and_a_zero_limit_disables() -> None:
    import time

    with pytest.raises(CallStopped) as info:
        bounded.call(time.sleep, 600, bounds=Bounds(seconds=0.3))
    assert info.value.reason == "time"
    assert bounded.call(lambda: 7, bounds=Bounds(seconds=0, memory_mib=0)) == 7


def test_an_implementation_may_declare_the_limits_left_at_default() -> None:
    import time
    import types

    from pytest_cbatch.impls import PythonImplementation

    def simulate_(trace: list, **config: object) -> dict:
        time.sleep(600)
        return {}

    engine = types.SimpleNamespace(simulate=simulate_, CBATCH_LIMITS={"seconds": 0.5, "memory_mib": 0})
    impl = PythonImplementation("engine", engine, "test", Bounds(seconds=600))
    assert (impl.bounds.seconds, impl.bounds.memory_mib) == (0.5, 0)
    out = impl.run(demo_trace(), BASE_CONFIG)
    assert out.stopped and "did not finish within 0.5 s" in out.stopped and "in simulate_" in out.stack, out
    chosen = PythonImplementation("engine", engine, "test", Bounds(seconds=600, defaults=frozenset({"memory_mib"})))
    assert (chosen.bounds.seconds, chosen.bounds.memory_mib) == (600, 0)  # the user's own --cbatch-timeout wins


def test_a_crash_traceback_starts_at_the_implementation() -> None:
    def helper(row: dict) -> int:
        return row["prompt"]

    def simulate_(trace: list) -> int:
        return helper({})

    try:
        bounded.call(simulate_, [])
    except KeyError as exc:
        text = bounded.crash_traceback(exc)
    assert text.splitlines()[0].endswith("in simulate_"), text
    assert "in helper" in text and text.rstrip().endswith("KeyError: 'prompt'") and "bounded.py" not in text


# -- pytest: an endless loop, a crash, a memory hog --------------------------------------------------------

def test_an_endless_loop_fails_its_workload_and_the_run_goes_on(pytester: pytest.Pytester) -> None:
    loop = pytester.makepyfile(loopy=LOOPY)
    in_loop = [f'loopy.py", line {line_of(loop, code)}, in _drain' for code in ("while produced", "produced += 1")]
    result = run_suite(pytester, "--cbatch-impl=loopy.py:simulate", "--cbatch-timeout=1",
                       "-k", "cancel_mid_prefill or negative_output or (demo and not serial)")
    outcomes = result.parseoutcomes()
    assert outcomes.get("failed") == 2, result.stdout.str()
    assert outcomes.get("passed", 0) > 30  # every demo clause still ran after the hangs
    completes = failure_text(result, "test_contract[completes-cancel_mid_prefill]")
    for words in ("[completes] failed on workload 'cancel_mid_prefill'", "did not finish within 1 s",
                  "--cbatch-timeout=1", "its stack when it was stopped", '"id": "victim"', "replay:"):
        assert words in completes, (words, completes)
    assert any(where in completes for where in in_loop), completes
    assert "impls.py" not in completes and "bounded.py" not in completes, completes
    refused = failure_text(result, "test_contract[invalid_input_refused-negative_output]")
    assert "[invalid_input_refused] failed on workload 'negative_output'" in refused, refused
    assert "was stopped" in refused and any(where in refused for where in in_loop), refused
    assert "call_seconds" not in result.stdout.str()


def test_a_generated_trace_that_hangs_ends_the_test_at_the_first_stop(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(hangs=ALWAYS_HANGS)
    result = run_suite(pytester, "--cbatch-impl=hangs.py:simulate", "--cbatch-timeout=1",
                       "-k", "test_generated_traces and not preemption")
    outcomes = result.parseoutcomes()  # completes fails; every other clause's test skips at that stop
    assert outcomes.get("failed") == 1 and "passed" not in outcomes, outcomes
    text = failure_text(result, "test_generated_traces[completes]")
    assert "[completes] failed on workload 'generated-reserve'" in text, text
    assert 'hangs.py", line' in text and "trace (" in text, text
    calls = (pytester.path / "calls.txt").read_text().splitlines()
    assert calls == ["call"], f"{len(calls)} calls: the test went on (shrinking or more examples) after the stop"


def test_a_crash_in_a_helper_shows_the_implementations_file_and_line(pytester: pytest.Pytester) -> None:
    crashy = pytester.makepyfile(crashy=CRASHY)
    result = run_suite(pytester, "--cbatch-impl=crashy.py:simulate", "-k", "completes-cancel_mid_prefill")
    result.assert_outcomes(failed=1)
    text = failure_text(result, "test_contract[completes-cancel_mid_prefill]")
    assert "traceback of the implementation" in text, text
    where = f'crashy.py", line {line_of(crashy, "return line")}, in _lookup'
    assert where in text and "KeyError: 'prompt'" in text, text
    assert "impls.py" not in text and "bounded.py" not in text, text


def test_a_run_that_grows_without_bound_is_stopped_for_memory(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(grows=GROWS)
    result = run_suite(pytester, "--cbatch-impl=grows.py:simulate", "--cbatch-memory=200", "--cbatch-timeout=60",
                       "-k", "completes-demo and not serial")
    result.assert_outcomes(failed=1)
    text = failure_text(result, "test_contract[completes-demo]")
    assert "grew the process's memory by" in text and "--cbatch-memory=200" in text, text
    assert 'grows.py", line' in text, text


def test_a_lifecycle_method_that_hangs_fails_its_part_without_shrinking(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(hangkv=LIFECYCLE_HANG)
    result = run_suite(pytester, "--cbatch-impl=hangkv.py", "--cbatch-timeout=1", "-k", "allocator",
                       keep=("test_lifecycle.py",))
    result.assert_outcomes(failed=1)
    text = failure_text(result, "test_lifecycle[allocator]")
    for words in ("[lifecycle.allocator] stopped", "did not finish within 1 s", 'hangkv.py", line',
                  "in append", "pool = PagedKV(", "rerun: pytest"):
        assert words in text, (words, text)
    assert (pytester.path / "spins.txt").read_text().splitlines() == ["spin"]


class _SpinningFork(ReferencePagedKV):
    def fork(self, source, target):
        while True:
            pass


def test_a_stop_that_hypothesis_reports_as_flaky_is_still_a_stop(monkeypatch: pytest.MonkeyPatch) -> None:
    # Hypothesis reports a FlakyStrategyDefinition of its own when an example ends on a BaseException
    # before drawing as far as an earlier example with the same first draws; the stop must still surface.
    from hypothesis import settings as Settings
    from hypothesis.errors import FlakyStrategyDefinition
    from hypothesis.stateful import run_state_machine_as_test

    from pytest_cbatch.lifecycle import lifecycle_verdicts
    from pytest_cbatch.lifecycle import verdicts as verdicts_module

    def reported_as_flaky(machine, settings):
        try:
            run_state_machine_as_test(machine, settings=settings)
        except CallStopped as stop:
            raise FlakyStrategyDefinition("Inconsistent data generation!") from stop

    monkeypatch.setattr(verdicts_module, "run_state_machine_as_test", reported_as_flaky)
    namespace = SimpleNamespace(PagedKV=_SpinningFork)
    settings = Settings(max_examples=6, derandomize=True, database=None, deadline=None)
    with pytest.raises(CallStopped) as stopped:
        lifecycle_verdicts("allocator", namespace, settings, bounds=Bounds(seconds=1))
    assert "pool.fork(" not in stopped.value.script and "pool = PagedKV(" in stopped.value.script


# -- exec: the whole process session goes --------------------------------------------------------------

def _processes_with(marker: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmdline = Path("/proc", entry, "cmdline").read_bytes()
            except OSError:
                continue
            if marker.encode() in cmdline:
                found.append(int(entry))
    return found


def _gone(marker: str) -> bool:
    import time

    deadline = time.monotonic() + 10  # SIGKILLed orphans are reaped by init: give it a moment
    while _processes_with(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not _processes_with(marker)


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads /proc to find leftover processes")
def test_an_exec_timeout_kills_every_process_the_command_started(tmp_path: Path) -> None:
    script = tmp_path / "hang.sh"
    script.write_text("sleep 987651 &\nsleep 987651 &\n(sleep 987651; true) &\nsleep 987651\n")
    out = resolve_impl(f"exec:sh {script}", bounds=Bounds(seconds=1)).run(demo_trace(), BASE_CONFIG)
    assert out.report is None and out.stopped and "did not finish within 1 s" in out.stopped, out
    assert "--cbatch-timeout=1" in out.stopped
    assert _gone("987651"), "sleep children of a timed-out exec: command were left behind"


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads /proc to find leftover processes")
def test_an_exec_command_that_returns_leaves_nothing_behind(tmp_path: Path) -> None:
    script = tmp_path / "answer.sh"
    report = tmp_path / "report.json"
    report.write_text(json.dumps(simulate(demo_trace())))
    script.write_text(f"sleep 987652 >/dev/null 2>&1 &\ncat > /dev/null\ncat {report}\n")
    out = resolve_impl(f"exec:sh {script}").run(demo_trace(), BASE_CONFIG)
    assert out.report == simulate(demo_trace()), out
    assert _gone("987652")


# -- cbatch check ------------------------------------------------------------------------------------------

def test_check_prints_the_crash_first_and_one_line_for_the_skips(capsys, tmp_path: Path) -> None:
    (tmp_path / "crashy.py").write_text(textwrap.dedent(CRASHY))
    trace = tmp_path / "t.jsonl"
    trace.write_text(json.dumps({"time": 0, "event": "arrival", "id": "victim", "prompt_tokens": 2,
                                 "output_tokens": 2}) + "\n")
    code = cli.main(["check", "--impl", str(tmp_path / "crashy.py"), "--trace", str(trace)])
    lines = capsys.readouterr().out.splitlines()
    assert code == 1
    assert lines[0] == f"trace: {trace} (1 line)"
    assert lines[1].startswith("[completes] no report for a valid workload: KeyError"), lines
    where = f'crashy.py", line {line_of(tmp_path / "crashy.py", "return line")}, in _lookup'
    crash = next(i for i, line in enumerate(lines) if where in line)
    skips = [i for i, line in enumerate(lines) if line.startswith("skip")]
    assert len(skips) == 1 and crash < skips[0], lines
    assert "no report to check" in lines[skips[0]] and "32 clauses" in lines[skips[0]]


def test_check_names_its_own_options(capsys, tmp_path: Path) -> None:
    script = tmp_path / "hang.sh"
    script.write_text("sleep 987653\n")
    assert cli.main(["check", "--impl", f"exec:sh {script}", "--timeout", "1", "--clause", "completes"]) == 1
    out = capsys.readouterr().out
    assert "did not finish within 1 s (--timeout=1" in out and "--cbatch-timeout" not in out, out
    assert cli.main(["check", "--impl", "nosuch.py"]) == 2
    err = capsys.readouterr().err
    assert "--impl 'nosuch.py': no such file" in err and "--cbatch-impl" not in err, err


def test_check_report_of_another_trace_is_one_error_and_the_trace_is_named(capsys, tmp_path: Path) -> None:
    other = [{"time": 0, "event": "arrival", "id": "x", "prompt_tokens": 2, "output_tokens": 2}]
    report = tmp_path / "r.json"
    report.write_text(json.dumps(simulate(other)))
    assert cli.main(["check", "--report", str(report)]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and len(captured.err.strip().splitlines()) == 1, captured
    assert "not a report of the built-in demo trace" in captured.err and "give --trace" in captured.err
    demo = tmp_path / "demo.json"
    demo.write_text(json.dumps(simulate(demo_trace())))
    assert cli.main(["check", "--report", str(demo)]) == 0
    assert capsys.readouterr().out.startswith("trace: the built-in demo trace")
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(json.dumps(line) + "\n" for line in demo_trace()))
    assert cli.main(["check", "--report", str(report), "--trace", str(trace)]) == 2
    assert "has 1 request id(s) the trace never sends (x)" in capsys.readouterr().err


# -- plugin messages ---------------------------------------------------------------------------------------

def test_a_missing_folder_says_no_such_folder(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("--cbatch-impl=nosuch/")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "--cbatch-impl 'nosuch/': no such folder 'nosuch/'" in result.stderr.str(), result.stderr.str()


def test_the_summary_keeps_the_numerics_part_without_torch(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(torch="raise ImportError('no torch in this environment')")
    result = run_suite(pytester, "--cbatch-impl=reference", "-k", "completes-demo and not serial or numerics",
                       keep=("test_contract.py", "test_numerics.py"))
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    result.stdout.fnmatch_lines(["by part: numerics 1 skipped (the whole module: *torch*)*"])


def test_an_isolated_timeout_names_the_pytest_option(tmp_path: Path) -> None:
    from pytest_cbatch.sandbox import IsolatedImplementation, Limits, load_spec_for

    (tmp_path / "spin.py").write_text("def simulate(trace, **config):\n    while True:\n        pass\n")
    limits = Limits(call_seconds=3, max_failures=1, names=(("call_seconds", "--cbatch-timeout"),))
    impl = IsolatedImplementation("spin.py", load_spec_for(str(tmp_path / "spin.py")), limits)
    try:
        out = impl.run(demo_trace(), BASE_CONFIG)
    finally:
        impl.close()
    assert "(--cbatch-timeout)" in (out.stopped or ""), out
    assert Limits().term("call_seconds") == "limit call_seconds"


# -- the command line -------------------------------------------------------------------------------------

def test_cbatch_help_lists_every_command_and_version(capsys) -> None:
    with pytest.raises(SystemExit) as info:
        cli._parser().parse_args(["--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: cbatch [-h] [--version] COMMAND ...")
    for name, (_, summary) in cli.COMMANDS.items():
        assert name in out and summary.split()[0] in out, name
    assert cli.main(["--version"]) == 0
    assert capsys.readouterr().out.startswith("cbatch (pytest-cbatch) ")


@pytest.mark.parametrize("argv,words", [
    (["load", "--help"], ["--requests-per-level N", "(default 64)", "(default 4)", "in words (default 32)",
                          "max_tokens per request (default 16)"]),
    (["invariance", "--help"], ["--max-batch N", "(default 8)"]),
    (["check", "--help"], ["--timeout SECONDS", "(default: 60.0)", "--memory MIB"]),
])
def test_subcommand_help_shows_defaults_and_units(capsys, argv: list[str], words: list[str]) -> None:
    with pytest.raises(SystemExit):
        cli.main(argv)
    out = " ".join(capsys.readouterr().out.split())
    for word in words:
        assert word in out, (word, out)


def test_load_table_headers_carry_units() -> None:
    from pytest_cbatch.live.load import format_table

    head = format_table([], "closed").splitlines()[0]
    assert "TTFT p50 ms" in head and "E2EL p99 ms" in head and "out tok/s" in head and "req/s" in head


@pytest.mark.parametrize("argv", [["-h"], ["clauses"], ["schema", "report"]])
def test_a_closed_pipe_is_not_a_traceback(argv: list[str]) -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import sys; from pytest_cbatch.cli import main; "
                             "sys.exit(main())", *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # the reader is gone before anything is written (cbatch ... | head -0)
    err = proc.stderr.read().decode()
    proc.wait(60)
    assert "Traceback" not in err and "BrokenPipeError" not in err, err


LIFECYCLE_CRASH = '''
from pytest_cbatch.reference.scheduler_sim import PagedKV as _PagedKV


def _lookup(pool, owner):
    return pool.tables["lost-" + str(owner)]


class PagedKV(_PagedKV):
    def release(self, owner):
        _lookup(self, owner)
        return super().release(owner)
'''


def test_a_crash_in_a_lifecycle_method_shows_the_implementations_file_and_line(tmp_path: Path) -> None:
    import importlib.util

    from pytest_cbatch.lifecycle import lifecycle_verdicts

    path = tmp_path / "crashkv.py"
    path.write_text(LIFECYCLE_CRASH)
    spec = importlib.util.spec_from_file_location("crashkv", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    verdicts = lifecycle_verdicts("allocator", module, max_failures=1)
    failed = [v.message for v in verdicts.values() if v.status == "fail"]
    assert failed, verdicts
    text = failed[0]
    assert "traceback of the implementation" in text, text
    assert f'crashkv.py", line {line_of(path, "return pool.tables")}, in _lookup' in text, text
    assert "machine.py" not in text and "KeyError: 'lost-" in text, text
