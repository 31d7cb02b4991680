"""The trust boundary, one class of hostile value at a time (``test_fuzz.py`` searches for new ones).

Each test here is a class that once ended in an internal exception of the kit; each now ends in a
clean verdict naming the field and the value: a ``completes``, ``schema_valid`` or lifecycle clause
failure, a usage error (exit 2), or a ValueError naming the file and line.
"""

from __future__ import annotations

import enum
import json
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import Phase, settings

from pytest_cbatch import cli
from pytest_cbatch.bounded import Bounds
from pytest_cbatch.explain import timeline
from pytest_cbatch.impls import BrokenOutput, PythonImplementation, resolve_impl
from pytest_cbatch.kinds.command import exec_report
from pytest_cbatch.lifecycle import lifecycle_verdicts
from pytest_cbatch.plain import NotPlain, plain
from pytest_cbatch.reference import scheduler_faults
from pytest_cbatch.reference.scheduler_sim import demo_trace, load_trace, simulate
from pytest_cbatch.runner import ALL_CLAUSES, Judge
from pytest_cbatch.workloads import BASE_CONFIG

REPORT = simulate(demo_trace(), **BASE_CONFIG)


def judged(report: Any, clause: str = "completes") -> Any:
    """``clause`` judged on an implementation that returns ``report``."""
    impl = PythonImplementation("hostile", lambda trace, **config: report, "test", Bounds(seconds=30, memory_mib=0))
    return Judge(impl).judge(clause, demo_trace(), BASE_CONFIG)


def with_value(path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    report = json.loads(json.dumps(REPORT))
    node = report
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return report


class RaisesOnEq:
    def __eq__(self, other: object) -> bool:
        raise RuntimeError("__eq__ of the implementation")

    __hash__ = object.__hash__

    def __repr__(self) -> str:
        raise RuntimeError("__repr__ of the implementation")


class Tick(int):
    """An int subclass whose comparison is its own code."""

    def __eq__(self, other: object) -> bool:
        raise RuntimeError("Tick.__eq__")

    __hash__ = int.__hash__


def test_a_report_that_is_not_an_object_fails_schema_valid() -> None:
    for report in ([], "report", 7):
        result = judged(report, "schema_valid")
        assert result.status == "fail" and "is not of type 'object'" in result.violations[0].message, result


@pytest.mark.parametrize("value, words", [
    (RaisesOnEq(), "an object of type 'RaisesOnEq'"),
    (Tick(3), "a subclass of int of type 'Tick'"),
    (10**5000, "an integer of 16610 bits"),
    (float("nan"), "nan is not a JSON number"),
    ({1, 2}, "an object of type 'set'"),
], ids=["raising-eq-and-repr", "int-subclass", "5000-digit-int", "nan", "set"])
def test_a_report_holding_what_json_cannot_fails_completes_naming_the_place(value: Any, words: str) -> None:
    result = judged(with_value(("events", 2, "time"), value))
    assert result.status == "fail", result
    message = result.violations[0].message
    assert "/events/2/time" in message and words in message, message


def test_tuples_in_a_report_are_arrays() -> None:
    """json.dumps writes a tuple as an array, and so does the schema read one: no false alarm."""
    report = json.loads(json.dumps(REPORT))
    report["events"] = tuple(report["events"])
    snapshot = next(e for e in report["events"] if e["event"] == "snapshot")
    snapshot["block_tables"] = {rid: tuple(pages) for rid, pages in snapshot["block_tables"].items()}
    impl = PythonImplementation("tuples", lambda trace, **config: report, "test")
    judge = Judge(impl)
    verdicts = {c: judge.judge(c, demo_trace(), BASE_CONFIG).status for c in ALL_CLAUSES if c != "invalid_input_refused"}
    assert "fail" not in verdicts.values() and verdicts["schema_valid"] == "pass", verdicts


def test_a_dict_subclass_report_fails_completes() -> None:
    class Report(dict):
        def get(self, key: str, default: Any = None) -> Any:
            raise RuntimeError("Report.get")

    result = judged(Report(REPORT))
    assert result.status == "fail" and "a subclass of dict of type 'Report'" in result.violations[0].message, result


def test_determinism_compares_plain_copies() -> None:
    """The kit judges its own copy of a report: an implementation that keeps the object it returned and changes
    it later changes nothing the kit judges (here the second run is the same as the first, as returned)."""
    kept: list[dict[str, Any]] = []

    def simulate_(trace: list[Any], **config: Any) -> dict[str, Any]:
        if kept:
            kept[0]["summary"]["finished"] = -1  # changes its first report behind the kit's back
        kept.append(simulate(trace, **config))
        return kept[-1]

    impl = PythonImplementation("sneaky", simulate_, "test")
    result = Judge(impl).judge("deterministic", demo_trace(), BASE_CONFIG)
    assert result.status == "pass", result  # the second run's report equals what the first run returned


def test_an_exception_whose_message_cannot_be_read_fails_completes() -> None:
    class Hostile(Exception):
        def __str__(self) -> str:
            raise RuntimeError("__str__ of the implementation")

    def simulate_(trace: list[Any], **config: Any) -> dict[str, Any]:
        raise Hostile()

    result = Judge(PythonImplementation("raises", simulate_, "test")).judge("completes", demo_trace(), BASE_CONFIG)
    assert result.status == "fail" and "Hostile: (its message could not be read" in result.violations[0].message


def test_a_hostile_value_written_into_the_input_is_a_mutation() -> None:
    def simulate_(trace: list[Any], **config: Any) -> dict[str, Any]:
        report = simulate(trace, **config)
        trace[0]["id"] = RaisesOnEq()
        return report

    result = Judge(PythonImplementation("writes", simulate_, "test")).judge("input_not_mutated", demo_trace(),
                                                                            BASE_CONFIG)
    assert result.status == "fail" and "/0/id: an object of type 'RaisesOnEq'" in result.violations[0].message


def test_exec_output_nested_or_not_utf8_is_broken_output_naming_why() -> None:
    with pytest.raises(BrokenOutput, match="stdout is JSON nested deeper than 64 levels"):
        exec_report("exec:x", 0, b"[" * 100_000, b"")
    with pytest.raises(BrokenOutput, match=r"stdout is not UTF-8 text \(byte 3 is b'\\xff'\)"):
        exec_report("exec:x", 0, b'{"\xff": 1}', b"")
    with pytest.raises(BrokenOutput, match="stdout holds at /a 'NaN'|stdout holds at /a nan is not a JSON number"):
        exec_report("exec:x", 0, b'{"a": NaN}', b"")


def test_an_exec_program_that_prints_bytes_that_are_not_utf8_fails_completes(tmp_path: Path) -> None:
    script = tmp_path / "bytes.py"
    script.write_text("import sys\nsys.stdin.read()\nsys.stdout.buffer.write(b'\\xff\\xfe{}')\n")
    result = Judge(resolve_impl(f"exec:{sys.executable} {script}")).judge("completes", demo_trace(), BASE_CONFIG)
    assert result.status == "fail" and "stdout is not UTF-8 text (byte 1" in result.violations[0].message, result


def test_a_trace_line_of_nested_brackets_is_refused_naming_the_line(tmp_path: Path) -> None:
    path = tmp_path / "deep.jsonl"
    path.write_text(json.dumps(demo_trace()[0]) + "\n" + "[" * 100_000 + "\n")
    with pytest.raises(ValueError, match=r"deep.jsonl line 2: invalid JSON: nested too deeply"):
        load_trace(str(path))
    path.write_text('{"time": ' + "9" * 5000 + ', "event": "arrival", "id": "a", "prompt_tokens": 1, '
                    '"output_tokens": 1}\n')
    with pytest.raises(ValueError, match=r"deep.jsonl line 1: invalid JSON: Exceeds the limit"):
        load_trace(str(path))


def test_a_trace_time_beyond_64_bits_is_refused_by_the_reference() -> None:
    line = {**demo_trace()[0], "time": 2**64}
    with pytest.raises(ValueError, match=r"time: must be a nonnegative integer, got an integer of 65 bits"):
        simulate([line])


@pytest.mark.parametrize("argv, words", [
    (["--capacity", "99999999999999999999999"], "error: setting capacity: an integer of 77 bits"),
    (["--config-json", "[" * 100_000], "error: --config-json: JSON nested deeper than 64 levels"),
    (["--config-json", '{"capacity": 1e400}'], "error: --config-json: /capacity: inf is not a JSON number"),
], ids=["huge-flag", "deep-json", "infinite"])
def test_check_settings_beyond_json_are_usage_errors(capsys: pytest.CaptureFixture[str], argv: list[str],
                                                     words: str) -> None:
    code = cli.main(["check", "--impl", "reference", *argv])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith(words), err


def test_check_of_a_report_file_nested_too_deeply_is_a_usage_error(capsys: pytest.CaptureFixture[str],
                                                                    tmp_path: Path) -> None:
    path = tmp_path / "report.json"
    path.write_text("[" * 100_000)
    code = cli.main(["check", "--report", str(path)])
    err = capsys.readouterr().err
    assert code == 2 and "not a JSON report: JSON nested deeper than 64 levels" in err, err


def test_the_timeline_of_a_report_that_fails_its_schema_is_empty() -> None:
    assert timeline([], "a") == "a: (no events)"  # type: ignore[arg-type]
    assert timeline({"events": [7, {"event": "dispatch", "work": 3}]}, "a") == "a: (no events)"


@pytest.mark.parametrize("options, words", [
    (["--cbatch-config=capacity=--1"], "--cbatch-config 'capacity=--1': config: capacity: must be a positive "
                                       "integer, got '--1'"),
    (["--cbatch-config=capacity=²"], "config: capacity: must be a positive integer, got '²'"),
    (["--cbatch-expect=expect.toml"], "expect.toml: not UTF-8 text (byte 15)"),
    (["--cbatch-max-timeouts=-1"], "--cbatch-max-timeouts (ini cbatch_max_timeouts) must be a whole number"),
], ids=["double-minus", "superscript", "undecodable-expectations", "negative-breaker"])
def test_pytest_options_beyond_reason_are_usage_errors(pytester: pytest.Pytester, options: list[str],
                                                       words: str) -> None:
    (pytester.path / "expect.toml").write_bytes(b"strict = true\n\xff\n")
    result = pytester.runpytest_subprocess("--cbatch-impl=reference", "-p", "no:cacheprovider", *options)
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stderr.str()
    assert "INTERNALERROR" not in result.stderr.str() + result.stdout.str()
    assert words in result.stderr.str(), result.stderr.str()


# -- lifecycle return values -----------------------------------------------------------------------------

BRIEF = settings(max_examples=5, derandomize=True, database=None, deadline=None, phases=(Phase.generate,))


def test_a_lifecycle_read_that_returns_hostile_values_fails_its_clause() -> None:
    class PagedKV(scheduler_faults.PagedKV):
        def read(self, owner: Any) -> list[Any]:
            return [Tick(row) for row in super().read(owner)]

    namespace = type("Hostile", (), {"PagedKV": PagedKV})
    verdicts = lifecycle_verdicts("allocator", namespace, BRIEF)
    assert not [v for v in verdicts.values() if v.status == "error"], verdicts
    failed = [v.message for v in verdicts.values() if v.status == "fail"]
    assert not failed, failed  # an int subclass is read as its int part, without running its code

    class Raising(scheduler_faults.PagedKV):
        def read(self, owner: Any) -> list[Any]:
            return [RaisesOnEq() for _ in super().read(owner)]

    verdicts = lifecycle_verdicts("allocator", type("Hostile", (), {"PagedKV": Raising}), BRIEF)
    assert not [v for v in verdicts.values() if v.status == "error"], verdicts
    assert any("an object of type 'RaisesOnEq' whose methods" in v.message for v in verdicts.values()), verdicts


def test_a_lifecycle_part_with_enum_states_and_opaque_page_ids_is_no_false_alarm() -> None:
    """Plain data the kit may compare takes many forms: a str-valued Enum state, a named tuple, a page id of
    the implementation's own class compared by identity."""

    class State(str, enum.Enum):
        QUEUED = "queued"
        ACTIVE = "active"
        PREEMPTED = "preempted"
        CANCELLED = "cancelled"
        FINISHED = "finished"

    class RecomputeRequest(scheduler_faults.RecomputeRequest):
        def __getattribute__(self, name: str) -> Any:
            value = object.__getattribute__(self, name)
            return State(value) if name == "state" else value

    namespace = type("Enums", (), {"PagedKV": scheduler_faults.PagedKV, "RecomputeRequest": RecomputeRequest})
    verdicts = lifecycle_verdicts("recompute", namespace, BRIEF)
    assert all(v.status == "pass" for v in verdicts.values()), verdicts
    page = object()
    assert plain({page: [page]}, lifecycle=True) == {page: [page]}
    with pytest.raises(NotPlain):
        plain({"a": page})  # not in a report: a report is JSON


def test_what_an_implementation_declares_about_itself_is_data_too() -> None:
    from types import SimpleNamespace

    from pytest_cbatch.plugin import _engine_native

    class Limits(dict):
        def items(self) -> Any:
            raise RuntimeError("Limits.items")

    for limits in (Limits(seconds=1), {"seconds": 10**400, "memory_mib": float("nan")}):
        target = SimpleNamespace(simulate=simulate, CBATCH_LIMITS=limits)
        assert PythonImplementation("declares", target, "test").bounds == Bounds()
    for native in (Limits(release_delay=0), {"release_delay": 10**5000}, 5):
        impl = PythonImplementation("declares", SimpleNamespace(simulate=simulate, CBATCH_NATIVE_CONFIG=native), "t")
        with pytest.raises(pytest.UsageError, match="declares: its CBATCH_NATIVE_CONFIG is invalid"):
            _engine_native(impl, {})
