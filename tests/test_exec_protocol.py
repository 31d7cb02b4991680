"""The ``exec:`` protocol as docs/exec-protocol.md states it: each statement pinned (the kit really
sends, reads and decides what the page says), and a scheduler written in JavaScript from the page
alone passes every clause over it.

The statements about stdin are pinned on one recording run of the shipped suite: a shell program that
saves what it is sent and exits 3, so every workload is sent once and nothing else runs.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any, Iterator

import pytest

from pytest_cbatch.cli import main as cbatch_main
from pytest_cbatch.explain import stack_lines
from pytest_cbatch.impls import RunOutcome, resolve_impl
from pytest_cbatch.plugin import suite_dir
from pytest_cbatch.reference.scheduler_sim import demo_trace, simulate, validate_config, validate_trace
from pytest_cbatch.runner import ALL_CLAUSES, Judge
from pytest_cbatch.sandbox import IsolatedImplementation, Limits, LoadSpec
from pytest_cbatch.support import PROBE_TRACE
from pytest_cbatch.workloads import BASE_CONFIG, INVALID_INPUTS, WORKLOADS, arrival

JS_SCHEDULER = Path(__file__).resolve().parent / "exec_node" / "scheduler.js"
SEVEN = set(BASE_CONFIG)

RECORDER = """#!/bin/sh
# Save what the kit sends, who this process is and where it runs; then "not supported".
out="$CBATCH_PROBE_DIR/$$"
cat > "$out.in"
set -- $(cat /proc/$$/stat)
echo "$1 $5 $6" > "$out.ids"
pwd > "$out.cwd"
printf '%s' "$CBATCH_PROBE_TOKEN" > "$out.env"
echo "recorded" >&2
exit 3
"""


def run_sh(tmp_path: Path, body: str, trace: list[dict[str, Any]] | None = None,
           config: dict[str, Any] | None = None) -> RunOutcome:
    """Run ``body`` as an ``exec:sh`` program on a workload (default: the demo)."""
    script = tmp_path / "program.sh"
    script.write_text(body)
    impl = resolve_impl(f"exec:sh {shlex.quote(str(script))}", timeout=60)
    return impl.run(demo_trace() if trace is None else trace, dict(BASE_CONFIG) if config is None else config)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One run of the shipped suite's fixed workloads and invalid inputs (``test_contract``) over the recorder:
    ``runs`` maps each process id to what it saw; ``where`` is the directory pytest ran in."""
    root = tmp_path_factory.mktemp("exec-recording")
    probe, project = root / "probe", root / "project"
    probe.mkdir()
    project.mkdir()
    recorder = root / "recorder.sh"
    recorder.write_text(RECORDER)
    env = {**os.environ, "CBATCH_PROBE_DIR": str(probe), "CBATCH_PROBE_TOKEN": "token-from-the-kit"}
    done = subprocess.run([sys.executable, "-m", "pytest", f"{suite_dir() / 'test_contract.py'}::test_contract",
                           f"--cbatch-impl=exec:sh {recorder}", "-p", "no:cacheprovider", "-q",
                           "-k", "completes or invalid_input_refused"],  # one test per run: each sends it
                          cwd=project, env=env,
                          capture_output=True, text=True, timeout=300)
    summary = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
    # Every test skips (the recorder supports nothing); whether such a run ends 0 is the plugin's matter.
    assert " skipped" in summary and "failed" not in summary and "error" not in summary, \
        done.stdout[-3000:] + done.stderr[-3000:]
    runs = {}
    for saved in probe.glob("*.in"):
        stem = saved.with_suffix("")
        runs[stem.name] = {"raw": saved.read_bytes(), "ids": stem.with_suffix(".ids").read_text().split(),
                           "cwd": stem.with_suffix(".cwd").read_text().strip(),
                           "env": stem.with_suffix(".env").read_text()}
    return {"runs": runs, "where": str(project)}


def documents(recorded: dict[str, Any], probes: bool = False) -> Iterator[dict[str, Any]]:
    """What the suite's workloads sent; with ``probes``, what the kit's probes of declined settings sent."""
    for run in recorded["runs"].values():
        doc = json.loads(run["raw"])
        if (doc["trace"] == list(PROBE_TRACE)) == probes:
            yield doc


def is_valid(doc: dict[str, Any]) -> bool:
    try:
        validate_trace(doc["trace"])
        validate_config(doc["config"])
    except ValueError:
        return False
    return True


def test_every_workload_and_invalid_input_is_sent_once_as_the_suite_holds_it(recorded: dict[str, Any]) -> None:
    expected = [{"trace": list(w.trace), "config": w.config} for w in WORKLOADS.values()]
    expected += [{"trace": trace, "config": {**BASE_CONFIG, **overrides}} for trace, overrides in INVALID_INPUTS.values()]
    got = list(documents(recorded))
    assert len(got) == len(expected) == len(WORKLOADS) + len(INVALID_INPUTS)
    for doc in expected:
        assert doc in got, doc


def test_a_program_that_declines_everything_is_probed_once_per_distinct_config(recorded: dict[str, Any]) -> None:
    configs = [json.dumps(doc["config"], sort_keys=True) for doc in documents(recorded, probes=True)]
    assert sorted(configs) == sorted({json.dumps(doc["config"], sort_keys=True) for doc in documents(recorded)})


def test_stdin_is_one_ascii_object_of_trace_and_config_then_end_of_file(recorded: dict[str, Any]) -> None:
    for run in recorded["runs"].values():
        raw = run["raw"]
        assert raw.isascii() and not raw.endswith(b"\n"), raw[-80:]
        doc = json.loads(raw)  # one document: trailing data would raise
        assert isinstance(doc, dict) and set(doc) == {"trace", "config"}


def test_a_request_id_outside_ascii_is_sent_as_an_escape(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CBATCH_PROBE_DIR", str(tmp_path))
    (tmp_path / "recorder.sh").write_text(RECORDER)
    resolve_impl(f"exec:sh {tmp_path / 'recorder.sh'}").run([arrival(0, "café", 1, 1)], dict(BASE_CONFIG))
    (sent,) = [path for path in tmp_path.glob("*.in") if b'"probe"' not in path.read_bytes()]  # not the probe
    raw = sent.read_bytes()
    assert raw.isascii() and b'"caf\\u00e9"' in raw and json.loads(raw)["trace"][0]["id"] == "café"


def test_the_trace_arrives_in_the_workloads_order(recorded: dict[str, Any]) -> None:
    for name in ("demo", "cancel_listed_first"):
        trace = list(WORKLOADS[name].trace)
        assert validate_trace(trace) != trace  # the workload is not sorted: sorting is the program's job
        assert any(doc["trace"] == trace for doc in documents(recorded)), name


def test_config_holds_the_seven_settings_and_admission_only_when_asked(recorded: dict[str, Any]) -> None:
    admissions = set()
    for doc in documents(recorded):
        keys = set(doc["config"])
        assert SEVEN <= keys <= SEVEN | {"admission"}, keys
        if "admission" in keys:
            admissions.add(doc["config"]["admission"])
    assert admissions == {"optimistic", "reserve"}
    demo = next(doc for doc in documents(recorded) if doc["trace"] == list(WORKLOADS["demo"].trace)
                and doc["config"]["policy"] == "continuous")
    assert set(demo["config"]) == SEVEN


def test_every_number_sent_is_a_plain_integer(recorded: dict[str, Any]) -> None:
    def no_fraction(text: str) -> Any:
        raise AssertionError(f"a number with a fraction or an exponent was sent: {text}")

    integers: list[int] = []
    for run in recorded["runs"].values():
        json.loads(run["raw"], parse_float=no_fraction, parse_constant=no_fraction,
                   parse_int=lambda text: integers.append(int(text)) or int(text))
    assert integers and max(abs(n) for n in integers) < 10**6


def test_booleans_and_invalid_values_arrive_only_in_the_invalid_input_cases(recorded: dict[str, Any]) -> None:
    invalid = [{"trace": trace, "config": {**BASE_CONFIG, **overrides}} for trace, overrides in INVALID_INPUTS.values()]
    invalid += [{"trace": list(PROBE_TRACE), "config": doc["config"]} for doc in invalid]  # their settings' probes
    for run in recorded["runs"].values():
        doc = json.loads(run["raw"])
        if is_valid(doc):
            assert b"true" not in run["raw"] and b"false" not in run["raw"], doc
        else:
            assert doc in invalid, doc


def test_each_run_is_a_fresh_process_leading_its_own_session_in_the_kits_directory(
        recorded: dict[str, Any]) -> None:
    runs = recorded["runs"]
    assert len({run["ids"][0] for run in runs.values()}) == len(runs)     # one process per run
    for run in runs.values():
        pid, group, session = run["ids"]
        assert pid == group == session, run["ids"]                        # a new session, and its leader
        assert run["cwd"] == recorded["where"] and run["env"] == "token-from-the-kit"


def test_the_deterministic_clause_starts_the_same_run_twice(tmp_path: Path) -> None:
    (tmp_path / "report.json").write_text(json.dumps(simulate(demo_trace(), **BASE_CONFIG)))
    script = tmp_path / "twice.sh"
    script.write_text(f'cat > "{tmp_path}/$$.in"; cat {tmp_path}/report.json\n')
    result = Judge(resolve_impl(f"exec:sh {script}")).judge("deterministic", demo_trace(), dict(BASE_CONFIG))
    assert result.status == "pass", result
    first, second = (path.read_bytes() for path in tmp_path.glob("*.in"))
    assert first == second


def test_stdout_is_one_json_document_with_whitespace_around_it(tmp_path: Path) -> None:
    expected = simulate(demo_trace(), **BASE_CONFIG)
    (tmp_path / "report.json").write_text(json.dumps(expected))
    out = run_sh(tmp_path, f"cat > /dev/null; echo progress >&2; printf '\\n  '; cat {tmp_path}/report.json; "
                           f"printf '  \\n\\n'")
    assert out.report == expected, out


def test_anything_else_on_stdout_is_broken_output(tmp_path: Path) -> None:
    (tmp_path / "report.json").write_text(json.dumps(simulate(demo_trace(), **BASE_CONFIG)))
    out = run_sh(tmp_path, f"cat > /dev/null; echo 'starting the scheduler'; cat {tmp_path}/report.json")
    assert out.report is None and out.broken and out.broken.startswith("stdout"), out


@pytest.mark.parametrize("ending, outcome, message", [
    ("exit 3", "unsupported", "exited 3 (unsupported): the reason"),
    ("exit 1", "refused", "exit status 1: the reason"),
    ("exit 2", "refused", "exit status 2: the reason"),
    ("exit 42", "refused", "exit status 42: the reason"),
    ("kill -9 $$", "refused", "exit status -9: the reason"),
])
def test_the_exit_status_decides_the_outcome(tmp_path: Path, ending: str, outcome: str, message: str) -> None:
    out = run_sh(tmp_path, f"cat > /dev/null; echo '{{\"not\": \"read\"}}'; echo 'first line' >&2; "
                           f"echo 'the reason' >&2; echo >&2; {ending}")
    assert out.report is None and out.broken is None, out
    assert message in (getattr(out, outcome) or ""), out


def test_exit_3_on_invalid_input_is_a_skip_not_a_refusal(tmp_path: Path) -> None:
    script = tmp_path / "unsupported.sh"
    script.write_text("echo 'cannot do that' >&2; exit 3\n")
    trace, overrides = INVALID_INPUTS["duplicate_id"]
    result = Judge(resolve_impl(f"exec:sh {script}")).judge_refusal(trace, {**BASE_CONFIG, **overrides})
    assert result.status == "skip" and "cannot do that" in result.reason


def test_a_program_may_exit_without_reading_stdin(tmp_path: Path) -> None:
    big = [arrival(t, f"request-{t}", 1, 1) for t in range(5000)]   # several pipe buffers of input
    out = run_sh(tmp_path, "echo 'refused unread' >&2; exit 2", trace=big)
    assert out.refused == "exit status 2: refused unread", out


def test_the_command_is_split_into_words_without_a_shell(tmp_path: Path) -> None:
    impl = resolve_impl("""exec:sh -c 'printf "%s|%s|%s" "$1" "$2" "$3" >&2; exit 2' sh '$HOME' * "a b" """)
    assert impl.run(demo_trace(), dict(BASE_CONFIG)).refused == "exit status 2: $HOME|*|a b"


def test_a_command_that_cannot_start_refuses_the_run(tmp_path: Path) -> None:
    out = resolve_impl(f"exec:{tmp_path}/no-such-program").run(demo_trace(), dict(BASE_CONFIG))
    assert out.refused and out.refused.startswith(f"could not start '{tmp_path}/no-such-program'"), out


def test_a_refusals_stderr_is_labelled_as_the_programs_stderr(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture) -> None:
    """3.4: what a refusal shows below its message is the program's stderr, titled so: not a traceback."""
    script = tmp_path / "refuses.sh"
    script.write_text("echo 'warming up' >&2; echo 'admit: queue is corrupt' >&2; exit 1\n")
    assert cbatch_main(["check", "--impl", f"exec:sh {script}", "--clause", "completes"]) == 1
    out = capsys.readouterr().out
    assert "[completes] no report for a valid workload: exit status 1: admit: queue is corrupt" in out, out
    assert "  the program's stderr (its last non-blank lines):\n  warming up\n  admit: queue is corrupt" in out, out
    assert "traceback of the implementation" not in out, out


def test_a_program_submissions_stderr_is_labelled_as_its_stderr(tmp_path: Path) -> None:
    """3.4 for a graded program: the sandbox child sends the stderr's last lines as the refusal's stack."""
    folder = tmp_path / "s"
    folder.mkdir()
    (folder / "run.sh").write_text("echo 'line one' >&2; echo 'cannot parse the trace' >&2; exit 2\n")
    impl = IsolatedImplementation("s", LoadSpec(str(folder), command=("sh", "run.sh")), Limits(call_seconds=30),
                                  mode="process")
    try:
        result = Judge(impl).judge("completes", demo_trace(), dict(BASE_CONFIG))
    finally:
        impl.close()
    assert result.status == "fail" and "exit status 2: cannot parse the trace" in str(result.violations[0])
    assert stack_lines(result.stack, result.stopped) == [
        "  the program's stderr (its last non-blank lines):", "  line one", "  cannot parse the trace"]


def test_the_sandboxed_program_shows_its_stderr_as_exec_does() -> None:
    """The child's copy (it cannot import the kit) writes exactly the text ``exec:`` writes."""
    from pytest_cbatch.kinds import command
    from pytest_cbatch.sandbox import program

    for stderr in (b"", b"one\n\n  two  \n", b"x" * 500 + b"\n\xff\xfe bad bytes\n", b"line\n" * 40 + b"y" * 70000):
        assert program.stderr_stack(stderr) == command.stderr_stack(stderr), stderr[:40]


def test_a_refused_fraction_setting_is_judged_as_invalid_input_not_as_no_report(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """2.6: ``capacity`` 8.0 is invalid; refusing it passes as invalid_input_refused would judge it, and a
    report for it fails there, instead of completes (or every clause) judging it as a valid workload."""
    refusing = tmp_path / "refusing.sh"
    refusing.write_text("echo 'config: capacity: not an integer' >&2; exit 2\n")
    settings = ["--config-json", '{"capacity": 8.0}']
    assert cbatch_main(["check", "--impl", f"exec:sh {refusing}", *settings]) == 0
    out = capsys.readouterr().out
    assert "judged as clause invalid_input_refused" in out and "no report for a valid workload" not in out, out
    assert "OK: the invalid input was refused (exit status 2: config: capacity: not an integer)" in out, out
    accepting = tmp_path / "accepting.sh"
    accepting.write_text(f"cat > /dev/null; cat {shlex.quote(str(tmp_path / 'report.json'))}\n")
    (tmp_path / "report.json").write_text(json.dumps(simulate(demo_trace())))
    assert cbatch_main(["check", "--impl", f"exec:sh {accepting}", *settings]) == 1
    out = capsys.readouterr().out
    assert "[invalid_input_refused] invalid input accepted" in out, out


def test_a_value_beyond_64_bits_stops_cbatch_check_before_the_program_starts(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """2.8: nothing beyond 2^63-1 is ever sent: exit 2 before the program runs (it would leave a file)."""
    started = tmp_path / "started"
    script = tmp_path / "program.sh"
    script.write_text(f"touch {shlex.quote(str(started))}; exit 2\n")
    assert cbatch_main(["check", "--impl", f"exec:sh {script}", "--config-json",
                        json.dumps({"capacity": 2**63})]) == 2
    assert "integers beyond 9223372036854775807 are not accepted" in capsys.readouterr().err
    trace = tmp_path / "huge.jsonl"
    trace.write_text(json.dumps(arrival(0, "a", 2**64, 1)) + "\n")
    assert cbatch_main(["check", "--impl", f"exec:sh {script}", "--trace", str(trace)]) == 2
    assert "prompt_tokens: must be a positive integer, got an integer of 65 bits" in capsys.readouterr().err
    assert not started.exists()
    assert cbatch_main(["check", "--impl", f"exec:sh {script}", "--config-json",
                        json.dumps({"capacity": 2**63 - 1}), "--clause", "completes"]) == 1
    assert started.exists()   # the largest value sent is a signed 64-bit integer's


def test_a_value_too_large_for_the_programs_integers_is_a_skip_on_exit_3(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """2.8: a program with 32-bit integers exits 3 on a value they cannot hold: skipped, never a failure."""
    script = tmp_path / "int32.py"
    script.write_text(textwrap.dedent("""
        import json, sys
        config = json.load(sys.stdin)["config"]
        for name, value in config.items():
            if isinstance(value, int) and abs(value) > 2**31 - 1:
                print(f"{name}: does not fit a 32-bit integer", file=sys.stderr)
                sys.exit(3)
        sys.exit(1)
    """))
    assert cbatch_main(["check", "--impl", f"exec:{sys.executable} {script}", "--config-json",
                        json.dumps({"capacity": 2**40})]) == 1
    out = capsys.readouterr().out
    assert "exited 3 (unsupported): capacity: does not fit a 32-bit integer" in out, out
    assert "[completes]" not in out and "FAILED: nothing judged" in out, out


needs_node = pytest.mark.skipif(shutil.which("node") is None,
                                reason="node is not installed: the JavaScript conformance scheduler cannot run")
CONFORMANCE_WORKLOADS = ("demo", "preempt_cancel", "reserve_asked", "impossible_behind")
CONFORMANCE_INVALID = ("bool_time", "unknown_field", "duplicate_id", "cancel_before_arrival", "unknown_policy")


@needs_node
def test_a_javascript_scheduler_written_from_the_spec_passes_every_clause(request: pytest.FixtureRequest) -> None:
    """A few workloads that reach every clause (all of them, and every invalid input, with --run-slow)."""
    slow = request.config.getoption("--run-slow")
    judge = Judge(resolve_impl(f"exec:node {shlex.quote(str(JS_SCHEDULER))}", timeout=60))
    ran: set[str] = set()
    for name in WORKLOADS if slow else CONFORMANCE_WORKLOADS:
        w = WORKLOADS[name]
        for cid in ALL_CLAUSES:
            if cid == "invalid_input_refused":
                continue
            result = judge.judge(cid, list(w.trace), w.config)
            assert result.status == "pass", (name, cid, result.reason, [str(v) for v in result.violations])
            ran.add(cid)
    for name in INVALID_INPUTS if slow else CONFORMANCE_INVALID:
        trace, overrides = INVALID_INPUTS[name]
        result = judge.judge_refusal(trace, {**BASE_CONFIG, **overrides})
        assert result.status == "pass", (name, result.reason, [str(v) for v in result.violations])
        ran.add("invalid_input_refused")
    assert ran == set(ALL_CLAUSES)                                          # every clause ran
    preempted = judge.run(list(WORKLOADS["preempt_cancel"].trace), WORKLOADS["preempt_cancel"].config)
    assert any(e["event"] == "preempted" for e in preempted.outcome.report["events"])  # the optimistic path ran
