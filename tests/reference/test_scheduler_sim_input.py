"""The reference's input validation and its command line (``reference/scheduler_sim.py``).

Every error is a ValueError naming its place and field, raised before anything
runs; the command line exits 2 on bad input and leaves no output file behind.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pytest_cbatch.reference.scheduler_sim import (
    DEFAULT_CONFIG, demo_trace, load_trace, simulate, validate_config, validate_trace,
)

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = "reference/scheduler_sim.py"  # relative to ROOT, as a user would type it
SUBPROCESS_ENV = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
INTEGER_SETTINGS = ("capacity", "block_size", "token_budget", "max_active", "prefill_chunk", "release_delay")
PREEMPT_TRACE = [
    {"time": 0, "event": "arrival", "id": "a", "prompt_tokens": 2, "output_tokens": 2},
    {"time": 0, "event": "arrival", "id": "b", "prompt_tokens": 2, "output_tokens": 2},
]
PREEMPT_CONFIG = {"admission": "optimistic", "capacity": 2, "block_size": 2}


def arrival(time: int, rid: str, prompt: int, output: int) -> dict[str, Any]:
    return {"time": time, "event": "arrival", "id": rid, "prompt_tokens": prompt, "output_tokens": output}


def cancel(time: int, rid: str) -> dict[str, Any]:
    return {"time": time, "event": "cancel", "id": rid}


def expected_report_config(**overrides: Any) -> dict[str, Any]:
    """The report's ``config``: every setting, ``admission`` only when optimistic."""
    config = {**DEFAULT_CONFIG, **overrides}
    if config.pop("admission") == "optimistic":
        config["admission"] = "optimistic"
    return config


def of_kind(report: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    return [e for e in report["events"] if e["event"] == kind]


def write_jsonl(path: Path, lines: list[Any], *, blank_after_first: bool = False) -> Path:
    texts = [json.dumps(line) for line in lines]
    if blank_after_first:
        texts.insert(1, "   ")
    path.write_text("\n".join(texts) + "\n", encoding="utf-8")
    return path


def run_cli(*args: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, SCRIPT, *map(str, args)],
        cwd=ROOT, capture_output=True, text=True, env=SUBPROCESS_ENV, timeout=60,
    )


# ---------------------------------------------------------------------------
# 5. strict validation
# ---------------------------------------------------------------------------
GOOD = arrival(0, "a", 2, 1)


def _without(line: dict[str, Any], key: str) -> dict[str, Any]:
    return {k: v for k, v in line.items() if k != key}


TRACE_ERRORS = {
    "unknown-field": ([{**GOOD, "priority": 1}], r"trace\[0\]: unknown field 'priority'"),
    "cancel-unknown-field": ([GOOD, {**cancel(1, "a"), "output_tokens": 1}], r"trace\[1\]: unknown field 'output_tokens'"),
    "bool-time": ([{**GOOD, "time": True}], r"trace\[0\]: time:"),
    "bool-prompt": ([{**GOOD, "prompt_tokens": True}], r"trace\[0\]: prompt_tokens:"),
    "bool-output": ([{**GOOD, "output_tokens": False}], r"trace\[0\]: output_tokens:"),
    "float-time": ([{**GOOD, "time": 1.0}], r"trace\[0\]: time:"),
    "string-length": ([{**GOOD, "output_tokens": "2"}], r"trace\[0\]: output_tokens:"),
    "zero-prompt": ([{**GOOD, "prompt_tokens": 0}], r"trace\[0\]: prompt_tokens:"),
    "negative-output": ([{**GOOD, "output_tokens": -2}], r"trace\[0\]: output_tokens:"),
    "zero-output": ([{**GOOD, "output_tokens": 0}], r"trace\[0\]: output_tokens:"),
    "negative-time": ([GOOD, cancel(-1, "a")], r"trace\[1\]: time:"),
    "missing-output": ([_without(GOOD, "output_tokens")], r"trace\[0\]: output_tokens: missing"),
    "missing-time": ([_without(GOOD, "time")], r"trace\[0\]: time: missing"),
    "missing-cancel-id": ([GOOD, _without(cancel(1, "a"), "id")], r"trace\[1\]: id: missing"),
    "missing-event": ([_without(GOOD, "event")], r"trace\[0\]: event:"),
    "int-id": ([{**GOOD, "id": 7}], r"trace\[0\]: id:"),
    "empty-id": ([{**GOOD, "id": ""}], r"trace\[0\]: id:"),
    "duplicate-id": ([GOOD, arrival(3, "a", 1, 1)], r"trace\[1\]: id: duplicate request id 'a'"),
    "cancel-unknown-id": ([GOOD, cancel(1, "ghost")], r"trace\[1\]: id: cancel names 'ghost'"),
    "cancel-before-arrival": ([cancel(1, "b"), arrival(2, "b", 1, 1)], r"trace\[0\]: id: cancel names 'b'"),
    "bad-event-name": ([{**GOOD, "event": "arrive"}], r"trace\[0\]: event:"),
    "non-object-int": ([GOOD, 5], r"trace\[1\]: expected a JSON object"),
    "non-object-list": ([["arrival"]], r"trace\[0\]: expected a JSON object"),
}


@pytest.mark.parametrize(("trace", "pattern"), TRACE_ERRORS.values(), ids=TRACE_ERRORS.keys())
def test_bad_trace_line_is_a_value_error_naming_the_field(trace, pattern):
    with pytest.raises(ValueError, match="^" + pattern):
        simulate(trace)


@pytest.mark.parametrize("event", [["arrival"], {"kind": "arrival"}], ids=["list", "dict"])
def test_unhashable_event_value_is_a_value_error(event):
    with pytest.raises(ValueError, match=r"^trace\[0\]: event:"):
        simulate([{**GOOD, "event": event}])


@pytest.mark.parametrize("trace", ["arrival", {"time": 0}, 5, b"x"], ids=["str", "dict", "int", "bytes"])
def test_trace_must_be_a_sequence_of_objects(trace):
    with pytest.raises(ValueError, match=r"^trace: expected a sequence"):
        simulate(trace)


CONFIG_ERRORS = {
    "zero-capacity": ({"capacity": 0}, r"config: capacity:"),
    "float-capacity": ({"capacity": 2.0}, r"config: capacity:"),
    "bool-block-size": ({"block_size": True}, r"config: block_size:"),
    "zero-token-budget": ({"token_budget": 0}, r"config: token_budget:"),
    "zero-max-active": ({"max_active": 0}, r"config: max_active:"),
    "bool-prefill-chunk": ({"prefill_chunk": True}, r"config: prefill_chunk:"),
    "negative-release-delay": ({"release_delay": -1}, r"config: release_delay:"),
    "bool-release-delay": ({"release_delay": False}, r"config: release_delay:"),
    "unknown-policy": ({"policy": "fifo"}, r"config: policy:"),
    "none-policy": ({"policy": None}, r"config: policy:"),
    "unknown-admission": ({"admission": "lazy"}, r"config: admission:"),
    "non-string-admission": ({"admission": 1}, r"config: admission:"),
    "string-check": ({"check": "yes"}, r"check:"),
    "int-check": ({"check": 1}, r"check:"),
}


@pytest.mark.parametrize(("config", "pattern"), CONFIG_ERRORS.values(), ids=CONFIG_ERRORS.keys())
def test_bad_config_value_is_a_value_error_naming_the_setting(config, pattern):
    with pytest.raises(ValueError, match="^" + pattern):
        simulate(demo_trace(), **config)


def test_unknown_config_setting_is_refused():
    with pytest.raises(ValueError, match=r"^config: unknown setting 'speed'"):
        validate_config({**DEFAULT_CONFIG, "speed": 2})
    assert validate_config(DEFAULT_CONFIG) == DEFAULT_CONFIG


ARRIVAL_TEXT = json.dumps(GOOD)
JSONL_ERRORS = {  # file lines, the 1-based line the error names, pattern after the location
    "unknown-field-after-blank": ([ARRIVAL_TEXT, "", '{"time": 1, "event": "cancel", "id": "a", "why": 1}'], 3, "unknown field 'why'"),
    "invalid-json": ([ARRIVAL_TEXT, '{"time": 1, "event": '], 2, "invalid JSON"),
    "non-object": (["[0, 1]"], 1, "expected a JSON object"),
    "bool-prompt": (['{"time": 0, "event": "arrival", "id": "a", "prompt_tokens": true, "output_tokens": 1}'], 1, "prompt_tokens:"),
    "duplicate-id": ([ARRIVAL_TEXT, "", "", json.dumps(arrival(4, "a", 1, 1))], 4, "id: duplicate"),
    "cancel-before-its-arrival": ([json.dumps(cancel(3, "b")), json.dumps(arrival(5, "b", 1, 1))], 1, "id: cancel names 'b'"),
}


@pytest.mark.parametrize(("texts", "line", "pattern"), JSONL_ERRORS.values(), ids=JSONL_ERRORS.keys())
def test_jsonl_error_names_file_and_line(tmp_path, texts, line, pattern):
    path = tmp_path / "workload.jsonl"
    path.write_text("\n".join(texts) + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match="^" + re.escape(f"{path} line {line}: ") + pattern):
        load_trace(str(path))


def test_jsonl_undecodable_bytes_name_file_and_line(tmp_path):
    path = tmp_path / "workload.jsonl"
    path.write_bytes(ARRIVAL_TEXT.encode() + b"\n\xff\n")
    with pytest.raises(ValueError, match="^" + re.escape(f"{path} line 2: ")):
        load_trace(str(path))


# ---------------------------------------------------------------------------
# 6. command line
# ---------------------------------------------------------------------------
def read_json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


def test_cli_output_writes_the_report_and_prints_one_line(tmp_path):
    out = tmp_path / "continuous.json"
    done = run_cli("--output", out)
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout == (
        "continuous: 7 dispatches, 19 input tokens, finished 3, cancelled 1, rejected 0, "
        f"drained at tick 8, 8 free pages -> {out}\n"
    )
    assert read_json(out) == simulate(demo_trace())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["continuous.json"]  # no temporary left


def test_cli_serial_policy(tmp_path):
    out = tmp_path / "serial.json"
    done = run_cli("--policy", "serial", "--output", out)
    assert done.returncode == 0 and done.stdout.startswith("serial: 12 dispatches, 18 input tokens,")
    assert read_json(out) == simulate(demo_trace(), policy="serial")


def test_cli_without_output_prints_the_report():
    done = run_cli()
    assert done.returncode == 0
    assert json.loads(done.stdout) == simulate(demo_trace())


def test_cli_trace_round_trip(tmp_path):
    workload = write_jsonl(tmp_path / "workload.jsonl", demo_trace(), blank_after_first=True)
    out = tmp_path / "replay.json"
    done = run_cli("--trace", workload, "--output", out)
    assert done.returncode == 0, done.stderr
    assert load_trace(str(workload)) == validate_trace(demo_trace())  # sorted: arrivals before cancels at a time
    assert read_json(out) == simulate(demo_trace())


def test_cli_every_integer_option_and_check(tmp_path):
    settings_ = {"capacity": 16, "block_size": 2, "token_budget": 3, "max_active": 2, "prefill_chunk": 1, "release_delay": 0}
    assert all(settings_[name] != DEFAULT_CONFIG[name] for name in INTEGER_SETTINGS)
    flags = [arg for name, value in settings_.items() for arg in ("--" + name.replace("_", "-"), value)]
    out = tmp_path / "custom.json"
    done = run_cli(*flags, "--check", "--output", out)
    assert done.returncode == 0, done.stderr
    report = read_json(out)
    assert report["config"] == expected_report_config(**settings_)
    assert report == simulate(demo_trace(), **settings_)


def test_cli_optimistic_admission(tmp_path):
    workload = write_jsonl(tmp_path / "two.jsonl", PREEMPT_TRACE)
    out = tmp_path / "optimistic.json"
    done = run_cli("--trace", workload, "--admission", "optimistic", "--capacity", 2, "--block-size", 2, "--output", out)
    assert done.returncode == 0, done.stderr
    report = read_json(out)
    assert report["config"]["admission"] == "optimistic"
    assert report == simulate(PREEMPT_TRACE, **PREEMPT_CONFIG)
    assert [e["id"] for e in of_kind(report, "preempted")] == ["b"]


BAD_FILES = {
    "unknown-field": ([ARRIVAL_TEXT, '{"time": 1, "event": "cancel", "id": "a", "x": 0}'], 2),
    "invalid-json-after-blank": ([ARRIVAL_TEXT, "", "{oops"], 3),
    "non-object": (['"arrival"'], 1),
    "unhashable-event": (['{"time": 0, "event": ["arrival"], "id": "a"}'], 1),
}


@pytest.mark.parametrize("pre_existing", [False, True], ids=["no-output-yet", "output-exists"])
@pytest.mark.parametrize(("texts", "line"), BAD_FILES.values(), ids=BAD_FILES.keys())
def test_cli_bad_trace_exits_2_and_writes_nothing(tmp_path, texts, line, pre_existing):
    workload = tmp_path / "bad.jsonl"
    workload.write_text("\n".join(texts) + "\n", encoding="utf-8")
    out = tmp_path / "report.json"
    if pre_existing:
        out.write_text("previous report\n", encoding="utf-8")
    before = sorted(p.name for p in tmp_path.iterdir())
    done = run_cli("--trace", workload, "--output", out)
    assert done.returncode == 2
    assert done.stderr.startswith(f"error: {workload} line {line}: ") and "Traceback" not in done.stderr
    assert done.stdout == ""
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    if pre_existing:
        assert out.read_text(encoding="utf-8") == "previous report\n"


def test_cli_missing_trace_exits_2(tmp_path):
    out = tmp_path / "report.json"
    done = run_cli("--trace", tmp_path / "absent.jsonl", "--output", out)
    assert done.returncode == 2
    assert done.stderr.startswith("error: ") and "absent.jsonl" in done.stderr and "Traceback" not in done.stderr
    assert not out.exists()


@pytest.mark.parametrize(("flag", "value", "name"), [
    ("--capacity", 0, "capacity"), ("--release-delay", -1, "release_delay"), ("--token-budget", 0, "token_budget"),
])
def test_cli_bad_setting_exits_2(tmp_path, flag, value, name):
    out = tmp_path / "report.json"
    done = run_cli(flag, value, "--output", out)
    assert done.returncode == 2
    assert done.stderr.startswith(f"error: config: {name}:")
    assert not out.exists()


def test_a_cancel_listed_before_its_same_tick_arrival_is_valid_and_sorted_after_it():
    lines = [cancel(2, "b"), arrival(2, "b", 1, 1), arrival(0, "a", 1, 1)]
    report = simulate(lines)
    kinds = [(e["time"], e["event"], e.get("id")) for e in report["events"] if e["event"] in ("arrival", "cancelled")]
    assert kinds == [(0, "arrival", "a"), (2, "arrival", "b"), (2, "cancelled", "b")]
