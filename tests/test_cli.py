"""The ``cbatch`` command: exit codes and what each subcommand prints."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from pytest_cbatch.cli import main
from pytest_cbatch.reference.scheduler_sim import demo_trace, simulate
from pytest_cbatch.schemas import SCHEMA_NAMES


def cbatch(capsys: pytest.CaptureFixture, *argv: str) -> tuple[int, str, str]:
    """Run ``cbatch ARGV`` in-process: (exit status, stdout, stderr)."""
    capsys.readouterr()
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def write_jsonl(path: Path, lines: list) -> str:
    path.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines))
    return str(path)


@pytest.fixture
def demo_files(tmp_path: Path) -> tuple[str, dict]:
    """The demo trace as a JSONL file, and the reference's report on it."""
    return write_jsonl(tmp_path / "t.jsonl", demo_trace()), simulate(demo_trace())


def write_report(tmp_path: Path, report: dict) -> str:
    path = tmp_path / "r.json"
    path.write_text(json.dumps(report))
    return str(path)


def test_check_impl_reference_is_ok(capsys) -> None:
    code, out, _ = cbatch(capsys, "check", "--impl", "reference")
    assert code == 0, out
    assert "OK" in out and "FAILED" not in out


def test_check_recorded_reference_report_is_ok(capsys, tmp_path, demo_files) -> None:
    trace, report = demo_files
    code, out, _ = cbatch(capsys, "check", "--report", write_report(tmp_path, report), "--trace", trace)
    assert code == 0, out
    assert "OK" in out


def test_check_tampered_report_fails_naming_the_clause(capsys, tmp_path, demo_files) -> None:
    trace, report = demo_files
    assert report["requests"]["cancel-me"]["ttft_ticks"] is None
    report["requests"]["cancel-me"]["ttft_ticks"] = 0
    code, out, _ = cbatch(capsys, "check", "--report", write_report(tmp_path, report), "--trace", trace)
    assert code == 1, out
    assert "ttft_null_on_cancel" in out and "cancel-me" in out


@pytest.mark.parametrize("bad_line", ["{not json", {"time": 0, "event": "arrival", "id": "x", "prompt_tokens": 0,
                                                    "output_tokens": 1}], ids=["invalid_json", "zero_prompt"])
def test_check_bad_trace_file_exits_2_naming_the_line(capsys, tmp_path, bad_line) -> None:
    trace = write_jsonl(tmp_path / "bad.jsonl", [demo_trace()[0], bad_line])
    code, out, err = cbatch(capsys, "check", "--impl", "reference", "--trace", trace)
    assert code == 2, out + err
    assert "line 2" in err, err


def test_check_unknown_clause_exits_2(capsys) -> None:
    code, _, err = cbatch(capsys, "check", "--impl", "reference", "--clause", "no_such_clause")
    assert code == 2
    assert "no_such_clause" in err and "ttft_null_on_cancel" in err  # names the clause and the known ones


def test_schema_lists_names(capsys) -> None:
    code, out, _ = cbatch(capsys, "schema")
    assert code == 0
    assert out.split() == list(SCHEMA_NAMES) and "report" in SCHEMA_NAMES


def test_schema_prints_one_schema_as_json(capsys) -> None:
    code, out, _ = cbatch(capsys, "schema", "report")
    assert code == 0
    assert "$id" in json.loads(out)


def test_clauses_lists_the_contract(capsys) -> None:
    code, out, _ = cbatch(capsys, "clauses")
    assert code == 0
    assert any(line.startswith("ttft_null_on_cancel: ") for line in out.splitlines()), out


def test_clauses_header_counts_the_rows_it_lists(capsys) -> None:
    import re

    from pytest_cbatch.runner import ALL_CLAUSES, OPT_IN_CLAUSES

    code, out, _ = cbatch(capsys, "clauses")
    header, *lines = out.splitlines()
    rows = [line for line in lines if not line.startswith(" ")]  # a clause's own rules are indented under it
    found = re.match(r"# (\d+) clauses: the contract's (\d+) \(completes, (\d+) judged on the report, (\d+) that "
                     r"watch the implementation itself\), then (\d+) opt-in", header)
    assert code == 0 and found, header
    total, contract, report, runner, opt_in = map(int, found.groups())
    assert total == len(rows) == contract + opt_in and contract == 1 + report + runner, header
    assert (contract, opt_in) == (len(ALL_CLAUSES), len(OPT_IN_CLAUSES))
    assert sum(row.endswith(" (opt-in)") for row in rows) == opt_in


@pytest.mark.parametrize("flags", [[], ["--course"]], ids=["default", "course"])
def test_check_counts_add_up_to_the_clauses_asked_for(capsys, flags) -> None:
    """The clauses judged and those named as not judged make up the contract's and the opt-in ones asked for."""
    import re

    from pytest_cbatch.runner import ALL_CLAUSES, OPT_IN_CLAUSES

    code, out, _ = cbatch(capsys, "check", "--impl", "reference", *flags)
    found = re.search(r"OK: all (\d+) clauses judged \(of the contract's (\d+) clauses(?: and (\d+) opt-in: "
                      r"([a-z_, ]+))?\) hold", out)
    unjudged = re.search(r"not judged in this run: ([a-z_, ]+) \(", out)
    assert code == 0 and found and unjudged, out
    judged, contract, opt_in = int(found[1]), int(found[2]), int(found[3] or 0)
    assert contract == len(ALL_CLAUSES) and opt_in == (len(OPT_IN_CLAUSES) if flags else 0), out
    assert judged + len(unjudged[1].split(", ")) == contract + opt_in, out
    assert (found[4] or "").split(", ") == (list(OPT_IN_CLAUSES) if flags else [""])


def test_impls_lists_reference(capsys) -> None:
    code, out, _ = cbatch(capsys, "impls")
    assert code == 0
    assert any(line.startswith("reference = ") for line in out.splitlines()), out


def test_simulate_output_writes_the_report(capsys, tmp_path) -> None:
    target = tmp_path / "x.json"
    code, out, _ = cbatch(capsys, "simulate", "--output", str(target))
    assert code == 0, out
    assert json.loads(target.read_text()) == simulate(demo_trace())


def test_unknown_command_exits_2(capsys) -> None:
    code, _, err = cbatch(capsys, "frobnicate")
    assert code == 2
    assert "frobnicate" in err


def test_console_script_check_reference() -> None:
    exe = shutil.which("cbatch")
    if exe is None:
        pytest.skip("the cbatch console script is not installed")
    proc = subprocess.run([exe, "check", "--impl", "reference"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "OK" in proc.stdout


@pytest.mark.parametrize("case", ["negative_output", "bool_block_size", "unknown_policy"])
def test_an_invalid_input_replay_runs_the_invalid_input(capsys, tmp_path, case) -> None:
    """The replay line of an invalid_input_refused failure reruns that very input, invalid settings included."""
    import shlex

    from pytest_cbatch.explain import replay_command
    from pytest_cbatch.workloads import BASE_CONFIG, INVALID_INPUTS

    trace, overrides = INVALID_INPUTS[case]
    path = write_jsonl(tmp_path / "t.jsonl", trace)
    lenient = "pytest_cbatch.examples.broken_schedulers:accepts_invalid"
    argv = shlex.split(replay_command(lenient, path, {**BASE_CONFIG, **overrides}, "invalid_input_refused"))[1:]
    code, out, err = cbatch(capsys, *argv)
    assert code == 1 and "invalid input accepted" in out, out + err
    argv[argv.index("--impl") + 1] = "reference"
    code, out, err = cbatch(capsys, *argv)
    assert code == 0 and "OK: the invalid input was refused" in out, out + err


def test_invalid_input_refused_is_checked_alone(capsys) -> None:
    code, _, err = cbatch(capsys, "check", "--impl", "reference", "--clause", "invalid_input_refused",
                          "--clause", "completes")
    assert code == 2 and "checked alone" in err


def test_explain_help_is_its_own(capsys) -> None:
    """explain --help describes drawing a page (not checking), lists the lifecycle form, and its --html is
    required rather than "also" drawn; check --help keeps its own."""
    with pytest.raises(SystemExit):
        main(["explain", "--help"])
    explain = " ".join(capsys.readouterr().out.split())
    assert "Check a scheduler against the contract" not in explain and "Draw one checked run" in explain
    assert "--lifecycle PART" in explain and "--examples N" in explain
    assert "also draw" not in explain and "--html OUT the page to write" in explain
    with pytest.raises(SystemExit):
        main(["check", "--help"])
    check = " ".join(capsys.readouterr().out.split())
    assert "Check a scheduler against the contract" in check and "--lifecycle" not in check
