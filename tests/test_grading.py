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

from pytest_cbatch.grading.driver import main as grade_main
from pytest_cbatch.grading.rubric import load_rubric
from pytest_cbatch.lifecycle import LIFECYCLE_CLAUSES
from pytest_cbatch.runner import ALL_CLAUSES
from pytest_cbatch.schemas import schema_issues

RUBRIC = EXAMPLE_DIR / "rubric.toml"
CONTRACT = [f"contract.{c}" for c in ALL_CLAUSES]
# examples/grading/rubric.toml: completes 4, invalid_input_refused 2, other clauses 1, lifecycle clauses 1.
FULL = 4 + 2 + (len(CONTRACT) - 2) + len(LIFECYCLE_CLAUSES)
EXPECTED_FAILURES = {
    "correct": set(),
    "deletes_files": set(),
    "buggy_ttft": {"contract.ttft_null_on_cancel"},
    "buggy_itl": {"contract.itl_empty_for_one_token"},
    "loops_forever": set(CONTRACT),
    "calls_os_exit": set(CONTRACT),
    "prints_50mb": set(CONTRACT),
}
HIDDEN_NAME = "crowded_cancels"


@pytest.fixture(scope="module")
def graded(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, float, int]:
    root = tmp_path_factory.mktemp("grading")
    samples = root / "submissions"
    make_samples(samples)
    pristine = root / "pristine"
    make_samples(pristine)
    start = time.monotonic()
    code = grade_main([str(samples), "--out", str(root / "out"), "--rubric", str(RUBRIC), "--jobs", "2", "--quiet"])
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
    # No sample came near its cap: the hostile ones cost max_failures x call_seconds of waiting at most.
    limits = load_rubric(RUBRIC).limits
    for name in EXPECTED_FAILURES:
        assert results(out, name)["execution_time"] < limits.submission_seconds / 2, name


def test_every_results_json_validates_and_states_the_seed(graded) -> None:
    _samples, out, _seconds, _code = graded
    for name in EXPECTED_FAILURES:
        doc = results(out, name)
        assert schema_issues(doc, "gradescope-results") == [], name
        assert "fixed seed 20240901" in doc["output"] and doc["extra_data"]["cbatch"]["seed"] == 20240901
        assert len(doc["tests"]) == len(CONTRACT) + len(LIFECYCLE_CLAUSES)
    broken = dict(results(out, "buggy_ttft"), score=-1)
    assert schema_issues(broken, "gradescope-results")


def test_hostile_samples_fail_with_a_clear_message(graded) -> None:
    _samples, out, _seconds, _code = graded
    words = {"loops_forever": "did not answer within 5 s", "calls_os_exit": "exited with status 3",
             "prints_50mb": "printed more than 256 KiB"}
    for name, text in words.items():
        completes = next(t for t in results(out, name)["tests"] if t["name"] == "contract.completes")
        assert text in completes["output"], (name, completes["output"][:500])
        lifecycle = [t for t in results(out, name)["tests"] if t["name"].startswith("lifecycle.")]
        assert all(t["score"] == t["max_score"] for t in lifecycle), name


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
    done = subprocess.run(argv, cwd=student, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and "ttft_null_on_cancel" in done.stdout, done.stdout + done.stderr


def test_hidden_workloads_count_but_stay_out_of_student_output(graded) -> None:
    _samples, out, _seconds, _code = graded
    doc = results(out, "buggy_itl")
    test = next(t for t in doc["tests"] if t["name"] == "contract.itl_empty_for_one_token")
    assert "1 hidden workload(s), details withheld" in test["output"]
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
    rubric.write_text('[grading]\ngenerated_examples = 0\nlifecycle_examples = 1\nnumerics = "off"\n'
                      '[tests]\n"contract.*" = { points = 1 }\n', encoding="utf-8")
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
    assert "unknown key(s) call_second" in capsys.readouterr().err
    assert load_rubric(None).rule_for("lifecycle.append_atomic").points == 1
