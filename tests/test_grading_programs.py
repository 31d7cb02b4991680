"""Submissions in any language: a folder whose manifest (cbatch.toml) names a command, graded over exec:
in the same sandbox as a Python submission; a broken manifest is refused with a clear message."""

from __future__ import annotations

import html
import json
import re
import shutil
import time
from pathlib import Path

import pytest

from pytest_cbatch.grading.driver import discover
from pytest_cbatch.grading.driver import main as grade_main
from pytest_cbatch.grading.manifest import ManifestError, command_problem, read_manifest
from pytest_cbatch.grading.rubric import load_rubric
from pytest_cbatch.impls import ImplementationError
from pytest_cbatch.runner import ALL_CLAUSES, Judge
from pytest_cbatch.sandbox import IsolatedImplementation, Limits, LoadSpec, bwrap_problem
from pytest_cbatch.workloads import WORKLOADS

ROOT = Path(__file__).resolve().parent.parent
JS_FOLDER = ROOT / "examples" / "any_language"
ROTATION_JS = (("turn.decode += Math.min(decoding.length, cfg.token_budget);", "turn.decode += 1;"),
               ("        turn.prefill += 1;\n      }\n", "      }\n      turn.prefill += 1;\n"))
NO_NODE = shutil.which("node") is None
needs_node = pytest.mark.skipif(NO_NODE, reason="node is not installed: the JavaScript submission cannot run")
needs_bwrap = pytest.mark.skipif(bwrap_problem() is not None, reason=f"no working bubblewrap: {bwrap_problem()}")

RUBRIC = """[grading]
generated_examples = 5
lifecycle_examples = 1
numerics = "off"
parts = ["scheduler", "lifecycle"]
course = true
optional = ["admission=optimistic"]
{extra}
[limits]
call_seconds = 30
[tests]
"contract.*" = {{ points = 1 }}
"lifecycle.*" = {{ points = 1 }}
"""


def folder_with(tmp_path: Path, name: str, manifest: str | bytes) -> Path:
    folder = tmp_path / name
    folder.mkdir()
    data = manifest if isinstance(manifest, bytes) else manifest.encode()
    (folder / "cbatch.toml").write_bytes(data)
    return folder


# -- the manifest is untrusted input ------------------------------------------------------------------


@pytest.mark.parametrize("manifest, message", [
    ('[submission]\nexec = 3\n', "[submission].exec must be a string"),
    ('[submission]\n', "got nothing"),
    ('[submission]\nexec = "node a.js"\nlanguage = "js"\n', "[submission] has unknown key(s) 'language'"),
    ('[build]\ncmd = "make"\n', "unknown key(s) or table(s) 'build'"),
    ('exec = "node a.js"\n', "unknown key(s) or table(s) 'exec'"),
    ('submission = "node a.js"\n', "needs a [submission] table"),
    ('[submission\nexec = "node a.js"\n', "is not valid TOML"),
    ('[submission]\nexec = ""\n', "exec is empty"),
    ('[submission]\nexec = "node \\"a.js"\n', "is not a command line"),
    ('[submission]\nexec = "node a.js\\nrm -rf ~"\n', "must be one line"),
    (b'[submission]\nexec = "\xff"\n', "is not UTF-8 text"),
    ("# " + "x" * 20000 + "\n", "is larger than 16 KiB"),
])
def test_a_broken_manifest_is_refused_with_what_is_wrong(tmp_path: Path, manifest: str | bytes, message: str) -> None:
    with pytest.raises(ManifestError) as caught:
        read_manifest(folder_with(tmp_path, "s", manifest))
    assert message in str(caught.value) and str(caught.value).startswith("cbatch.toml")


def test_a_manifest_that_is_a_link_is_not_followed(tmp_path: Path) -> None:
    outside = tmp_path / "elsewhere.toml"
    outside.write_text('[submission]\nexec = "node a.js"\n', encoding="utf-8")
    folder = tmp_path / "s"
    folder.mkdir()
    (folder / "cbatch.toml").symlink_to(outside)
    with pytest.raises(ManifestError, match="plain file"):
        read_manifest(folder)


def test_the_command_must_be_a_file_of_the_submission_or_a_program_the_sandbox_shows(tmp_path: Path) -> None:
    folder = tmp_path / "s"
    folder.mkdir()
    (folder / "run.sh").write_text("#!/bin/sh\n", encoding="utf-8")
    (tmp_path / "outside.sh").write_text("#!/bin/sh\n", encoding="utf-8")
    (tmp_path / "outside.sh").chmod(0o755)
    assert "not executable" in command_problem(("./run.sh",), folder)
    (folder / "run.sh").chmod(0o755)
    assert command_problem(("./run.sh",), folder) is None
    assert "not a file of the submission" in command_problem(("../outside.sh",), folder)
    assert "is not found" in command_problem(("no-such-runtime-here",), folder)
    assert command_problem(("sh", "run.sh"), folder) is None


def test_a_runtime_outside_usr_is_added_by_the_rubric(tmp_path: Path) -> None:
    runtime = tmp_path / "opt" / "mylang"
    (runtime / "bin").mkdir(parents=True)
    tool = runtime / "bin" / "mylang"
    tool.write_text("#!/bin/sh\n", encoding="utf-8")
    tool.chmod(0o755)
    folder = folder_with(tmp_path, "s", '[submission]\nexec = "mylang main.ml"\n')
    assert "is not found" in command_problem(read_manifest(folder).command, folder)
    rubric_file = tmp_path / "rubric.toml"
    rubric_file.write_text(f'[grading]\nruntimes = ["{runtime}"]\n', encoding="utf-8")
    rubric = load_rubric(rubric_file)
    assert command_problem(read_manifest(folder).command, folder, rubric.runtimes) is None
    rubric_file.write_text('[grading]\nruntimes = ["opt/mylang"]\n', encoding="utf-8")
    with pytest.raises(ValueError, match="absolute paths of folders"):
        load_rubric(rubric_file)


def test_a_folder_with_a_manifest_is_a_program_submission(tmp_path: Path) -> None:
    shutil.copytree(JS_FOLDER, tmp_path / "alice")
    folder_with(tmp_path, "bob", '[submission]\nexec = 3\n')
    found = {s.name: s for s in discover(tmp_path)}
    assert found["alice"].load.command == ("node", "scheduler_sim.js") and found["alice"].problem is None
    assert "must be a string" in found["bob"].problem


# -- graded in the sandbox ----------------------------------------------------------------------------------


@needs_node
@needs_bwrap
def test_a_javascript_scheduler_gets_full_contract_marks_in_the_default_sandbox(tmp_path: Path) -> None:
    submissions = tmp_path / "submissions"
    shutil.copytree(JS_FOLDER, submissions / "alice")
    shutil.copytree(JS_FOLDER, submissions / "dave")   # the rotation bug: both counters advance by one
    script = submissions / "dave" / "scheduler_sim.js"
    buggy = script.read_text(encoding="utf-8")
    for right, wrong in ROTATION_JS:
        buggy = buggy.replace(right, wrong)
    assert buggy != script.read_text(encoding="utf-8")
    script.write_text(buggy, encoding="utf-8")
    folder_with(submissions, "bob", '[submission]\nexec = "node scheduler.js"\nentry = "main"\n')
    folder_with(submissions, "carol", '[submission]\nexec = "nodejs-that-is-not-there scheduler.js"\n')
    rubric = tmp_path / "rubric.toml"
    rubric.write_text(RUBRIC.format(extra=""), encoding="utf-8")
    out = tmp_path / "out"
    assert grade_main([str(submissions), "--out", str(out), "--rubric", str(rubric), "--jobs", "2", "--quiet"]) == 0
    alice = json.loads((out / "alice" / "results.json").read_text(encoding="utf-8"))
    assert "contained by bubblewrap" in alice["output"]
    contract = [t for t in alice["tests"] if t["name"].startswith("contract.")]
    assert len(contract) == len(ALL_CLAUSES) + 1   # with course_results
    assert all(t["score"] == t["max_score"] == 1 for t in contract), [t for t in contract if not t["score"]]
    lifecycle = [t for t in alice["tests"] if t["name"].startswith("lifecycle.")]
    assert lifecycle and all(t["score"] == 0 and "is a program" in t["output"] and 'parts = ["scheduler"]'
                             in t["output"] for t in lifecycle)
    assert alice["score"] == len(contract)
    dave = json.loads((out / "dave" / "results.json").read_text(encoding="utf-8"))
    failed = [t for t in dave["tests"] if t["score"] < t["max_score"] and t["name"].startswith("contract.")]
    assert [t["name"] for t in failed] == ["contract.course_results"]
    assert "cbatch check --impl 'exec:node scheduler_sim.js' --trace" in html.unescape(failed[0]["output"])
    for name, message in (("bob", "[submission] has unknown key(s) 'entry'"),
                          ("carol", "the command 'nodejs-that-is-not-there' is not found")):
        doc = json.loads((out / name / "results.json").read_text(encoding="utf-8"))
        assert doc["score"] == 0 and message in doc["output"]
        assert all(message in t["output"] for t in doc["tests"]), name


@pytest.mark.parametrize("script, field, message", [
    ("echo hello", "broken", "stdout is not JSON"),
    ("echo 'admission: not supported' >&2; exit 3", "unsupported", "exited 3 (unsupported): admission"),
    ("echo 'trace line 2: bad' >&2; exit 2", "refused", "exit status 2: trace line 2: bad"),
    ("kill -9 $$", "refused", "killed by signal 9"),
])
def test_a_program_answers_over_the_exec_protocol(tmp_path: Path, script: str, field: str, message: str) -> None:
    folder = tmp_path / "s"
    folder.mkdir()
    (folder / "run.sh").write_text(script + "\n", encoding="utf-8")
    impl = IsolatedImplementation("s", LoadSpec(str(folder), command=("sh", "run.sh")), Limits(call_seconds=30),
                                  mode="process")
    try:
        outcome = impl.run(list(WORKLOADS["demo"].trace), WORKLOADS["demo"].config)
    finally:
        impl.close()
    assert message in (getattr(outcome, field) or ""), outcome


@needs_node
def test_a_program_is_judged_like_exec_and_its_leftovers_are_killed(tmp_path: Path) -> None:
    """Process mode, so the host sees the program's processes: one it left running is gone after the call."""
    folder = tmp_path / "s"
    shutil.copytree(JS_FOLDER, folder)
    (folder / "run.sh").write_text('#!/bin/sh\nsleep 300 &\necho "left $!" >&2\nexit 2\n', encoding="utf-8")
    (folder / "run.sh").chmod(0o755)
    impl = IsolatedImplementation("s", LoadSpec(str(folder), command=("node", "scheduler_sim.js")),
                                  Limits(call_seconds=30), mode="process")
    try:
        demo = WORKLOADS["demo"]
        assert Judge(impl).judge("course_results", list(demo.trace), demo.config).status == "pass"
    finally:
        impl.close()
    leaver = IsolatedImplementation("s", LoadSpec(str(folder), command=("./run.sh",)), Limits(call_seconds=30),
                                    mode="process")
    try:
        outcome = leaver.run(list(WORKLOADS["demo"].trace), WORKLOADS["demo"].config)
    finally:
        leaver.close()
    assert outcome.refused and "exit status 2" in outcome.refused
    pid = int(re.search(r"left (\d+)", outcome.refused).group(1))
    deadline = time.monotonic() + 5   # SIGKILL was sent before the reply; its delivery takes a moment
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(pid)


def _alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie, killed and not yet reaped, does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state not in ("Z", "X")


@needs_node
@needs_bwrap
def test_bubblewrap_shows_a_runtime_the_rubric_adds_and_no_other(tmp_path: Path) -> None:
    runtime = tmp_path / "opt" / "course-lang"
    (runtime / "bin").mkdir(parents=True)
    shutil.copy(JS_FOLDER / "scheduler_sim.js", runtime / "scheduler_sim.js")
    launcher = runtime / "bin" / "course-sched"
    launcher.write_text(f'#!/bin/sh\nexec node {runtime / "scheduler_sim.js"}\n', encoding="utf-8")
    launcher.chmod(0o755)
    folder = folder_with(tmp_path, "s", '[submission]\nexec = "course-sched"\n')
    load = LoadSpec(str(folder), command=read_manifest(folder).command)
    impl = IsolatedImplementation("s", load, Limits(call_seconds=30), mode="bwrap", runtimes=(str(runtime),))
    try:
        demo = WORKLOADS["demo"]
        assert Judge(impl).judge("course_results", list(demo.trace), demo.config).status == "pass"
    finally:
        impl.close()
    with pytest.raises(ImplementationError, match="'course-sched' is not found in the sandbox"):
        IsolatedImplementation("s", load, Limits(call_seconds=30), mode="bwrap")


def test_gradescope_takes_a_program_submission(tmp_path: Path) -> None:
    from pytest_cbatch.grading.driver import gradescope_submission

    shutil.copytree(JS_FOLDER, tmp_path / "submission")
    assert gradescope_submission(tmp_path).load.command == ("node", "scheduler_sim.js")
