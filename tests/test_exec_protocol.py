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
from pathlib import Path
from typing import Any, Iterator

import pytest

from pytest_cbatch.impls import RunOutcome, resolve_impl
from pytest_cbatch.plugin import suite_dir
from pytest_cbatch.reference.scheduler_sim import demo_trace, simulate, validate_config, validate_trace
from pytest_cbatch.runner import ALL_CLAUSES, Judge
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
