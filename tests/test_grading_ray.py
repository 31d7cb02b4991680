"""`cbatch grade --ray`: the verdicts of one machine, of a real two-node Ray cluster (a worker killed mid-run) and
of shards merged are the same; a worker that cannot grade as required is refused; what a task returns is checked.

The cluster test starts `ray start` processes in a network namespace of loopback only (tests/ray_cluster.py); it
needs ray (pip install 'pytest-cbatch[ray]') and root, and runs with --run-slow (.ci/run has a step for it).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from class_grading import MIX, SMALL_RUBRIC, make_class, verdicts, write_rubric
from ray_cluster import namespace_problem, run_on_cluster

import pytest_cbatch.reference as reference
from pytest_cbatch.grading.bundle import pack
from pytest_cbatch.grading.driver import _grade_one, discover, grade_all
from pytest_cbatch.grading.driver import main as grade_main
from pytest_cbatch.grading.plan import build_plan
from pytest_cbatch.grading.ray_runner import (GRADER_MEMORY_MB, Returned, WorkerRefused, check_feasible,
                                              grade_remote, place, task_resources)
from pytest_cbatch.grading.rubric import load_rubric
from pytest_cbatch.grading.shards import kit_version
from pytest_cbatch.sandbox import bwrap_problem

SOLO_RUBRIC = """\
[grading]
generated_examples = 0
parts = ["scheduler"]
numerics = "off"
sandbox = "bwrap"
[limits]
memory_mb = 1024
[tests]
"contract.*" = { points = 1 }
"""


@pytest.fixture(scope="module")
def solo(tmp_path_factory: pytest.TempPathFactory):
    """A one-file correct submission, packed, and a scheduler-only rubric requiring bubblewrap."""
    tmp_path = tmp_path_factory.mktemp("solo")
    (tmp_path / "subs").mkdir()
    shutil.copyfile(Path(reference.__file__).with_name("scheduler_sim.py"), tmp_path / "subs" / "solo.py")
    (sub,) = discover(tmp_path / "subs")
    path = tmp_path / "rubric.toml"
    path.write_text(SOLO_RUBRIC, encoding="utf-8")
    rubric = load_rubric(path)
    return sub, pack(sub), rubric, build_plan(rubric)


def test_a_worker_without_bubblewrap_is_refused_when_the_rubric_requires_it(solo, tmp_path, monkeypatch) -> None:
    _sub, bundle, rubric, plan = solo
    monkeypatch.setenv("PATH", str(tmp_path / "nothing-here"))
    bwrap_problem.cache_clear()
    try:
        with pytest.raises(WorkerRefused, match="cannot grade in the sandbox the run requires: sandbox = bwrap is "
                                                "required, but bubblewrap"):
            grade_remote(bundle, rubric, plan, "bwrap", kit_version(), _grade_one, discover)
    finally:
        bwrap_problem.cache_clear()


def test_a_refused_submission_gets_a_results_json_that_says_why(solo, tmp_path, monkeypatch) -> None:
    import pytest_cbatch.grading.ray_runner as ray_runner

    sub, _bundle, rubric, plan = solo
    why = "the worker on node-7 cannot grade in the sandbox the run requires: sandbox = bwrap is required"

    def refusing(submissions, *_args):
        yield None  # a heartbeat: nothing finished lately
        for submission in submissions:
            yield submission.name, WorkerRefused(why)

    monkeypatch.setattr(ray_runner, "grade_on_ray", refusing)
    (result,) = grade_all([sub], rubric, plan, tmp_path / "out", 1, progress=False, sandbox="bwrap", ray="HEAD:1")
    assert result.extra["grader_error"] and result.score == 0 < result.max_score
    document = json.loads((tmp_path / "out" / sub.name / "results.json").read_text())
    assert f"the grader failed on this submission (WorkerRefused: {why})" in document["output"]
    assert (tmp_path / "out" / "summary.csv").read_text().count(sub.name) == 1


def test_a_worker_with_another_kit_version_is_refused(solo) -> None:
    _sub, bundle, rubric, plan = solo
    with pytest.raises(WorkerRefused, match="has pytest-cbatch .*, the driver 0.0.0-other"):
        grade_remote(bundle, rubric, plan, "process", "0.0.0-other", _grade_one, discover)


@pytest.fixture(scope="module")
def returned(solo) -> Returned:
    """What the task returns for the solo submission, graded once (not contained: the test is about the bytes)."""
    _sub, bundle, rubric, plan = solo
    return grade_remote(bundle, rubric, plan, "process", kit_version(), _grade_one, discover)


def test_a_task_grades_the_bytes_it_was_sent_as_one_machine_does(solo, returned, tmp_path: Path) -> None:
    sub, _bundle, rubric, plan = solo
    there = place(tmp_path / "remote" / sub.name, sub.name, returned)
    here = _grade_one(sub, rubric, plan, tmp_path / "local" / sub.name, "process")
    assert there.score == here.score == there.max_score > 0
    assert [t.gradescope() for t in there.tests] == [t.gradescope() for t in here.tests]
    assert sorted(p.name for p in (tmp_path / "remote" / sub.name).iterdir()) == ["results.json"]


@pytest.mark.parametrize("files, name, words", [
    ((("results.json", b"{}"), ("../escape", b"x")), None, "not a grading output"),
    ((("results.json", b"{}"), ("a/b", b"x")), None, "not a grading output"),
    ((("other.txt", b"x"),), None, "not a grading output"),
    ((("results.json", "text"),), None, "not a grading output"),
    ((("results.json", b"{}"), ("results.json", b"{}")), None, "not a grading output"),
    ((("results.json", b"{}"),), "someone_else", "returned the result of 'someone_else'"),
])
def test_what_a_task_returns_is_checked_before_it_is_written(solo, returned, tmp_path, files, name, words) -> None:
    sub = solo[0]
    result = dataclasses.replace(returned.result, name=name or returned.result.name)
    with pytest.raises(ValueError, match=words):
        place(tmp_path / "out" / sub.name, sub.name, Returned(result, files))
    assert not (tmp_path / "out").exists() and not (tmp_path / "escape").exists()
    with pytest.raises(ValueError, match="returned str, not a result"):
        place(tmp_path / "out" / sub.name, sub.name, "results")


def test_each_task_asks_for_a_cpu_and_the_memory_the_limits_imply(solo) -> None:
    _sub, _bundle, rubric, _plan = solo
    assert task_resources(rubric) == {"num_cpus": 1, "memory": (1024 + GRADER_MEMORY_MB) << 20}

    class FakeRay:
        def __init__(self, *nodes: dict) -> None:
            self._nodes = [{"Alive": True, "Resources": r} for r in nodes]

        def nodes(self) -> list[dict]:
            return self._nodes

    check_feasible(FakeRay({"CPU": 1.0, "memory": float(2 << 30)}), task_resources(rubric))
    with pytest.raises(ValueError, match="1 CPU and 1536 MiB .* the largest node with a CPU offers 1024 MiB"):
        check_feasible(FakeRay({"CPU": 4.0, "memory": float(1 << 30)}, {"CPU": 0.0, "memory": float(8 << 30)}),
                       task_resources(rubric))


def test_ray_is_imported_only_when_asked_for() -> None:
    code = ("import sys, pytest_cbatch.cli, pytest_cbatch.grading.driver, pytest_cbatch.grading.ray_runner; "
            "print(sorted(m for m in sys.modules if m == 'ray' or m.startswith('ray.')))")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout == "[]\n"


# ------------------------------------------------------------------ a real cluster


# The class rubric with the numeric checks on: their figures (KL, bitwise share, worst request) are the part of a
# results.json that once changed with a worker's torch thread count.
RAY_RUBRIC = SMALL_RUBRIC.replace('numerics = "off"', 'numerics = "auto"') + '"numerics.*" = { points = 1 }\n'


@pytest.fixture(scope="module")
def on_three_ways(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    """make_class's whole mix, a submission that is a link and a folder holding one, graded on one machine, in
    three shards merged, and on a Ray cluster."""
    if not request.config.getoption("--run-slow"):
        pytest.skip("a Ray cluster of two nodes takes about a minute: run with --run-slow (.ci/run does)")
    pytest.importorskip("ray", reason="ray is not installed: pip install 'pytest-cbatch[ray]'")
    problem = namespace_problem()
    if problem:
        pytest.skip(f"Ray tests run in a network namespace of loopback only, and {problem}")
    root = tmp_path_factory.mktemp("ray-class")
    make_class(root / "subs", len(MIX))
    (root / "subs" / "linked.py").symlink_to(root / "subs" / "s002_file_correct.py")  # refused, never read
    shutil.copytree(root / "subs" / "s000_correct", root / "subs" / "with_a_link")
    (root / "subs" / "with_a_link" / "notes.txt").symlink_to("/etc/hostname")  # left out of the copy, and said so
    rubric = write_rubric(root, RAY_RUBRIC)
    common = [str(root / "subs"), "--rubric", str(rubric)]
    assert grade_main([*common, "--out", str(root / "one"), "--jobs", "2", "--quiet"]) == 0
    for i in (1, 2, 3):
        assert grade_main([*common, "--out", str(root / f"shard{i}"), "--shard", f"{i}/3", "--quiet"]) == 0
    assert grade_main(["merge", *(str(root / f"shard{i}") for i in (1, 2, 3)), "--out", str(root / "merged")]) == 0
    ray = run_on_cluster([sys.executable, "-m", "pytest_cbatch.cli", "grade", *common, "--out", str(root / "ray"),
                          "--ray", "{address}"], root, kill_one_task=True)
    return root, ray


def test_one_machine_ray_and_merged_shards_give_the_same_verdicts(on_three_ways) -> None:
    root, ray = on_three_ways
    assert ray.returncode == 0, ray.stdout[-3000:] + ray.stderr[-3000:]
    one = verdicts(root / "one")
    assert sorted(one["rows"]) == sorted(p.name.removesuffix(".py") for p in (root / "subs").iterdir())
    assert verdicts(root / "merged") == one
    assert verdicts(root / "ray") == one
    assert (root / "ray" / "grading.json").read_text() == (root / "one" / "grading.json").read_text()
    assert "on the Ray cluster at 127.0.0.1:" in ray.stderr


def _results_text(out: Path, name: str) -> str:
    """A submission's results.json as written, its one timing field (execution_time) cut out."""
    text = (out / name / "results.json").read_text(encoding="utf-8")
    cut, found = re.subn(r'"execution_time": [-+0-9.eE]+,?\s*', "", text)
    assert found == 1, text[:300]
    return cut


def test_one_machine_ray_and_merged_shards_write_byte_identical_results(on_three_ways) -> None:
    """Whole files, the numeric checks' figures included (one machine's graders and Ray's workers run torch on
    other thread counts), timings aside."""
    root, ray = on_three_ways
    assert ray.returncode == 0, ray.stdout[-3000:] + ray.stderr[-3000:]
    names = sorted(p.parent.name for p in (root / "one").glob("*/results.json"))
    assert len(names) == len(list((root / "subs").iterdir()))
    with_numerics = [n for n in names if '"numerics.' in _results_text(root / "one", n)]
    if importlib.util.find_spec("torch") is not None:
        assert with_numerics, "no results.json holds a numeric check: the comparison would prove nothing about them"
    for name in names:
        here = _results_text(root / "one", name)
        assert _results_text(root / "ray", name) == here, name
        assert _results_text(root / "merged", name) == here, name


def test_a_worker_killed_mid_run_loses_no_submission_and_reports_none_twice(on_three_ways) -> None:
    root, ray = on_three_ways
    assert (root / "killed").is_file(), "no task was seen running, so no worker was killed"
    names = sorted(p.name.removesuffix(".py") for p in (root / "subs").iterdir())
    progress = [line for line in ray.stderr.splitlines() if re.match(r"\[[#.]+\] \d+/\d+ ", line)]
    assert sorted(line.split()[2].rstrip(":") for line in progress) == names
    *scores, last = ray.stdout.splitlines()  # stdout is the results stream: Ray's messages (a worker died) not in it
    assert [line.split(": ")[0] for line in scores] == names and last.startswith(f"{len(names)} submissions -> ")
    assert "A worker died or was killed" in ray.stderr
