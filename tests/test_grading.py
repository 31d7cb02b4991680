"""`cbatch grade` on the sample submissions of examples/grading: exact scores, valid results, isolation."""

from __future__ import annotations

import csv
import filecmp
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from grading_samples import EXAMPLE_DIR, OVERLAYS, make_samples

import pytest_cbatch.reference.scheduler_sim as reference_sim
from pytest_cbatch.breaker import short_seconds
from pytest_cbatch.grading.driver import main as grade_main
from pytest_cbatch.grading.driver import sandbox_mode
from pytest_cbatch.grading.evaluate import Submission, grade_submission, rubric_tests
from pytest_cbatch.grading.plan import build_plan
from pytest_cbatch.grading.rubric import Rubric, load_rubric
from pytest_cbatch.lifecycle import LIFECYCLE_CLAUSES
from pytest_cbatch.runner import ALL_CLAUSES
from pytest_cbatch.sandbox import Limits, LoadSpec
from pytest_cbatch.schemas import schema_issues

RUBRIC = EXAMPLE_DIR / "rubric.toml"
CONTRACT = [f"contract.{c}" for c in ALL_CLAUSES]
HIDDEN = "hidden.workloads"
# examples/grading/rubric.toml: completes 4, invalid_input_refused 2, other clauses 1, lifecycle clauses 1,
# the hidden workloads 4 (one test: the student learns only whether every clause held on all of them).
FULL = 4 + 2 + (len(CONTRACT) - 2) + len(LIFECYCLE_CLAUSES) + 4
EXPECTED_FAILURES = {
    "correct": set(),
    "deletes_files": set(),
    "buggy_ttft": {"contract.ttft_null_on_cancel", HIDDEN},
    "buggy_itl": {"contract.itl_empty_for_one_token", HIDDEN},
    "loops_forever": {*CONTRACT, HIDDEN},
    "calls_os_exit": {*CONTRACT, HIDDEN},
    "prints_50mb": {*CONTRACT, HIDDEN},
}
HIDDEN_NAME = "crowded_cancels"
# The example rubric with a 5 s call limit instead of 15 s and a breaker at the first failed call instead of
# the second: an honest call takes well under a second even loaded, and the submission that loops forever
# costs max_failures timeouts of a spinning core on the visible workloads and as many on the hidden ones,
# then the breaker's short limit (1 s) on each further call.
# (The breaker's count of failures in a row: tests/test_sandbox.py.)
CALL_SECONDS = 5
MAX_FAILURES = 1


@pytest.fixture(scope="module")
def graded(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, float, int]:
    root = tmp_path_factory.mktemp("grading")
    samples = root / "submissions"
    make_samples(samples)
    pristine = root / "pristine"
    make_samples(pristine)
    rubric = root / "rubric.toml"
    text = RUBRIC.read_text(encoding="utf-8")
    assert "call_seconds = 15 " in text and "max_failures = 2 " in text
    text = text.replace("call_seconds = 15 ", f"call_seconds = {CALL_SECONDS} ")
    rubric.write_text(text.replace("max_failures = 2 ", f"max_failures = {MAX_FAILURES} "), encoding="utf-8")
    start = time.monotonic()
    code = grade_main([str(samples), "--out", str(root / "out"), "--rubric", str(rubric),
                       "--traces", str(EXAMPLE_DIR / "hidden"), "--jobs", "2", "--quiet"])
    return samples, root / "out", time.monotonic() - start, code


def results(out: Path, name: str) -> dict:
    return json.loads((out / name / "results.json").read_text(encoding="utf-8"))


def test_every_sample_gets_its_exact_score(graded) -> None:
    _samples, out, seconds, code = graded
    assert code == 0
    assert set(EXPECTED_FAILURES) == set(OVERLAYS)
    for name, failing in EXPECTED_FAILURES.items():
        doc = results(out, name)
        failed = {t["name"] for t in doc["tests"] if t["score"] < t["max_score"]}
        assert failed == failing, (name, failed ^ failing)
        lost = sum(t["max_score"] for t in doc["tests"] if t["name"] in failing)
        assert doc["score"] == FULL - lost, name
        assert doc["extra_data"]["cbatch"]["max_score"] == FULL
    # No sample ran into its cap: the hostile ones stop at the breaker (max_failures failed calls in a row).
    for name in EXPECTED_FAILURES:
        assert "limit submission_seconds" not in json.dumps(results(out, name)), name


def test_every_results_json_validates_and_states_the_seed(graded) -> None:
    _samples, out, _seconds, _code = graded
    for name in EXPECTED_FAILURES:
        doc = results(out, name)
        assert schema_issues(doc, "gradescope-results") == [], name
        assert "fixed seed 20240901" in doc["output"] and doc["extra_data"]["cbatch"]["seed"] == 20240901
        assert [t["name"] for t in doc["tests"]] == [*CONTRACT, HIDDEN, *LIFECYCLE_CLAUSES]
    broken = dict(results(out, "buggy_ttft"), score=-1)
    assert schema_issues(broken, "gradescope-results")


def test_hostile_samples_fail_with_a_clear_message(graded) -> None:
    _samples, out, _seconds, _code = graded
    words = {"loops_forever": f"did not answer within {CALL_SECONDS} s", "calls_os_exit": "exited with status 3",
             "prints_50mb": "printed more than 256 KiB"}
    for name, text in words.items():
        completes = next(t for t in results(out, name)["tests"] if t["name"] == "contract.completes")
        assert text in completes["output"], (name, completes["output"][:500])
        lifecycle = [t for t in results(out, name)["tests"] if t["name"].startswith("lifecycle.")]
        assert all(t["score"] == t["max_score"] for t in lifecycle), name
    refusal = next(t for t in results(out, "loops_forever")["tests"] if t["name"] == "contract.invalid_input_refused")
    output = refusal["output"]
    # It was still run on every invalid input, at the breaker's short limit after its run of timeouts.
    short = f"did not answer within {short_seconds(CALL_SECONDS):g} s"
    assert short in output and "short limit" in output and "not JSON" not in output, output


def test_a_failure_explains_itself_and_replays_from_the_students_folder(graded) -> None:
    samples, out, _seconds, _code = graded
    test = next(t for t in results(out, "buggy_ttft")["tests"] if t["name"] == "contract.ttft_null_on_cancel")
    assert "expected ttft_ticks null" in test["output"] and "shrunk from" in test["output"]
    replay = next(line.strip() for line in test["output"].splitlines() if line.strip().startswith("cbatch check"))
    trace_name = replay.split("--trace ")[1].split()[0]
    student = samples.parent / "replay"
    shutil.copytree(samples / "buggy_ttft", student)
    (student / trace_name).write_bytes((out / "buggy_ttft" / trace_name).read_bytes())
    argv = [sys.executable, "-m", "pytest_cbatch.cli", *replay.split()[1:]]
    done = subprocess.run(argv, cwd=student, capture_output=True, text=True, timeout=600)
    assert done.returncode == 1 and "ttft_null_on_cancel" in done.stdout, done.stdout + done.stderr


def test_hidden_workloads_count_but_stay_out_of_student_output(graded) -> None:
    _samples, out, _seconds, _code = graded
    doc = results(out, "buggy_itl")
    test = next(t for t in doc["tests"] if t["name"] == "contract.itl_empty_for_one_token")
    assert "hidden" not in test["output"]  # no clause's test says anything of the hidden workloads
    assert all("hidden" not in t["output"] for t in doc["tests"] if t["name"] != HIDDEN)
    hidden = next(t for t in doc["tests"] if t["name"] == HIDDEN)
    assert hidden["status"] == "failed" and "withheld" in hidden["output"]
    assert next(t for t in results(out, "correct")["tests"] if t["name"] == HIDDEN)["status"] == "passed"
    assert HIDDEN_NAME not in json.dumps(doc) and '"h4"' not in json.dumps(doc)
    assert HIDDEN_NAME in (out / "buggy_itl" / "hidden-failures.txt").read_text(encoding="utf-8")
    assert not list((out / "buggy_itl").glob(f"*{HIDDEN_NAME}*"))


def test_submissions_and_other_results_are_untouched(graded) -> None:
    samples, out, _seconds, _code = graded
    pristine = samples.parent / "pristine"
    for name in EXPECTED_FAILURES:
        compared = filecmp.dircmp(samples / name, pristine / name)
        assert not compared.diff_files and not compared.left_only and not compared.right_only, name
    rows = list(csv.DictReader((out / "summary.csv").open(encoding="utf-8")))
    assert {r["submission"] for r in rows} == set(EXPECTED_FAILURES)
    assert {r["submission"]: float(r["score"]) for r in rows}["correct"] == FULL
    assert all(r["contract.completes"] in ("0", "4") for r in rows)


def test_gradescope_mode_and_a_rerun_reuse_nothing_stale(tmp_path: Path) -> None:
    rubric = tmp_path / "rubric.toml"
    rubric.write_text('[grading]\ngenerated_examples = 0\nparts = ["scheduler"]\n'
                      '[limits]\ncall_seconds = 120\n[tests]\n"contract.*" = { points = 1 }\n', encoding="utf-8")
    make_samples(tmp_path, only=("buggy_itl",))
    (tmp_path / "buggy_itl").rename(tmp_path / "submission")
    argv = ["--gradescope", "--gradescope-root", str(tmp_path), "--rubric", str(rubric)]
    assert grade_main(argv) == 0
    first = json.loads((tmp_path / "results" / "results.json").read_text(encoding="utf-8"))
    assert first["score"] == len(CONTRACT) - 1 and schema_issues(first, "gradescope-results") == []
    make_samples(tmp_path, only=("correct",))
    for path in (tmp_path / "correct").iterdir():
        path.replace(tmp_path / "submission" / path.name)
    assert grade_main(argv) == 0
    second = json.loads((tmp_path / "results" / "results.json").read_text(encoding="utf-8"))
    assert second["score"] == len(CONTRACT)
    assert not list((tmp_path / "results" / "_grading").glob("*.jsonl"))  # the old failing trace is gone


def test_bad_rubrics_are_usage_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rubric = tmp_path / "rubric.toml"
    rubric.write_text('[tests]\n"contract.*" = { points = 1, visibility = "sometimes" }\n', encoding="utf-8")
    assert grade_main([str(tmp_path), "--out", str(tmp_path / "out"), "--rubric", str(rubric)]) == 2
    assert "visibility must be one of visible, after_due_date, hidden, after_published" in capsys.readouterr().err
    rubric.write_text("[limits]\ncall_second = 3\n", encoding="utf-8")
    assert grade_main([str(tmp_path), "--out", str(tmp_path / "out"), "--rubric", str(rubric)]) == 2
    assert "[limits] unknown key 'call_second' (did you mean 'call_seconds'?" in capsys.readouterr().err
    for table, words in (("[grading]\ngenerated_exampels = 3", "[grading] unknown key 'generated_exampels' (did you "
                                                                "mean 'generated_examples'?"),
                         ("[limit]\ncall_seconds = 3", "unknown table 'limit' (did you mean 'limits'?"),
                         ("[limits]\ncall_seconds = nan", "[limits].call_seconds: must be a positive, finite number"),
                         ("[limits]\nsubmission_seconds = inf", "[limits].submission_seconds: must be a positive, "
                                                                 "finite"),
                         ("[limits]\ncall_seconds = -1", "[limits].call_seconds: must be a positive number")):
        rubric.write_text(table + "\n", encoding="utf-8")
        assert grade_main([str(tmp_path), "--out", str(tmp_path / "out"), "--rubric", str(rubric)]) == 2
        assert words in capsys.readouterr().err, table
    for grading, words in (('parts = ["scheduler", "gpu"]', "[grading].parts must name one or more of scheduler, "
                            "lifecycle, numerics"), ('parts = []', "[grading].parts must name one or more"),
                           ('sandbox = "docker"', "[grading].sandbox must be one of auto, bwrap, process")):
        rubric.write_text(f"[grading]\n{grading}\n", encoding="utf-8")
        assert grade_main([str(tmp_path), "--out", str(tmp_path / "out"), "--rubric", str(rubric)]) == 2
        assert words in capsys.readouterr().err, grading
    assert load_rubric(None).rule_for("lifecycle.append_atomic").points == 1


# ------------------------------------------------------------- one total per run


def _tiny_rubric(tmp_path: Path, grading: str = "", numerics: str = "off") -> Rubric:
    path = tmp_path / "tiny.toml"
    path.write_text(f'[grading]\ngenerated_examples = 0\nlifecycle_examples = 4\nnumerics = "{numerics}"\n' + grading
                    + '[limits]\ncall_seconds = 120\n[tests]\n"contract.*" = { points = 2 }\n"lifecycle.*" = { points = 1 }\n'
                      '"numerics.*" = { points = 1 }\n', encoding="utf-8")
    return load_rubric(path)


def _grade_file(tmp_path: Path, name: str, body: str, rubric: Rubric):
    folder = tmp_path / name
    folder.mkdir()
    (folder / f"{name}.py").write_text(body, encoding="utf-8")
    submission = Submission(name, str(folder / f"{name}.py"), LoadSpec(str(folder / f"{name}.py"), (f"{name}.py",)))
    out = tmp_path / f"out-{name}"
    out.mkdir()
    return grade_submission(submission, rubric, build_plan(rubric), out)


# A single-file scheduler (only simulate): the reference's file with its lifecycle class made private.
SOLO = Path(reference_sim.__file__).read_text(encoding="utf-8").replace("PagedKV", "_PagedKV")


def test_a_single_file_scheduler_is_told_which_file_it_lacks_and_what_it_costs(tmp_path: Path) -> None:
    rubric = _tiny_rubric(tmp_path)
    result = _grade_file(tmp_path, "solo", SOLO, rubric)
    assert [t.name for t in result.tests] == rubric_tests(rubric)
    lifecycle = [t for t in result.tests if t.name.startswith("lifecycle.")]
    assert lifecycle and not any(t.passed for t in lifecycle)
    for test in lifecycle:
        assert test.output.startswith("not judged: this submission has no PagedKV (the published layout defines "
                                      "it in scheduler_sim.py)"), test.output
        assert "not judged: not judged" not in test.output and test.output.endswith("(0 of 1 points)")
        assert 'parts = ["scheduler"]' in test.output
    assert result.score == 2 * len(CONTRACT) and result.max_score == 2 * len(CONTRACT) + len(LIFECYCLE_CLAUSES)


def test_a_rubric_without_the_lifecycle_part_scores_a_single_file_scheduler_in_full(tmp_path: Path) -> None:
    rubric = _tiny_rubric(tmp_path, 'parts = ["scheduler"]\n')
    result = _grade_file(tmp_path, "solo", SOLO, rubric)
    assert [t.name for t in result.tests] == CONTRACT
    assert result.score == result.max_score == 2 * len(CONTRACT)


def test_a_rubric_without_a_tests_table_gives_the_default_points(tmp_path: Path) -> None:
    """docs/any-language.md's rubric (parts and no [tests]) scores like the default, never 0 / 0; a [tests]
    table that gives no test any points is refused."""
    path = tmp_path / "program.toml"
    path.write_text('[grading]\nparts = ["scheduler"]\n', encoding="utf-8")
    rubric = load_rubric(path)
    assert rubric.rule_for("contract.completes").points == 2 and rubric.rule_for("lifecycle.key_fresh").points == 1
    path.write_text('[grading]\nparts = ["scheduler"]\n[tests]\n"contract.*" = { points = 0 }\n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"\[tests\] gives no test any points, so every score would be 0 / 0"):
        load_rubric(path)


def test_a_grade_worth_no_points_does_not_say_every_test_passed(tmp_path: Path) -> None:
    path = tmp_path / "elsewhere.toml"
    path.write_text('[grading]\ngenerated_examples = 0\nparts = ["scheduler"]\n[limits]\ncall_seconds = 120\n'
                    '[tests]\n"lifecycle.*" = { points = 1 }\n', encoding="utf-8")
    result = _grade_file(tmp_path, "solo", SOLO, load_rubric(path))
    assert result.max_score == 0 and "every test passed" not in result.output
    assert "score 0 / 0; no test here is worth any points (see the rubric's [tests] table)" in result.output


def test_a_crash_keeps_every_test_in_the_total(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    rubric = _tiny_rubric(tmp_path, 'numerics_workloads = ["demo"]\n', numerics="auto")
    names = rubric_tests(rubric)
    assert any(n.startswith("numerics.") for n in names)
    crash = _grade_file(tmp_path, "crash", "def simulate(events, **config):\n    raise KeyError('prompt')\n", rubric)
    unloadable = _grade_file(tmp_path, "unloadable", "def simulate(:\n", rubric)
    for result in (crash, unloadable):
        assert [t.name for t in result.tests] == names, result.name
        assert result.max_score == sum(rubric.rule_for(n).points for n in names)
    assert not any(t.passed for t in unloadable.tests)
    assert {t.name for t in crash.tests if t.passed} == {"contract.invalid_input_refused"}  # raising is refusing
    numeric = [t for t in crash.tests if t.name.startswith("numerics.")]
    assert all("demo: no report (KeyError: 'prompt')" in t.output for t in numeric), numeric[0].output
    assert all("SyntaxError" in t.output and "(0 of" in t.output for t in unloadable.tests)


def test_a_grader_failure_keeps_every_test_in_the_total(tmp_path: Path, monkeypatch) -> None:
    import pytest_cbatch.grading.driver as driver

    def broken(*args, **kwargs):
        raise RuntimeError("grader bug")

    monkeypatch.setattr(driver, "grade_submission", broken)
    rubric = _tiny_rubric(tmp_path)
    sub = Submission("x", str(tmp_path), LoadSpec(str(tmp_path), ()))
    result = driver._grade_one(sub, rubric, build_plan(rubric), tmp_path / "out", "process")
    assert [t.name for t in result.tests] == rubric_tests(rubric) and result.extra["grader_error"]
    assert result.max_score == 2 * len(CONTRACT) + len(LIFECYCLE_CLAUSES) and result.score == 0
    assert "the grader failed on this submission (RuntimeError: grader bug)" in result.tests[0].output


# ------------------------------------------------------------------ sandbox mode


def test_without_bubblewrap_grading_says_what_is_not_contained(tmp_path: Path, monkeypatch, capsys) -> None:
    import pytest_cbatch.sandbox.process as process
    from pytest_cbatch.sandbox import NotContained, Sandbox, bwrap_problem, resolve_mode

    monkeypatch.setenv("PATH", str(tmp_path / "nothing-here"))
    monkeypatch.setattr(process, "_warned", [])
    bwrap_problem.cache_clear()
    try:
        mode, notice = resolve_mode("auto")
        assert mode == "process"
        for words in ("NOT contained", "bubblewrap (bwrap) is not installed", "hidden traces",
                      "/proc/<grader pid>/environ", "network", "apt-get install bubblewrap", "docker run --network none"):
            assert words in notice, words
        with pytest.raises(ValueError, match="apt-get install bubblewrap"):
            resolve_mode("bwrap")
        with pytest.warns(NotContained, match="NOT contained"):
            Sandbox(LoadSpec(), Limits(), mode="auto")
        assert sandbox_mode(None, load_rubric(None)) == "process"
        assert "NOT contained: bubblewrap (bwrap) is not installed" in capsys.readouterr().err
        argv = [str(tmp_path), "--out", str(tmp_path / "out"), "--sandbox", "bwrap"]
        (tmp_path / "sub.py").write_text(SOLO, encoding="utf-8")
        assert grade_main(argv) == 2
        assert "sandbox = bwrap is required, but bubblewrap (bwrap) is not installed" in capsys.readouterr().err
    finally:
        bwrap_problem.cache_clear()


def test_a_rubric_that_requires_bubblewrap_cannot_be_relaxed(tmp_path: Path, capsys) -> None:
    rubric = tmp_path / "rubric.toml"
    rubric.write_text('[grading]\nsandbox = "bwrap"\n', encoding="utf-8")
    (tmp_path / "sub.py").write_text(SOLO, encoding="utf-8")
    argv = [str(tmp_path), "--out", str(tmp_path / "out"), "--rubric", str(rubric), "--sandbox", "process"]
    assert grade_main(argv) == 2
    assert 'requires sandbox = "bwrap"; --sandbox=process cannot relax it' in capsys.readouterr().err
