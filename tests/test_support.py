"""Support is a property of settings, never of a trace: declared up front, or found by the kit's one probe.

Each test runs a hostile scheduler of its own: one that declines the traces it would fail (a cancel, its own
bugs, more than one line) scores what it would score by crashing there; a declared setting skips exactly
its workloads without a run; only the rubric makes a declined setting cost nothing.
"""

from __future__ import annotations

import json
import re
import sys
import textwrap
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

import pytest

import pytest_cbatch.reference.scheduler_sim as reference_sim
from pytest_cbatch.grading.evaluate import Submission, grade_implementation, grade_submission
from pytest_cbatch.grading.manifest import ManifestError, read_manifest
from pytest_cbatch.grading.plan import build_plan
from pytest_cbatch.grading.rubric import load_rubric
from pytest_cbatch.impls import ImplementationError, PythonImplementation, resolve_impl
from pytest_cbatch.runner import Judge
from pytest_cbatch.sandbox import LoadSpec
from pytest_cbatch.support import PROBE_TRACE
from pytest_cbatch.workloads import BASE_CONFIG, WORKLOADS

reference = reference_sim.simulate


def _rubric(tmp_path: Path, grading: str = "", limits: str = "call_seconds = 60\n") -> Any:
    path = tmp_path / "rubric.toml"
    path.write_text('[grading]\nparts = ["scheduler"]\ngenerated_examples = 2\nnumerics = "off"\n' + grading
                    + "[limits]\n" + limits + '[tests]\n"contract.*" = { points = 1 }\n', encoding="utf-8")
    return load_rubric(path)


def _grade(simulate: Callable[..., Any], rubric: Any, tmp_path: Path, name: str = "s") -> Any:
    out = tmp_path / f"out-{name}"
    out.mkdir(exist_ok=True)
    return grade_implementation(PythonImplementation(name, simulate, name), name, rubric, build_plan(rubric), out)


def _raising(exc: type[Exception], when: Callable[[list[dict[str, Any]]], bool]) -> Callable[..., Any]:
    def simulate(trace: list[dict[str, Any]], **config: Any) -> Any:
        if when(trace):
            raise exc("not this trace")
        return reference(trace, **config)
    return simulate


def _has_cancel(trace: list[dict[str, Any]]) -> bool:
    return any(line["event"] == "cancel" for line in trace)


def _test(result: Any, name: str) -> Any:
    return next(t for t in result.tests if t.name == name)


# --------------------------------------------------------------- a decline of a trace is a failure


DODGER = """
from scheduler_ref import simulate as _reference

def simulate(trace, **config):
    if any(line["event"] == "cancel" for line in trace):
        raise {exc}("cancels are not supported")
    return _reference(trace, **config)
"""


def _submission(tmp_path: Path, name: str, source: str) -> Submission:
    folder = tmp_path / name
    folder.mkdir()
    (folder / "scheduler_ref.py").write_text(Path(reference_sim.__file__).read_text(encoding="utf-8"))
    (folder / "scheduler_sim.py").write_text(textwrap.dedent(source), encoding="utf-8")
    return Submission(name, str(folder), LoadSpec(str(folder), ("scheduler_sim.py", "scheduler_ref.py")))


@pytest.mark.parametrize("optional", ["", 'optional = ["admission=optimistic", "release_delay"]\n'])
def test_the_cancel_dodger_scores_what_its_crashing_twin_scores_under_cbatch_grade(tmp_path: Path,
                                                                                  optional: str) -> None:
    """Through the sandbox, as ``cbatch grade`` runs it: the decline is of a trace (the probe with the same
    settings ran), so no rubric setting excuses it."""
    rubric = _rubric(tmp_path, optional + 'sandbox = "process"\n')
    plan = build_plan(rubric)
    scores = {}
    for exc in ("NotImplementedError", "RuntimeError"):
        out = tmp_path / f"out-{exc}"
        out.mkdir()
        result = grade_submission(_submission(tmp_path, exc, DODGER.format(exc=exc)), rubric, plan, out,
                                  sandbox="process")
        scores[exc] = result.score
        if exc == "NotImplementedError":
            completes = _test(result, "contract.completes")
            assert not completes.passed and "declined a workload whose settings it supports" in completes.output
            assert "demo" in completes.output and "was not declined" in completes.output, completes.output
            assert not result.extra.get("flags"), result.extra  # it declined no setting: nothing was skipped
    assert scores["NotImplementedError"] == scores["RuntimeError"] < 3, scores


def test_a_scheduler_that_declines_where_its_own_bug_would_show_loses_that_bugs_points(tmp_path: Path) -> None:
    """Its bug: a request cancelled before its first token reports TTFT 0.  Its trick: it checks its own report
    and declines wherever the bug shows."""
    def buggy(trace: list[dict[str, Any]], **config: Any) -> Any:
        report = reference(trace, **config)
        for row in report["requests"].values():
            if row["status"] == "cancelled" and row["ttft_ticks"] is None:
                row["ttft_ticks"] = 0
        return report

    def hiding(trace: list[dict[str, Any]], **config: Any) -> Any:
        if reference(trace, **config) != buggy(trace, **config):
            raise NotImplementedError("not supported")
        return buggy(trace, **config)

    rubric = _rubric(tmp_path)
    honest, hider = _grade(buggy, rubric, tmp_path, "honest"), _grade(hiding, rubric, tmp_path, "hider")
    assert not _test(honest, "contract.ttft_null_on_cancel").passed
    assert not _test(hider, "contract.ttft_null_on_cancel").passed, _test(hider, "contract.ttft_null_on_cancel")
    assert not _test(hider, "contract.completes").passed
    assert hider.score <= honest.score < hider.max_score, (hider.score, honest.score)


def test_one_declining_every_trace_of_more_than_one_line_fails_completes_on_each(tmp_path: Path) -> None:
    result = _grade(_raising(NotImplementedError, lambda trace: len(trace) > 1), _rubric(tmp_path), tmp_path)
    completes = _test(result, "contract.completes")
    longer = [name for name, w in WORKLOADS.items() if len(w.trace) > 1]
    found = re.search(r"failed on (\d+) of (\d+) workloads it ran on", completes.output)
    assert found and int(found.group(1)) >= len(longer), completes.output
    assert "declined a workload whose settings it supports" in completes.output
    assert result.score <= 2, result.score   # the one-line workloads and the invalid inputs are all it keeps


def test_a_verdict_depends_on_its_own_workload_and_the_probe_never_on_the_order() -> None:
    dodger = _raising(NotImplementedError, _has_cancel)
    names = list(WORKLOADS)
    verdicts = []
    for order in (names, names[::-1]):
        judge = Judge(PythonImplementation("d", dodger, "d"))
        verdicts.append({n: judge.judge("completes", list(WORKLOADS[n].trace), WORKLOADS[n].config).status
                         for n in order})
    assert verdicts[0] == verdicts[1]
    assert {n for n, v in verdicts[0].items() if v == "fail"} == \
        {n for n, w in WORKLOADS.items() if _has_cancel(list(w.trace))}


# ----------------------------------------------------------------------- declined settings


def _counting(declines: Callable[[dict[str, Any]], bool]) -> tuple[Callable[..., Any], list[tuple[str, str]]]:
    """A correct scheduler that declines the configs ``declines`` picks; ``calls`` records (trace, config)."""
    calls: list[tuple[str, str]] = []

    def simulate(trace: list[dict[str, Any]], **config: Any) -> Any:
        calls.append((json.dumps(trace), json.dumps(config, sort_keys=True)))
        if declines(config):
            raise NotImplementedError("optimistic admission is not supported")
        return reference(trace, **config)
    return simulate, calls


def _optimistic(config: dict[str, Any]) -> bool:
    return config.get("admission") == "optimistic"


def test_an_undeclared_setting_is_probed_once_per_distinct_config_and_then_skipped() -> None:
    simulate, calls = _counting(_optimistic)
    judge = Judge(PythonImplementation("o", simulate, "o"))
    optimistic = [w for w in WORKLOADS.values() if _optimistic(w.config)]
    assert len(optimistic) >= 2
    for _ in range(2):  # a second round of the same workloads: nothing new to probe
        for w in optimistic:
            result = judge.judge("completes", list(w.trace), w.config)
            judge.forget()
            assert result.status == "skip" and "probe with the same settings was declined as well" in result.reason
            assert "admission=optimistic" in result.declined, result  # what sets its config apart
    probes = [config for trace, config in calls if trace == json.dumps(list(PROBE_TRACE))]
    assert sorted(probes) == sorted({json.dumps(w.config, sort_keys=True) for w in optimistic})


def test_a_declared_setting_skips_exactly_its_workloads_without_a_run_or_a_probe(tmp_path: Path) -> None:
    simulate, calls = _counting(_optimistic)
    simulate.CBATCH_UNSUPPORTED = ["admission=optimistic"]  # type: ignore[attr-defined]
    strict = _grade(simulate, _rubric(tmp_path), tmp_path, "strict")
    assert calls and not any('"optimistic"' in config for _, config in calls), "a declared setting was run"
    optional = _grade(simulate, _rubric(tmp_path, 'optional = ["admission=optimistic"]\n'), tmp_path, "optional")
    assert optional.score == optional.max_score, [t.output for t in optional.tests if not t.passed]
    assert strict.score < strict.max_score
    completes = _test(strict, "contract.completes")
    assert "declined as unsupported (settings admission=optimistic)" in completes.output
    assert "count as not passed" in completes.output and "preempt_decode" in completes.output, completes.output
    assert "do not count: the rubric makes admission=optimistic optional" in _test(optional, "contract.completes").output
    plan = build_plan(_rubric(tmp_path))
    declined = sum(_optimistic(case.config) for case in plan.cases)
    assert strict.extra["flags"] == [f"declined: admission=optimistic ({declined} workloads)"]
    assert optional.extra["flags"] == strict.extra["flags"]  # optional or not, the instructor sees what it declined


def test_a_declared_setting_skips_its_workloads_under_pytest(pytester: pytest.Pytester) -> None:
    from test_runaway import run_suite

    pytester.makepyfile(declares="""
        import os
        from pytest_cbatch.reference.scheduler_sim import simulate as _reference

        CBATCH_UNSUPPORTED = ["admission=optimistic"]

        def simulate(trace, **config):
            with open(os.path.join(os.path.dirname(__file__), "calls.txt"), "a") as fh:
                fh.write(config.get("admission", "-") + "\\n")
            return _reference(trace, **config)
    """)
    result = run_suite(pytester, "--cbatch-impl=declares.py", "-rs", "-k", "test_contract and completes and not generated")
    optimistic = sum(_optimistic(w.config) for w in WORKLOADS.values())
    result.assert_outcomes(passed=len(WORKLOADS) - optimistic, skipped=optimistic)
    assert "optimistic" not in (pytester.path / "calls.txt").read_text()
    assert "declares it does not support admission=optimistic" in result.stdout.str()


def test_a_module_declaration_reaches_the_grader_through_the_sandbox(tmp_path: Path) -> None:
    rubric = _rubric(tmp_path, 'sandbox = "process"\n')
    source = """
        import os
        from scheduler_ref import simulate as _reference

        CBATCH_UNSUPPORTED = ("admission=optimistic",)

        def simulate(trace, **config):
            if config.get("admission") == "optimistic":
                os._exit(9)  # a run of a declared setting would die: it must not happen
            return _reference(trace, **config)
    """
    out = tmp_path / "out"
    out.mkdir()
    result = grade_submission(_submission(tmp_path, "declares", source), rubric, build_plan(rubric), out,
                              sandbox="process")
    assert result.extra["flags"][0].startswith("declined: admission=optimistic ("), result.extra
    assert "exited with status 9" not in result.output + "".join(t.output for t in result.tests)


@pytest.mark.parametrize("value, words", [
    ("'admission=optimistic'", "must be a list of settings"),
    ("[3]", "got 3"),
    ("['admission=']", "got 'admission='"),
    ("['not a key']", "got 'not a key'"),
    ("['k'] * 65", "at most 64"),
])
def test_a_bad_declaration_is_a_clear_error(value: str, words: str) -> None:
    def simulate(trace: list[dict[str, Any]], **config: Any) -> Any:
        return reference(trace, **config)

    simulate.CBATCH_UNSUPPORTED = eval(value)  # type: ignore[attr-defined]
    with pytest.raises(ImplementationError, match="CBATCH_UNSUPPORTED") as caught:
        PythonImplementation("bad", simulate, "bad.py")
    assert words in str(caught.value)


def test_the_rubrics_optional_is_validated(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"\[grading\]\.optional must be a list"):
        _rubric(tmp_path, 'optional = "admission=optimistic"\n')
    with pytest.raises(ValueError, match=r"\[grading\]\.optional: each setting is"):
        _rubric(tmp_path, 'optional = ["admission = optimistic"]\n')
    assert _rubric(tmp_path, 'optional = ["admission=optimistic"]\n').optional == ("admission=optimistic",)


def test_a_program_declares_its_settings_in_its_manifest(tmp_path: Path) -> None:
    folder = tmp_path / "p"
    folder.mkdir()
    (folder / "cbatch.toml").write_text('[submission]\nexec = "./run"\nunsupported = ["admission=optimistic"]\n')
    assert read_manifest(folder).unsupported == ("admission=optimistic",)
    (folder / "cbatch.toml").write_text('[submission]\nexec = "./run"\nunsupported = "admission"\n')
    with pytest.raises(ManifestError, match=r"cbatch.toml: \[submission\]\.unsupported must be a list"):
        read_manifest(folder)


# ---------------------------------------------------------------------------------- exec: exit 3


EXITS_3 = """
import json, sys
sys.path.insert(0, {ref!r})
from scheduler_sim import simulate
doc = json.load(sys.stdin)
with open({log!r}, "a") as fh:
    fh.write(json.dumps(doc) + "\\n")
if {when}:
    sys.stderr.write("not supported\\n")
    sys.exit(3)
print(json.dumps(simulate(doc["trace"], **doc["config"])))
"""


def _exec(tmp_path: Path, when: str) -> tuple[Judge, Path]:
    log = tmp_path / "sent.jsonl"
    script = tmp_path / "program.py"
    script.write_text(EXITS_3.format(ref=str(Path(reference_sim.__file__).parent), log=str(log), when=when))
    return Judge(resolve_impl(f"exec:{sys.executable} {script}", timeout=60)), log


def test_an_exec_program_exiting_3_only_on_some_traces_fails_completes_there(tmp_path: Path) -> None:
    judge, _ = _exec(tmp_path, 'any(line["event"] == "cancel" for line in doc["trace"])')
    dodged = judge.judge("completes", list(WORKLOADS["demo"].trace), WORKLOADS["demo"].config)
    assert dodged.status == "fail" and "exited 3" in dodged.violations[0].message
    assert "declined a workload whose settings it supports" in dodged.violations[0].message
    assert judge.judge("completes", list(WORKLOADS["budget_1"].trace), WORKLOADS["budget_1"].config).status == "pass"


def test_an_exec_program_exiting_3_on_a_setting_is_skipped_after_one_probe(tmp_path: Path) -> None:
    judge, log = _exec(tmp_path, 'doc["config"].get("admission") == "optimistic"')
    w = WORKLOADS["preempt_decode"]
    for _ in range(3):
        result = judge.judge("completes", list(w.trace), w.config)
        judge.forget()
        assert result.status == "skip" and "declined as well" in result.reason, result
    sent = [json.loads(line) for line in log.read_text().splitlines()]
    assert [doc["trace"] == list(PROBE_TRACE) for doc in sent] == [False, True, False, False]


# ------------------------------------------------------------------ the breaker and the counts


HANGS_ON_IMPOSSIBLE = """
from scheduler_ref import simulate as _reference

def simulate(trace, **config):
    report = _reference(trace, **config)   # an invalid input is refused here
    room = config["capacity"] * config["block_size"]
    if any(line["event"] == "arrival" and line["prompt_tokens"] + line["output_tokens"] > room for line in trace):
        while True:
            pass
    return report
"""


def _impossible(case: Any) -> bool:
    room = case.config["capacity"] * case.config["block_size"]
    return any(line["event"] == "arrival" and line["prompt_tokens"] + line["output_tokens"] > room
               for line in case.trace)


def test_a_submission_that_hangs_on_some_workloads_scores_the_same_in_any_order_and_with_any_breaker(
        tmp_path: Path) -> None:
    """It hangs only where an impossible request waits.  Breaker on (one timeout trips it) or off, the hangs
    first or last: the same score, every workload run, and what it really passes is what it scores."""
    submission = _submission(tmp_path, "hangs", HANGS_ON_IMPOSSIBLE)
    outcomes = {}
    for breaker in (1, 1000):
        rubric = _rubric(tmp_path, 'sandbox = "process"\n', f"call_seconds = 1.5\nmax_failures = {breaker}\n")
        plan = build_plan(replace(rubric, generated_examples=0))
        hangs = [case for case in plan.cases if _impossible(case)][:2]
        others = [case for case in plan.cases if not _impossible(case)][:4]
        assert len(hangs) == 2
        for order in ("hangs first", "hangs last") if breaker == 1 else ("hangs first",):
            cases = hangs + others if order == "hangs first" else others + hangs
            out = tmp_path / f"out-{breaker}-{order}"
            out.mkdir()
            result = grade_submission(submission, rubric, replace(plan, cases=tuple(cases)), out, sandbox="process")
            completes = _test(result, "contract.completes").output
            found = re.search(r"failed on \d+ of \d+ workloads it ran on", completes)
            outcomes[(breaker, order)] = (result.score, found.group(0) if found else completes)
    assert len(set(outcomes.values())) == 1, outcomes
    # What it really passes: invalid_input_refused alone (every other clause is blocked where it hangs).
    assert outcomes[(1000, "hangs first")] == (1, f"failed on {len(hangs)} of {len(cases)} workloads it ran on")


_COUNTS = re.compile(r"(\d+) workloads it ran on \(of (\d+) workloads: ([^;)]*)(?:; besides those it ran on: ([^)]*))?\)")


def assert_counts_add_up(text: str) -> int:
    """Every "N workloads it ran on (of T workloads: ...)" line of ``text`` adds up; how many there were."""
    found = 0
    for ran, total, kinds, rest in _COUNTS.findall(text):
        by_kind = sum(int(part.split()[0]) for part in kinds.split(", "))
        others = sum(int(part.split()[0]) for part in rest.split(", ")) if rest else 0
        assert by_kind == int(total) == int(ran) + others, (ran, total, kinds, rest)
        found += 1
    return found


def test_every_count_of_a_grading_output_adds_up(tmp_path: Path) -> None:
    """Declined (optional and not), blocked, outside a clause's scope and hidden workloads alike."""
    hidden = tmp_path / "hidden"
    hidden.mkdir()
    (hidden / "secret.jsonl").write_text(json.dumps({"config": {"capacity": 3}}) + "\n"
                                         + json.dumps({"time": 0, "event": "arrival", "id": "h", "prompt_tokens": 2,
                                                       "output_tokens": 2}) + "\n", encoding="utf-8")
    serial, _ = _counting(lambda config: config.get("policy") == "serial")   # declined: probed
    both = _raising(NotImplementedError, _has_cancel)   # a cancel declined for free: fails completes, blocks the rest

    def simulate(trace: list[dict[str, Any]], **config: Any) -> Any:
        return serial(trace, **config) if config.get("policy") == "serial" else both(trace, **config)
    simulate.CBATCH_UNSUPPORTED = ["admission=optimistic"]  # type: ignore[attr-defined]

    for number, (grading, reveal) in enumerate((("", "clauses"), ('optional = ["admission=optimistic"]\n', "clauses"),
                                                ("", "outcome"))):
        rubric = _rubric(tmp_path, grading, f'call_seconds = 60\n[hidden]\nreveal = "{reveal}"\n')
        plan = build_plan(rubric, hidden)
        out = tmp_path / f"out{number}"
        out.mkdir()
        result = grade_implementation(PythonImplementation("b", simulate, "b"), "b", rubric, plan, out)
        texts = "\n".join(t.output for t in result.tests)
        assert assert_counts_add_up(texts) == len([t for t in result.tests if "workloads it ran on" in t.output]) > 30
        assert "declined" in texts and "not judged and counted" in texts
        # per clause, the hidden workloads are counted apart; by default no clause's test names them at all
        assert ("hidden and judged apart" in texts) == (reveal == "clauses")
    with pytest.raises(AssertionError):  # the check itself can fail: the sum the old line printed
        assert_counts_add_up("127 workloads it ran on (of 232 workloads: 31 fixed, 200 generated, 1 hidden; "
                             "besides those it ran on: 104 outside the clause's scope)")
