"""A class graded in pieces: `--shard I/N` then `cbatch grade merge` gives what one run gives; bundles (a
submission's bytes in transit to a Ray worker) are checked on arrival; progress lines (a fake clock)."""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from class_grading import SMALL_RUBRIC, make_class, verdicts, write_rubric
from hypothesis import given
from hypothesis import strategies as st

from pytest_cbatch.grading.bundle import Bundle, BundleError, Entry, pack, unpack
from pytest_cbatch.grading.driver import discover
from pytest_cbatch.grading.driver import main as grade_main
from pytest_cbatch.grading.progress import Progress, duration
from pytest_cbatch.grading.results import SubmissionResult
from pytest_cbatch.grading.results import TestResult as Verdict
from pytest_cbatch.grading.shards import RECORD, parse_shard, shard_of
from pytest_cbatch.sandbox import LoadSpec

CLASS_SIZE = 3   # correct and buggy folders, a one-file correct one (make_class's mix)
# The scheduler part alone keeps this quick; the Ray test grades every part of a larger class.
SCHEDULER_ONLY = SMALL_RUBRIC.replace('numerics = "off"', 'numerics = "off"\nparts = ["scheduler"]')


@pytest.fixture(scope="module")
def graded(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The class graded in one run and in three shards (one of them empty); the shards' outputs merged."""
    root = tmp_path_factory.mktemp("class")
    make_class(root / "subs", CLASS_SIZE)
    rubric = write_rubric(root, SCHEDULER_ONLY)
    common = ["--rubric", str(rubric), "--jobs", "2", "--quiet"]
    assert grade_main([str(root / "subs"), "--out", str(root / "one"), *common]) == 0
    for i in (1, 2, 3):
        assert grade_main([str(root / "subs"), "--out", str(root / f"shard{i}"), "--shard", f"{i}/3", *common]) == 0
    shards = [str(root / f"shard{i}") for i in (1, 2, 3)]
    assert grade_main(["merge", *shards, "--out", str(root / "merged")]) == 0
    return {"one": root / "one", "merged": root / "merged", "subs": root / "subs",
            **{f"shard{i}": root / f"shard{i}" for i in (1, 2, 3)}}


def test_sharded_then_merged_gives_exactly_the_verdicts_of_one_run(graded) -> None:
    one, merged = verdicts(graded["one"]), verdicts(graded["merged"])
    assert len(one["rows"]) == CLASS_SIZE
    assert merged == one
    assert (graded["merged"] / RECORD).read_text() == (graded["one"] / RECORD).read_text()
    shards = [json.loads((graded[f"shard{i}"] / RECORD).read_text())["graded"] for i in (1, 2, 3)]
    assert [len(s) for s in shards] == [1, 2, 0], shards  # shard_of's split of make_class's first three names
    assert sorted(sum(shards, [])) == sorted(one["rows"])


def _refused(capsys, outputs: list[Path], out: Path, words: str) -> None:
    assert grade_main(["merge", *map(str, outputs), "--out", str(out)]) == 2
    assert words in capsys.readouterr().err
    assert not out.exists(), "a refused merge wrote its output"
    assert not [p for p in out.parent.iterdir() if ".merging-" in p.name], "a refused merge left its staging folder"


def test_merge_refuses_overlaps_gaps_and_outputs_of_other_rubrics_or_kits(graded, tmp_path: Path, capsys) -> None:
    s1, s2, s3 = graded["shard1"], graded["shard2"], graded["shard3"]
    _refused(capsys, [s1, s2, s3, s1], tmp_path / "twice", "is graded in both")
    _refused(capsys, [s1, graded["one"]], tmp_path / "overlap", "is graded in both")
    _refused(capsys, [s1, s3], tmp_path / "gap", "are in no output")
    for field, value, words in (("rubric", "0" * 64, "different rubrics"), ("kit", "0.0.0", "different kit versions"),
                                ("plan", "1" * 64, "different workloads")):
        other = tmp_path / f"other-{field}"
        shutil.copytree(s2, other)
        record = json.loads((other / RECORD).read_text())
        record[field] = value
        (other / RECORD).write_text(json.dumps(record))
        _refused(capsys, [s1, other], tmp_path / f"merged-{field}", words)
    edited = tmp_path / "edited"
    shutil.copytree(s2, edited)
    record = json.loads((edited / RECORD).read_text())
    record["submissions"][record["graded"][0]] = "f" * 64
    (edited / RECORD).write_text(json.dumps(record))
    _refused(capsys, [s1, edited], tmp_path / "edited-merge", "different submission folders")
    _refused(capsys, [s1, graded["subs"]], tmp_path / "not-an-output", "not an output of `cbatch grade`")
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "keep.txt").write_text("mine")
    assert grade_main(["merge", str(s1), str(s2), "--out", str(busy)]) == 2
    assert "not an empty folder" in capsys.readouterr().err
    assert [p.name for p in busy.iterdir()] == ["keep.txt"]


@given(st.sets(st.text(min_size=1, max_size=12), min_size=1, max_size=30), st.integers(1, 9))
def test_a_submissions_shard_is_a_hash_of_its_name_alone(names: set[str], count: int) -> None:
    for name in names:
        documented = 1 + int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big") % count
        assert shard_of(name, count) == documented


def test_shard_option_is_checked(tmp_path: Path, capsys) -> None:
    assert parse_shard("2/4") == (2, 4)
    for bad in ("0/2", "3/2", "1", "a/b", "1/0", "-1/2"):
        with pytest.raises(ValueError, match="I/N"):
            parse_shard(bad)
    make_class(tmp_path / "subs", 1)
    assert grade_main([str(tmp_path / "subs"), "--out", str(tmp_path / "o"), "--shard", "3/2"]) == 2
    assert "--shard must be I/N" in capsys.readouterr().err and not (tmp_path / "o").exists()


# ------------------------------------------------------------------ bundles


def test_a_bundle_recreates_the_folder_links_kept_as_links(tmp_path: Path) -> None:
    folder = tmp_path / "src" / "alice"
    (folder / "pkg" / "__pycache__").mkdir(parents=True)
    (folder / "empty").mkdir()
    (folder / "scheduler_sim.py").write_text("def simulate(events, **config):\n    return {}\n")
    (folder / "pkg" / "util.py").write_text("X = 1\n")
    (folder / "pkg" / "__pycache__" / "util.cpython-311.pyc").write_bytes(b"\0")
    (folder / "run.sh").write_text("#!/bin/sh\n")
    os.chmod(folder / "run.sh", 0o755)
    os.symlink("/etc/passwd", folder / "secret")
    (sub,) = discover(tmp_path / "src")
    bundle = pack(sub)
    (tmp_path / "there").mkdir()
    there = unpack(bundle, tmp_path / "there")
    (arrived,) = discover(tmp_path / "there")
    assert there == Path(arrived.path) == tmp_path / "there" / "alice"
    assert arrived.load == LoadSpec(str(there), sub.load.files)
    assert (there / "pkg" / "util.py").read_text() == "X = 1\n" and (there / "empty").is_dir()
    assert not (there / "pkg" / "__pycache__").exists()
    assert os.readlink(there / "secret") == "/etc/passwd" and os.access(there / "run.sh", os.X_OK)
    assert pack(discover(tmp_path / "there")[0]).digest() == bundle.digest()
    (folder / "pkg" / "util.py").write_text("X = 2\n")
    assert pack(sub).digest() != bundle.digest()


def test_a_pytest_run_in_a_submission_leaves_its_digest_unchanged(tmp_path: Path) -> None:
    """The student runs the kit in the folder before handing it in (a failing run: .cbatch-failures is written,
    with pytest's cache): the digest that cbatch grade merge compares stays the same."""
    folder = tmp_path / "src" / "carol"
    folder.mkdir(parents=True)
    (folder / "scheduler_sim.py").write_text(
        "from pytest_cbatch.reference.scheduler_sim import simulate as _simulate\n\n\n"
        "def simulate(trace, **config):\n    report = _simulate(trace, **config)\n"
        "    report['summary']['dispatches'] += 1\n    return report\n")
    (sub,) = discover(tmp_path / "src")
    before = pack(sub).digest()
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "--cbatch-impl=scheduler_sim.py", "-k",
                          "test_contract and demo and not serial", "--cbatch-profile=dev"],
                         cwd=folder, capture_output=True, text=True, timeout=300)
    assert run.returncode == 1, run.stdout[-2000:] + run.stderr[-2000:]
    written = {p.name for p in folder.iterdir()} - {"scheduler_sim.py"}
    assert ".cbatch-failures" in written, written
    assert pack(discover(tmp_path / "src")[0]).digest() == before, written


def _folder(*entries: Entry, name: str = "bob", single: bool = False) -> Bundle:
    return Bundle(name, single, tuple(entries))


OK = Entry("scheduler_sim.py", "file", b"x = 1\n")


@pytest.mark.parametrize("bundle, words", [
    (_folder(OK, Entry("../escape.py", "file", b"x")), "not a plain relative path"),
    (_folder(OK, Entry("/etc/cron.d/x", "file", b"x")), "not a plain relative path"),
    (_folder(OK, Entry("a//b.py", "file", b"x")), "not a plain relative path"),
    (_folder(OK, Entry("a/./b.py", "file", b"x")), "not a plain relative path"),
    (_folder(Entry("up", "link", target="/tmp"), Entry("up/planted.py", "file", b"x")), "beneath a link"),
    (_folder(Entry("up/planted.py", "file", b"x"), Entry("up", "link", target="/tmp")), "beneath a link"),
    (_folder(OK, Entry("scheduler_sim.py/x.py", "file", b"x")), "beneath a file"),
    (_folder(OK, OK), "appears twice"),
    (_folder(OK, Entry("d", "dir", b"data")), "a dir with contents"),
    (_folder(OK, Entry("dev", "device")), "unknown kind"),
    (_folder(OK, Entry("l", "link", target="")), "link target"),
    (_folder(OK, Entry(b"bytes.py", "file", b"x")), "wrong type"),   # type: ignore[arg-type]
    (_folder(OK, name="../alice"), "not a submission name"),
    (_folder(OK, name=".hidden"), "not a submission name"),
    (_folder(name="carol"), "0 entries"),
    (_folder(OK, name="carol", single=True), "the single file carol.py"),
    ("not a bundle", "not a submission bundle"),
])
def test_a_bundle_is_refused_on_arrival_before_anything_is_written(tmp_path: Path, bundle: object, words: str) -> None:
    (tmp_path / "in").mkdir()
    with pytest.raises(BundleError, match=words.replace(".", r"\.")):
        unpack(bundle, tmp_path / "in")
    assert not any((tmp_path / "in").iterdir())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in"]


# ------------------------------------------------------------------ progress


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _result(name: str, score: float) -> SubmissionResult:
    return SubmissionResult(name, [Verdict("contract.completes", score > 0, "", max_score=4.0)], "", 12.34)


def test_progress_says_what_it_grades_at_once_then_rate_and_time_left() -> None:
    clock, stream = FakeClock(), io.StringIO()
    progress = Progress(4, "in 2 worker processes", stream=stream, clock=clock)
    progress.started()
    assert stream.getvalue() == "grading 4 submissions in 2 worker processes\n"
    clock.now += 45
    progress.waiting()
    clock.now += 15
    progress.finished(_result("alice", 4))
    clock.now += 60
    progress.finished(_result("bob", 0))
    clock.now += 3 * 3600
    progress.finished(_result("carol", 4))
    progress.finished(_result("dave", 4))
    assert stream.getvalue().splitlines()[1:] == [
        "... 0/4 done, still grading | 45 s elapsed, time left known after the first submission",
        "[######..................] 1/4 alice: 4/4 (12.3 s) | 1.0/min, 1 min 00 s elapsed, about 3 min 00 s left",
        "[############............] 2/4 bob: 0/4 (12.3 s) | 1.0/min, 2 min 00 s elapsed, about 2 min 00 s left",
        "[##################......] 3/4 carol: 4/4 (12.3 s) | 0.0/min, 3 h 02 min elapsed, about 1 h 00 min left",
        "[########################] 4/4 dave: 4/4 (12.3 s) | 0.0/min, 3 h 02 min elapsed, done",
    ]


def test_the_first_progress_line_comes_before_the_workloads_are_drawn(tmp_path: Path, monkeypatch, capsys) -> None:
    import pytest_cbatch.grading.driver as driver

    make_class(tmp_path / "subs", 3)
    seen_first: list[str] = []

    def no_plan(*_args):
        seen_first.append(capsys.readouterr().err)
        raise ValueError("stop here: the plan is what takes seconds")

    monkeypatch.setattr(driver, "build_plan", no_plan)
    assert grade_main([str(tmp_path / "subs"), "--out", str(tmp_path / "out"), "--shard", "2/3", "--jobs", "2"]) == 2
    assert seen_first and seen_first[0].endswith("grading 2 submissions in 2 worker processes\n")


def test_progress_can_be_silenced_and_durations_read_naturally() -> None:
    stream = io.StringIO()
    quiet = Progress(1, "here", stream=stream, enabled=False)
    quiet.started()
    quiet.finished(_result("alice", 4))
    assert stream.getvalue() == ""
    assert [duration(s) for s in (0, 59.4, 60, 3599, 3600, 7260)] == ["0 s", "59 s", "1 min 00 s", "59 min 59 s",
                                                                       "1 h 00 min", "2 h 01 min"]
