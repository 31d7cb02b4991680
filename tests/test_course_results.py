"""Clause course_results (opt-in): the exact results the course states and its published simulator gives.

It must pass every independent exact implementation of the course's policy, whatever freedoms each
takes, fail the rotation bug (a published simulator whose two rotation counters advance by one per
dispatch passes every other clause, yet runs the demo in 8 dispatches and 20 input tokens instead of
the course's 7 and 19), and stay off unless asked for.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings

from pytest_cbatch import strategies
from pytest_cbatch.cli import main as cbatch_main
from pytest_cbatch.contract import check_report, clause_ids
from pytest_cbatch.contract.course import PUBLISHED_SCHEDULE
from pytest_cbatch.grading.evaluate import grade_implementation, rubric_tests
from pytest_cbatch.grading.plan import Plan, build_plan
from pytest_cbatch.grading.rubric import load_rubric
from pytest_cbatch.impls import PythonImplementation, resolve_impl
from pytest_cbatch.picture import failure_page
from pytest_cbatch.reference.scheduler_sim import demo_trace, simulate
from pytest_cbatch.runner import ALL_CLAUSES, Judge
from pytest_cbatch.workloads import BASE_CONFIG, WORKLOADS

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = ROOT / "reference" / "scheduler_sim.py"
COURSE_EXAMPLE = ROOT / "examples" / "course_scheduler.py"
ROTATION = "        self.decode_turn += turn_d\n        self.prefill_turn += turn_p\n"
CID = "course_results"
FROM_WORDS = Path(__file__).parent / "reference" / "course_from_words.py"
WORDS_ROTATION = ("        d += decode_rows                                             # rule 6\n"
                  "        p += len(rows) - decode_rows\n")


def rotation_bug(folder: Path) -> Path:
    """The published simulator with both rotation counters advancing by one per dispatch."""
    source = REFERENCE.read_text(encoding="utf-8")
    assert ROTATION in source
    path = folder / "scheduler_sim.py"
    path.write_text(source.replace(ROTATION, "        self.decode_turn += 1\n        self.prefill_turn += 1\n"),
                    encoding="utf-8")
    return path


def _load(path: Path) -> Any:
    spec = importlib.util.spec_from_file_location(f"_course_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _published_model(trace: list[dict[str, Any]], **config: Any) -> dict[str, Any]:
    """tests/reference/published_model.py, the naive independent model, behind a simulate() signature."""
    if config.get("admission", "reserve") != "reserve":
        raise NotImplementedError("the naive model follows reserve admission only")
    model = _load(Path(__file__).parent / "reference" / "published_model.py")
    return model.published_report(trace, {**BASE_CONFIG, **config})


EXACT = {
    "published": lambda: resolve_impl(str(REFERENCE)),
    "published_model": lambda: PythonImplementation("published_model", _published_model, "tests/reference"),
    "course_example": lambda: resolve_impl(str(COURSE_EXAMPLE)),
}


def course_verdict(impl: Any, trace: list[dict[str, Any]], config: dict[str, Any]) -> Any:
    return Judge(impl).judge(CID, trace, config)


# -- the course's numbers ---------------------------------------------------------------------------


def test_the_reference_gives_the_results_the_course_states() -> None:
    """The seed's "Expected built-in result", word for word, and its printed assertions."""
    report = simulate(demo_trace())
    assert report["summary"] == {"drained_at_tick": 8, "dispatches": 7, "processed_input_tokens": 19,
                                 "free_blocks": 8, "finished": 3, "cancelled": 1, "rejected": 0}
    fed: dict[str, int] = {}
    for ev in report["events"]:
        for row in ev.get("work", ()):
            fed[row["id"]] = fed.get(row["id"], 0) + row["input_tokens"]
    assert fed == {"long": 11, "short": 3, "late": 4, "cancel-me": 1}
    assert report["requests"]["long"]["token_times"] == [4, 5, 6, 7]
    assert report["requests"]["cancel-me"]["ttft_ticks"] is None


# -- the rotation bug -----------------------------------------------------------------------------


def test_the_rotation_bug_passes_every_other_clause_and_fails_course_results(tmp_path: Path) -> None:
    judge = Judge(resolve_impl(str(rotation_bug(tmp_path))))
    trace = demo_trace()
    others = {cid: judge.judge(cid, trace, BASE_CONFIG).status for cid in ALL_CLAUSES
              if cid != "invalid_input_refused"}
    assert set(others.values()) == {"pass"}, others
    result = judge.judge(CID, trace, BASE_CONFIG)
    assert result.status == "fail"
    text = "\n".join(map(str, result.violations))
    assert "summary.dispatches: the course's simulator gives 7, this report 8" in text
    assert "summary.processed_input_tokens: the course's simulator gives 19, this report 20" in text


def test_cbatch_check_course_fails_the_rotation_bug_and_plain_check_does_not(tmp_path: Path,
                                                                            capsys: pytest.CaptureFixture) -> None:
    bug = str(rotation_bug(tmp_path))
    assert cbatch_main(["check", "--impl", bug]) == 0
    assert "OK: all 33 clauses judged" in capsys.readouterr().out
    assert cbatch_main(["check", "--impl", bug, "--course"]) == 1
    out = capsys.readouterr().out
    assert ("FAILED: 1 of the 34 clauses judged (of the contract's 34 clauses and 1 opt-in: course_results) "
            "violated: course_results") in out
    assert cbatch_main(["check", "--impl", str(REFERENCE), "--course"]) == 0
    assert "OK: all 34 clauses judged" in capsys.readouterr().out


def test_a_recorded_report_is_checked_with_its_own_settings(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    bug = _load(rotation_bug(tmp_path))
    recorded = tmp_path / "bug.json"
    trace = tmp_path / "trace.jsonl"
    trace.write_text("".join(__import__("json").dumps(line) + "\n" for line in demo_trace()), encoding="utf-8")
    assert bug.main(["--trace", str(trace), "--output", str(recorded), "--release-delay", "2"]) == 0
    assert cbatch_main(["check", "--report", str(recorded), "--trace", str(trace), "--course"]) == 1
    assert "summary.dispatches: the course's simulator gives 7, this report 8" in capsys.readouterr().out


# -- the published rules, in words a student can implement from ----------------------------------------


def _from_words(source: str | None = None) -> PythonImplementation:
    """tests/reference/course_from_words.py (written from PUBLISHED_SCHEDULE alone), or a variant's source."""
    namespace: dict[str, Any] = {}
    exec(compile(source or FROM_WORDS.read_text(encoding="utf-8"), str(FROM_WORDS), "exec"), namespace)
    return PythonImplementation("course_from_words", namespace["simulate"], "tests/reference")


def test_the_rules_are_in_the_docs_and_cbatch_clauses_word_for_word(capsys: pytest.CaptureFixture) -> None:
    docs = " ".join((ROOT / "docs" / "contract.md").read_text(encoding="utf-8").split())
    assert cbatch_main(["clauses"]) == 0
    printed = capsys.readouterr().out
    for n, rule in enumerate(PUBLISHED_SCHEDULE, 1):
        assert f"{n}. {rule}" in docs, f"docs/contract.md lacks rule {n}: {rule}"
        assert f"  {n}. {rule}\n" in printed, f"cbatch clauses lacks rule {n}"
    assert "rows, not dispatches" in PUBLISHED_SCHEDULE[5]


def test_an_implementation_written_from_the_rules_alone_passes_every_fixed_workload() -> None:
    judge = Judge(_from_words())
    statuses = {label: judge.judge(CID, list(w.trace), w.config) for label, w in WORKLOADS.items()}
    failed = {label: [str(v) for v in r.violations] for label, r in statuses.items() if r.status == "fail"}
    assert not failed, failed
    assert sum(r.status == "pass" for r in statuses.values()) >= 25


def test_an_implementation_written_from_the_rules_alone_passes_generated_workloads() -> None:
    judge = Judge(_from_words())

    @settings(max_examples=60, derandomize=True, database=None, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(strategies.workloads())
    def agree(workload: tuple[list[dict[str, Any]], dict[str, Any]]) -> None:
        result = judge.judge(CID, *workload)
        assert result.status != "fail", ([str(v) for v in result.violations], *workload)

    agree()


@pytest.mark.parametrize("label, parting", [
    ("budget_1", "the schedules part at dispatch 4, t=3, row 1 of the course's dispatch: the course's simulator "
                 "feeds c prefill 1, this report b prefill 1"),
    ("chunk_boundaries", "the schedules part at dispatch 2, t=1, row 2 of the course's dispatch: the course's "
                         "simulator feeds p9 prefill 3, this report p4 prefill 2"),
    ("wide_batch", "the schedules part at dispatch 2, t=1, row 1 of the course's dispatch: the course's simulator "
                   "feeds w8 prefill 1, this report w4 prefill 1"),
])
def test_without_the_rotation_it_fails_naming_the_parting_dispatch(label: str, parting: str) -> None:
    """Rule 6 left out (the rows never rotate): the first message names the first dispatch that differs and
    shows both schedules from there, a tick a line."""
    source = FROM_WORDS.read_text(encoding="utf-8")
    assert WORDS_ROTATION in source
    workload = WORKLOADS[label]
    result = Judge(_from_words(source.replace(WORDS_ROTATION, ""))).judge(CID, list(workload.trace),
                                                                          workload.config)
    assert result.status == "fail"
    first = result.violations[0]
    assert first.message.startswith(parting), first.message
    table = first.message.split("\n")[1:]
    assert table[0].split() == ["tick", "the", "course's", "simulator", "|", "this", "report"], table
    assert table[1].lstrip().startswith("≠ t="), table   # the parting tick, both dispatches on one line
    ours, theirs = table[1].split(" | ")
    assert parting.split("feeds ")[1].split(",")[0] in ours and parting.rsplit("this report ", 1)[1] in theirs
    assert first.time == int(parting.split("t=")[1].split(",")[0]) and first.event_index is not None
    assert [v for v in result.violations[1:] if "the schedules part" in v.message] == []


def test_the_failure_picture_shows_both_schedules_from_the_parting_dispatch(tmp_path: Path) -> None:
    workload = WORKLOADS["chunk_boundaries"]
    result = Judge(resolve_impl(str(rotation_bug(tmp_path)))).judge(CID, list(workload.trace), workload.config)
    page = failure_page(spec="rotation", clause=CID, workload="chunk_boundaries", violations=result.violations,
                        trace=list(workload.trace), report=result.report, replay="cbatch check ...")
    assert '<table class="schedules"' in page and "<th" in page and "the course&#x27;s simulator" in page
    assert page.count('class="parts"') == sum(not same for *_, same in result.violations[0].schedules) >= 1
    first_row = page.split('class="parts"', 1)[1].split("</tr>", 1)[0]
    assert "t=1" in first_row and "p9 prefill 3" in first_row and "p5 prefill 3" in first_row
    box = page.split('<table class="schedules"', 1)[0]
    assert "side by side:" in box and "| this report" not in box   # the box shows its first line, the table the rest


# -- exact implementations pass, with their freedoms --------------------------------------------------


@pytest.mark.parametrize("name", sorted(EXACT))
def test_exact_implementations_pass_on_every_fixed_workload(name: str) -> None:
    judge = Judge(EXACT[name]())
    statuses = {}
    for label, w in WORKLOADS.items():
        result = judge.judge(CID, list(w.trace), w.config)
        assert result.status != "fail", (label, [str(v) for v in result.violations])
        statuses[label] = result.status
    judged = [label for label, status in statuses.items() if status == "pass"]
    assert len(judged) >= 25, statuses   # only the optimistic-admission workloads are left out


@pytest.mark.parametrize("name", ["published_model", "course_example"])
def test_exact_implementations_pass_on_generated_workloads(name: str) -> None:
    judge = Judge(EXACT[name]())

    @settings(max_examples=60, derandomize=True, database=None, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(strategies.workloads())
    def agree(workload: tuple[list[dict[str, Any]], dict[str, Any]]) -> None:
        trace, config = workload
        for cid in (*ALL_CLAUSES, CID):
            if cid != "invalid_input_refused":
                result = judge.judge(cid, trace, config)
                assert result.status != "fail", (cid, [str(v) for v in result.violations], trace, config)

    agree()


def test_the_course_example_takes_the_freedoms_the_other_way() -> None:
    """An impossible request rejected at arrival (the published simulator cancels it first here), no
    release for a request that holds no pages, the drain at the last release before a late cancel."""
    trace = [{"time": 0, "event": "arrival", "id": "a", "prompt_tokens": 4, "output_tokens": 4},
             {"time": 0, "event": "arrival", "id": "x", "prompt_tokens": 40, "output_tokens": 4},
             {"time": 0, "event": "arrival", "id": "idle", "prompt_tokens": 2, "output_tokens": 2},
             {"time": 0, "event": "cancel", "id": "idle"},
             {"time": 2, "event": "cancel", "id": "x"},
             {"time": 20, "event": "cancel", "id": "a"}]
    config = {**BASE_CONFIG, "max_active": 1}
    published, ours = simulate(trace, **config), _load(COURSE_EXAMPLE).simulate(trace, **config)
    assert published["requests"]["x"]["status"] == "cancelled" and ours["requests"]["x"]["status"] == "rejected"
    assert (published["summary"]["drained_at_tick"], ours["summary"]["drained_at_tick"]) == (20, 6)
    assert check_report(ours, trace, config, opt_in=[CID]) == []


def test_a_release_for_a_request_holding_no_pages_is_free() -> None:
    """Admitted, then cancelled before its first row (a decoding request takes the whole budget): the
    published simulator emits a release for it; a scheduler that does not still passes."""
    trace = [{"time": 0, "event": "arrival", "id": "a", "prompt_tokens": 1, "output_tokens": 6},
             {"time": 0, "event": "arrival", "id": "b", "prompt_tokens": 4, "output_tokens": 2},
             {"time": 3, "event": "cancel", "id": "b"}]
    config = {**BASE_CONFIG, "token_budget": 1}
    report = simulate(trace, **config)
    assert not [row for ev in report["events"] for row in ev.get("work", ()) if row["id"] == "b"]
    assert [ev["id"] for ev in report["events"] if ev["event"] == "release"] == ["b", "a"]
    without = {**report, "events": [ev for ev in report["events"]
                                    if not (ev["event"] == "release" and ev["id"] == "b")]}
    assert check_report(without, trace, config, opt_in=[CID]) == []


@pytest.mark.parametrize("drained, ok", [(8, True), (10, True), (7, False), (11, False)])
def test_the_drain_tick_lies_between_the_last_release_of_pages_and_the_published_drain(drained: int,
                                                                                     ok: bool) -> None:
    trace = [*demo_trace(), {"time": 10, "event": "cancel", "id": "short"}]
    report = simulate(trace)
    assert report["summary"]["drained_at_tick"] == 10   # the late cancel_ignored; long's release is at 7 + 1
    report["summary"]["drained_at_tick"] = drained
    found = check_report(report, trace, BASE_CONFIG, clauses=[CID])
    assert (found == []) == ok, found


@pytest.mark.parametrize("example", ["engine_scheduler.py", "sjf_scheduler.py"])
def test_an_engine_policy_fails_by_design(example: str) -> None:
    """Correct schedulers whose policy differs from the course's (no rotation; shortest job first)."""
    judge = Judge(resolve_impl(str(ROOT / "examples" / example)))
    failed = [label for label, w in WORKLOADS.items()
              if judge.judge(CID, list(w.trace), w.config).status == "fail"]
    assert failed


def test_optimistic_admission_is_out_of_its_scope() -> None:
    workload = next(w for w in WORKLOADS.values() if w.config.get("admission") == "optimistic")
    result = course_verdict(resolve_impl(str(REFERENCE)), list(workload.trace), workload.config)
    assert result.status == "skip" and "reserve admission only" in result.reason


def test_a_report_cannot_claim_its_way_out_of_the_comparison(tmp_path: Path) -> None:
    """The settings compared are the ones the run asked for, not the ones the report claims."""
    bug = _load(rotation_bug(tmp_path))
    report = bug.simulate(demo_trace())
    report["config"]["admission"] = "optimistic"
    found = check_report(report, demo_trace(), BASE_CONFIG, clauses=[CID])
    assert any("dispatches" in v.message for v in found)


# -- off by default, on when asked -------------------------------------------------------------------


def test_it_is_off_by_default(tmp_path: Path) -> None:
    bug = _load(rotation_bug(tmp_path)).simulate(demo_trace())
    assert CID not in ALL_CLAUSES and CID not in clause_ids() and CID in clause_ids([CID])
    assert check_report(bug, demo_trace(), BASE_CONFIG) == []
    assert {v.clause for v in check_report(bug, demo_trace(), BASE_CONFIG, opt_in=[CID])} == {CID}


def test_a_rubric_with_course_grades_it(tmp_path: Path) -> None:
    rubric_file = tmp_path / "rubric.toml"
    rubric_file.write_text('[grading]\ngenerated_examples = 0\nparts = ["scheduler"]\ncourse = true\n'
                           '[tests]\n"contract.*" = { points = 1 }\n', encoding="utf-8")
    rubric = load_rubric(rubric_file)
    assert f"contract.{CID}" in rubric_tests(rubric)
    assert f"contract.{CID}" not in rubric_tests(load_rubric(None))
    plan: Plan = build_plan(rubric)
    bug = resolve_impl(str(rotation_bug(tmp_path)))
    result = grade_implementation(bug, "rotation", rubric, plan, tmp_path)
    failed = [t.name for t in result.tests if not t.passed]
    assert failed == [f"contract.{CID}"]
    assert result.score == result.max_score - 1
    bad = tmp_path / "bad.toml"
    bad.write_text('[grading]\ncourse = "yes"\n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"\[grading\]\.course must be a boolean"):
        load_rubric(bad)


def test_the_plugin_judges_it_with_the_ini_key_or_the_option(pytester: pytest.Pytester, tmp_path: Path) -> None:
    """Off by default: test_plugin's counts of the demo's checks leave it out."""
    bug = rotation_bug(tmp_path)
    others = [f"--ignore={p}" for p in (ROOT / "pytest_cbatch" / "suite").glob("test_*.py")
              if p.name != "test_contract.py"]
    pytester.makeini("[pytest]\ncbatch_course = true\n")
    on = pytester.runpytest_subprocess(f"--cbatch-impl={bug}", "-k", "course_results and demo and not serial",
                                       *others)
    on.assert_outcomes(failed=1)
    assert "ttft_ticks: the course's simulator gives 4, this report 5" in on.stdout.str()   # long, shrunk demo
    assert "--clause course_results" in on.stdout.str()   # the replay command judges it too
    pytester.makeini("[pytest]\n")
    passed = pytester.runpytest_subprocess(f"--cbatch-impl={REFERENCE}", "--cbatch-course", "-k", "course_results",
                                           *others)
    outcomes = passed.parseoutcomes()
    assert outcomes.get("passed", 0) >= 25 and not outcomes.get("failed"), passed.stdout.str()


def test_the_published_file_runs_standalone_with_the_course_numbers(tmp_path: Path) -> None:
    out = tmp_path / "continuous.json"
    done = subprocess.run([sys.executable, str(REFERENCE), "--output", str(out)], capture_output=True, text=True,
                          check=True)
    assert "7 dispatches, 19 input tokens" in done.stdout



def test_a_huge_reported_value_is_cut_short_in_the_message() -> None:
    report = simulate(demo_trace())
    report["requests"]["long"]["itl_ticks"] = [1] * 100_000
    found = check_report(report, demo_trace(), BASE_CONFIG, clauses=[CID])
    assert len(found) == 1 and "itl_ticks" in found[0].message and len(found[0].message) < 300
