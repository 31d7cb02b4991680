"""The settings a run is judged by are the ones the kit asked for, never the ones a report claims.

``config_recorded`` compares the report's own config with every setting asked (admission included);
every other clause judges the asked settings; ``check_report`` refuses a config or trace that
``cbatch check`` would refuse, with a ValueError naming the key and the value.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pytest_cbatch.cli import main
from pytest_cbatch.contract import check_report
from pytest_cbatch.impls import PythonImplementation
from pytest_cbatch.reference.scheduler_sim import demo_trace, simulate
from pytest_cbatch.runner import Judge
from pytest_cbatch.workloads import BASE_CONFIG, WORKLOADS

PREEMPTING = [name for name, w in WORKLOADS.items() if w.overrides.get("admission") == "optimistic"]


def _recorded(report: dict[str, Any]) -> list[str]:
    return [v.message for v in check_report(report, demo_trace(), BASE_CONFIG) if v.clause == "config_recorded"]


@pytest.mark.parametrize("key, recorded", [
    ("capacity", 108), ("token_budget", 10**6), ("policy", "serial"), ("release_delay", 0),
])
def test_a_report_recording_another_setting_fails_config_recorded(key: str, recorded: Any) -> None:
    report = simulate(demo_trace(), **BASE_CONFIG)
    asked = report["config"][key]
    report["config"][key] = recorded
    assert _recorded(report) == [f"config.{key}: the run asked for {asked!r}, the report records {recorded!r}"]


def test_a_report_recording_optimistic_admission_when_reserve_was_asked_fails() -> None:
    report = simulate(demo_trace(), **BASE_CONFIG)
    report["config"]["admission"] = "optimistic"
    assert _recorded(report) == ["config.admission: the run asked for 'reserve', the report records 'optimistic'"]


def test_reserve_admission_may_be_left_out_or_named() -> None:
    report = simulate(demo_trace(), **BASE_CONFIG)
    assert "admission" not in report["config"] and _recorded(report) == []
    report["config"]["admission"] = "reserve"
    assert _recorded(report) == []


def test_an_asked_optimistic_admission_left_out_fails() -> None:
    report = simulate(demo_trace(), **BASE_CONFIG, admission="optimistic")
    del report["config"]["admission"]
    found = [v.message for v in check_report(report, demo_trace(), {**BASE_CONFIG, "admission": "optimistic"})
             if v.clause == "config_recorded"]
    assert found == ["config.admission: the run asked for 'optimistic', the report records nothing"]


def test_the_other_clauses_judge_the_asked_settings_not_the_recorded_ones() -> None:
    """A report that ran (and records) a larger pool is judged against the pool it was given."""
    trace = demo_trace()
    report = simulate(trace, **{**BASE_CONFIG, "capacity": 4, "token_budget": 8})
    found = {v.clause for v in check_report(report, trace, BASE_CONFIG)}
    assert {"config_recorded", "budget_respected", "pages_conserved"} <= found, found
    honest = {v.clause for v in check_report(report, trace, {**BASE_CONFIG, "capacity": 4, "token_budget": 8})}
    assert honest == set()


def _liar(trace: Any, **config: Any) -> dict[str, Any]:
    """Drops the asked admission (never preempts) and records reserve by name."""
    config.pop("admission", None)
    report = simulate(trace, **config)
    report["config"]["admission"] = "reserve"
    return report


@pytest.mark.parametrize("workload", PREEMPTING)
def test_a_scheduler_ignoring_optimistic_admission_fails_every_preemption_workload(workload: str) -> None:
    w = WORKLOADS[workload]
    result = Judge(PythonImplementation("liar", _liar, "test")).judge("config_recorded", list(w.trace), w.config)
    assert result.status == "fail"
    assert [v.message for v in result.violations] == [
        "config.admission: the run asked for 'optimistic', the report records 'reserve'"]


def test_cbatch_check_with_optimistic_admission_catches_the_liar(capsys: pytest.CaptureFixture,
                                                                tmp_path: Path) -> None:
    source = tmp_path / "liar.py"
    source.write_text("from pytest_cbatch.reference.scheduler_sim import simulate as _simulate\n\n\n"
                      "def simulate(trace, **config):\n"
                      "    config.pop('admission', None)\n"
                      "    report = _simulate(trace, **config)\n"
                      "    report['config']['admission'] = 'reserve'\n"
                      "    return report\n")
    code = main(["check", "--impl", str(source), "--admission", "optimistic"])
    out = capsys.readouterr().out
    assert code == 1, out
    assert "[config_recorded] config.admission: the run asked for 'optimistic', the report records 'reserve'" in out
    assert "violated: config_recorded" in out


# -- check_report's own arguments ----------------------------------------------------------------------

@pytest.mark.parametrize("config, named", [
    ({**BASE_CONFIG, "token_budget": "4"}, "token_budget: must be a positive integer, got '4'"),
    ({**BASE_CONFIG, "token_budget": [4]}, "token_budget: must be a positive integer, got [4]"),
    ({**BASE_CONFIG, "release_delay": 1.5}, "release_delay: must be a nonnegative integer, got 1.5"),
    ({**BASE_CONFIG, "capacity": True}, "capacity: must be a positive integer, got True"),
    ({**BASE_CONFIG, "policy": "fifo"}, "policy: must be one of continuous, serial, got 'fifo'"),
    ({**BASE_CONFIG, "admission": {"x": 1}}, "admission: must be one of reserve, optimistic, got {'x': 1}"),
    ({**BASE_CONFIG, "tick": 1}, "unknown setting 'tick'"),
    ([("capacity", 8)], "config: expected a mapping of settings, got list"),
])
def test_check_report_refuses_a_bad_config_naming_key_and_value(config: Any, named: str) -> None:
    report = simulate(demo_trace(), **BASE_CONFIG)
    with pytest.raises(ValueError, match="^config: ") as caught:
        check_report(report, demo_trace(), config)
    assert named in str(caught.value)


@pytest.mark.parametrize("trace, named", [
    ([{"time": 0, "event": "arrival", "id": "a", "prompt_tokens": "3", "output_tokens": 2}],
     "trace[0]: prompt_tokens: must be a positive integer, got '3'"),
    ([{"time": 1.5, "event": "arrival", "id": "a", "prompt_tokens": 3, "output_tokens": 2}],
     "trace[0]: time: must be a nonnegative integer, got 1.5"),
    ([{"time": 0, "event": "cancel", "id": "a"}], "trace[0]: id: cancel names 'a'"),
    ("not a trace", "trace: expected a sequence of event objects, got str"),
])
def test_check_report_refuses_a_bad_trace_naming_line_and_field(trace: Any, named: str) -> None:
    report = simulate(demo_trace(), **BASE_CONFIG)
    with pytest.raises(ValueError) as caught:
        check_report(report, trace, BASE_CONFIG)
    assert named in str(caught.value)


def test_check_report_fills_the_settings_left_out_with_the_defaults() -> None:
    report = simulate(demo_trace(), **BASE_CONFIG)
    assert check_report(report, demo_trace(), {}) == []
    assert check_report(report, demo_trace(), {"max_active": 4, "policy": "continuous"}) == []
