"""A class no submission can stop, read or rewrite: every name, file and string a submission hands the grader.

The kit's own hostile set for ``untrusted`` (names, files, strings) and for the results file: each test grades
submissions written to break the grader, beside an honest one, and checks that the class grades to the end
with the honest one's exact marks, that each hostile one is told what is wrong, and that what the grader
writes and prints is safe.  Where an attack needs the grader to be otherwise, the test also shows it working
that way, so the test can fail.
"""

from __future__ import annotations

import csv
import json
import os
import time
from pathlib import Path

import pytest
from grading_samples import published
from class_grading import verdicts

from pytest_cbatch import untrusted
from pytest_cbatch.grading import driver
from pytest_cbatch.grading.driver import discover
from pytest_cbatch.grading.driver import main as grade_main
from pytest_cbatch.grading.evaluate import Submission, grade_submission
from pytest_cbatch.grading.manifest import ManifestError, read_manifest
from pytest_cbatch.grading.plan import HIDDEN_TEST, build_plan
from pytest_cbatch.grading.results import SubmissionResult, write_summary
from pytest_cbatch.grading.results import TestResult as GradedTest
from pytest_cbatch.grading.rubric import load_rubric
from pytest_cbatch.sandbox import LoadSpec, bwrap_problem, reaper, submission_files

RUBRIC = ('[grading]\ngenerated_examples = 0\nparts = ["scheduler"]\n[limits]\ncall_seconds = 60\n'
          'max_failures = 1\n[tests]\n"contract.*" = { points = 1 }\n')
FULL = 34  # the contract clauses, a point each


def _rubric(root: Path, text: str = RUBRIC):
    path = root / "rubric.toml"
    path.write_text(text, encoding="utf-8")
    return path


# ------------------------------------------------------------------ untrusted


def test_names_of_any_bytes_become_distinct_safe_names() -> None:
    raw = ["alice", "josé", "caf\udce9", "caf%E9", "=HYPERLINK(\"x\")", "@SUM(1+1)*cmd|' -C calc'!A0",
           "a\x1b[2J\x07\rforged: 999 of 999", "-rf", "summary.csv", "SUMMARY.CSV", "x.tmp", "\u202eevil", "a" * 255]
    names = [untrusted.name(r, reserved=("summary.csv",)) for r in raw]
    assert names[:2] == ["alice", "josé"]  # letters of any script stay as they are
    assert len(set(names)) == len(names)  # injective: caf%E9 the text and caf\xe9 the byte differ
    for name in names:
        assert name.isprintable() and "/" not in name and name.encode("utf-8") and len(name.encode()) <= 200
        assert name[0] not in "=+-@." and name.casefold() != "summary.csv" and not name.endswith(".tmp")
    assert untrusted.name(b"caf\xe9") == untrusted.name("caf\udce9") == "caf%E9"


def test_text_is_bounded_valid_unicode_with_control_characters_escaped() -> None:
    assert untrusted.text("a\udcff\x1b[31m\x07b\n\tc") == "a\\udcff\\x1b[31m\\x07b\n\tc"
    assert untrusted.line("one\ntwo\rthree") == "one\\x0atwo\\x0dthree"
    assert untrusted.text("G" * 10_000, 100) == "G" * 100 + "... (9900 more characters)"
    assert untrusted.text(["not", "a", "string"]) == "an object of type 'list'"
    for formula in ("=1+1", "+1", "-1", "@A1", "\uff1d1"):
        assert untrusted.cell(formula) == "'" + formula
    assert untrusted.cell("alice") == "alice" and untrusted.cell(3) == "3"
    assert json.dumps(untrusted.document({"k\udcff": ["\udcff"]}), ensure_ascii=False).encode("utf-8")


def test_read_file_refuses_links_fifos_devices_and_huge_files_without_reading_them(tmp_path: Path) -> None:
    (tmp_path / "ok").write_bytes(b"abc")
    assert untrusted.read_file(tmp_path / "ok", 3) == b"abc"
    os.mkfifo(tmp_path / "fifo")  # opened without blocking, refused before a byte is read
    (tmp_path / "link").symlink_to(tmp_path / "ok")
    with open(tmp_path / "sparse", "wb") as fh:
        fh.truncate(8 << 30)  # 8 GiB, sparse: a whole read would take the grader's memory
    start = time.monotonic()
    for name, words in (("fifo", "not a plain file"), ("link", "cannot be opened"), ("sparse", "larger than"),
                        ("missing", "cannot be opened")):
        with pytest.raises(untrusted.UntrustedFile, match=words):
            untrusted.read_file(tmp_path / name, 16 << 10)
    with pytest.raises(untrusted.UntrustedFile, match="not a plain file"):
        untrusted.read_file("/dev/zero", 16 << 10)
    assert time.monotonic() - start < 30  # nothing above waited or read gigabytes (a generous bound)


def test_a_manifest_nested_thousands_deep_is_refused_with_a_message(tmp_path: Path) -> None:
    (tmp_path / "cbatch.toml").write_text("[submission]\nexec = " + "[" * 5000 + "]" * 5000 + "\n", encoding="utf-8")
    with pytest.raises(ManifestError, match="too deep"):
        read_manifest(tmp_path)


# ------------------------------------------------------------ a hostile class

EXITS_BIG = '''
def simulate(events, **config):
    import sys
    sys.exit("G" * 8_000_000)
'''
MEMORY_BIG = '''
def simulate(events, **config):
    raise MemoryError("M" * 8_000_000)
'''
SURROGATE = '''
def simulate(events, **config):
    raise ValueError("\\udcff\\x1b[2J bad input")
'''
FORGES_GUARD_LINE = '''
_published_simulate = simulate


def simulate(events, **config):
    import json, os, sys
    fd = json.loads(sys.argv[-1])["rpc_out"]
    os.write(fd, b'{"kit": {"use": "imports \\\\udcff forged", "file": "\\\\udcff", "line": 1}}\\n')
    return _published_simulate(events, **config)
'''
NAMES = {  # a folder name (str, as os.listdir gives it; surrogates are its undecodable bytes) -> its overlay
    "correct": "",
    "caf\udce9": "",  # a Latin-1 name, as old zip tools write
    "summary.csv": "",
    '=HYPERLINK("x.example","click")': "",
    "@SUM(1+1)*cmd|' -C calc'!A0": "",
    "esc\x1b[2J\x07\rforged: 999 of 999": "",
    "exits_big": EXITS_BIG,
    "memory_big": MEMORY_BIG,
    "surrogate_message": SURROGATE,
    "forges_guard_line": FORGES_GUARD_LINE,
}


def _hostile_class(root: Path) -> Path:
    subs = root / "subs"
    subs.mkdir(parents=True)
    for raw, overlay in NAMES.items():
        folder = published(subs / raw, overlay)
        if raw == "caf\udce9":
            (folder / "notes\udcff.txt").write_bytes(b"a file named with invalid UTF-8\n")
    (subs / "grading.json.py").write_text("def simulate(events, **config):\n    raise ValueError('no')\n",
                                          encoding="utf-8")
    for name, text in (("deep", "[submission]\nexec = " + "[" * 5000 + "]" * 5000 + "\n"), ("big", None),
                       ("fifo", None)):
        (subs / name).mkdir()
        if text is not None:
            (subs / name / "cbatch.toml").write_text(text, encoding="utf-8")
        elif name == "big":
            with open(subs / name / "cbatch.toml", "wb") as fh:
                fh.truncate(8 << 30)
        else:
            os.mkfifo(subs / name / "cbatch.toml")
    published(subs / "nested" / "inner")  # handed in inside a folder of its own
    return subs


@pytest.fixture(scope="module")
def hostile_class(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, str, str]:
    root = tmp_path_factory.mktemp("hostile-class")
    subs = _hostile_class(root)
    rubric = _rubric(root)
    import contextlib
    import io

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = grade_main([str(subs), "--out", str(root / "out"), "--rubric", str(rubric), "--jobs", "2",
                           "--sandbox", "process"])
    assert code == 0, err.getvalue()[-2000:]
    return root, subs, out.getvalue(), err.getvalue()


def _rows(out: Path) -> dict[str, dict[str, str]]:
    with open(out / "summary.csv", newline="", encoding="utf-8") as fh:
        return {row["submission"]: row for row in csv.DictReader(fh)}


def test_no_name_or_file_stops_the_class_and_every_submission_has_a_row(hostile_class) -> None:
    root, subs, _stdout, _stderr = hostile_class
    out = root / "out"
    rows = _rows(out)
    expected = {driver.submission_name(p.stem if p.suffix == ".py" else p.name) for p in subs.iterdir()}
    assert set(rows) == expected and len(rows) == len(NAMES) + 5
    assert (out / "grading.json").is_file() and json.loads((out / "grading.json").read_text(encoding="utf-8"))
    assert not list(out.glob("*.tmp"))
    for name in rows:
        assert (out / name / "results.json").is_file(), name
    honest = ["correct", "caf%E9", "summary%2Ecsv"]
    # the one-file grading.json.py, graded (it refuses everything: only invalid_input_refused holds), not an output
    assert rows["grading%2Ejson"]["score"] == "1"
    for name in honest + [driver.submission_name('=HYPERLINK("x.example","click")')]:
        assert rows[name]["score"] == str(FULL), (name, rows[name]["score"])


def test_broken_manifests_and_a_nested_folder_are_graded_zero_saying_why(hostile_class) -> None:
    root, _subs, _stdout, _stderr = hostile_class
    out = root / "out"
    says = {"deep": "too deep", "big": "larger than", "fifo": "not a plain file",
            "nested": "the folder inner/ inside it holds one"}
    for name, words in says.items():
        document = json.loads((out / name / "results.json").read_text(encoding="utf-8"))
        assert document["score"] == 0 and words in document["output"], (name, document["output"][:400])


def test_what_a_spreadsheet_or_a_terminal_would_run_is_neutralised(hostile_class) -> None:
    root, _subs, stdout, stderr = hostile_class
    raw_csv = (root / "out" / "summary.csv").read_text(encoding="utf-8")
    for line in raw_csv.splitlines()[1:]:
        assert line[:1] not in "=+-@\t\r", line  # no first cell a spreadsheet evaluates
    assert "HYPERLINK(" not in raw_csv and "cmd|" not in raw_csv
    for stream in (stdout, stderr):
        assert "\x1b" not in stream and "\x07" not in stream and "\r" not in stream
        assert not any(line.startswith("forged") for line in stream.splitlines())


def test_every_message_copied_from_a_submission_is_bounded_and_valid_unicode(hostile_class) -> None:
    root, _subs, _stdout, _stderr = hostile_class
    out = root / "out"
    for name in ("exits_big", "memory_big", "surrogate_message", "forges_guard_line"):
        data = (out / name / "results.json").read_bytes()
        assert len(data) < 1 << 20, (name, len(data))  # 8 MB messages, but a bounded file
        data.decode("utf-8")  # strict: no lone surrogate reached the file
        assert "\x1b" not in json.loads(data)["output"]
    assert "\\udcff" in (out / "surrogate_message" / "results.json").read_text(encoding="utf-8")
    assert "forged" in _rows(out)["forges_guard_line"]["flags"]


def test_shards_and_their_merge_agree_with_one_run_on_the_hostile_class(hostile_class, tmp_path: Path) -> None:
    root, subs, _stdout, _stderr = hostile_class
    rubric = root / "rubric.toml"
    for i in (1, 2):
        assert grade_main([str(subs), "--out", str(tmp_path / f"s{i}"), "--rubric", str(rubric), "--jobs", "2",
                           "--sandbox", "process", "--shard", f"{i}/2", "--quiet"]) == 0
    assert grade_main(["merge", str(tmp_path / "s1"), str(tmp_path / "s2"), "--out", str(tmp_path / "merged")]) == 0
    whole, merged = verdicts(root / "out"), verdicts(tmp_path / "merged")
    assert whole.keys() == merged.keys()
    for name in whole:
        if name not in ("header", "rows"):  # a results.json's output line names the machine's limits only
            assert whole[name] == merged[name], name
    assert whole["rows"] == merged["rows"]


def test_summary_csv_is_written_whatever_a_flag_or_name_holds(tmp_path: Path) -> None:
    result = SubmissionResult("=cmd", [GradedTest("contract.completes", True, "\udcff", 1.0)], "", 0.0,
                              extra={"flags": ["uses the kit's code: imports \udcff\x1b[2J"]})
    write_summary(tmp_path / "summary.csv", [result])
    text = (tmp_path / "summary.csv").read_text(encoding="utf-8")
    assert "'=cmd" in text and "\\udcff\\x1b[2J" in text and not list(tmp_path.glob("*.tmp"))


# ------------------------------------------------------------ hidden outcomes

LEAKER = '''
_published_simulate = simulate


def simulate(events, **config):
    ids = [e.get("id") for e in events if e.get("event") == "arrival"]
    report = _published_simulate(events, **config)
    if ids and str(ids[0]).startswith("hx"):  # not a public workload: read out a bit of the hidden trace
        bits = ord(str(ids[0])[2])
        if bits & 1:
            report["events"] = report["events"][1:]      # fails a clause or two
        if bits & 2:
            report["config"] = dict(report["config"], capacity=-1)
    return report
'''


def _hidden(folder: Path, first_id: str) -> Path:
    folder.mkdir()
    lines = [{"config": {}}, {"time": 0, "event": "arrival", "id": first_id, "prompt_tokens": 2, "output_tokens": 2}]
    (folder / "h.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    return folder


@pytest.mark.parametrize("reveal", ["outcome", "clauses"])
def test_a_student_learns_one_bit_of_the_hidden_workloads_by_default(tmp_path: Path, reveal: str) -> None:
    rubric_path = _rubric(tmp_path, RUBRIC + f'"{HIDDEN_TEST}" = {{ points = 5 }}\n[hidden]\nreveal = "{reveal}"\n')
    folder = published(tmp_path / "leaker", LEAKER)
    sub = Submission("leaker", str(folder), LoadSpec(str(folder), submission_files(str(folder))))
    seen = []
    for number, first_id in enumerate(("hx\x01", "hx\x02")):  # two hidden traces differing in one byte of an id
        rubric = load_rubric(rubric_path)
        plan = build_plan(rubric, _hidden(tmp_path / f"hidden{number}", first_id))
        out = tmp_path / f"out{number}"
        out.mkdir()
        document = grade_submission(sub, rubric, plan, out, "process").gradescope()
        document.pop("execution_time")
        seen.append(json.dumps(document))
    if reveal == "outcome":  # both fail the hidden test and nothing else differs: the byte is not read out
        assert seen[0] == seen[1]
        assert json.loads(seen[0])["score"] == FULL
    else:  # a bit per clause, as the rubric chose: the two differ, which is what the default prevents
        assert seen[0] != seen[1]


# ------------------------------------------------------------- results file

DAEMON = '''
import os as _os, sys as _sys, time as _time


def _rewrite_later(target, pidfile):
    if _os.fork():
        return
    try:  # never back into the submission's code: this copy of the process only forges
        _os.setsid()
        if _os.fork():
            _os._exit(0)
        try:
            with open(pidfile, "w") as fh:
                fh.write(str(_os.getpid()))
        except OSError:
            pass  # in bubblewrap the grader's folders are not there
        for _ in range(400):  # about 20 s: waits for the verdict, then forges it
            _time.sleep(0.05)
            if _os.path.exists(target):
                _time.sleep(0.2)
                with open(target, "w") as fh:
                    fh.write('{{"score": 999, "tests": []}}')
    finally:
        _os._exit(0)


_rewrite_later({target!r}, {pidfile!r})
'''


def _daemon_alive(pidfile: Path) -> bool:
    if not pidfile.exists():
        return False
    try:
        with open(f"/proc/{int(pidfile.read_text() or 0)}/stat", "rb") as fh:
            return fh.read().rsplit(b")", 1)[1].split()[0] != b"Z"  # a zombie is dead, whoever reaps it
    except (OSError, ValueError):
        return False


def test_a_process_the_submission_leaves_behind_dies_before_its_results_are_written(tmp_path: Path) -> None:
    subs, out, pidfile = tmp_path / "subs", tmp_path / "out", tmp_path / "daemon.pid"
    subs.mkdir()
    published(subs / "forger", DAEMON.format(target=str(out / "forger" / "results.json"), pidfile=str(pidfile)))
    assert grade_main([str(subs), "--out", str(out), "--rubric", str(_rubric(tmp_path)), "--jobs", "1",
                       "--sandbox", "process", "--quiet"]) == 0
    assert pidfile.exists()  # the daemon did start, outside the child's session
    time.sleep(1.0)  # what it would have needed to rewrite the file
    assert not _daemon_alive(pidfile)
    document = json.loads((out / "forger" / "results.json").read_text(encoding="utf-8"))
    assert document["score"] == FULL and len(document["tests"]) == FULL


def test_the_sweep_finds_a_double_forked_setsid_process(tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    import multiprocessing

    def run() -> None:  # in a fresh process, so the sweep kills nothing of the test session's
        assert reaper.adopt_orphans()
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                pidfile.write_text(str(os.getpid()))
                time.sleep(60)
            os._exit(0)
        os.wait()
        for _ in range(100):
            if pidfile.exists() and pidfile.read_text():
                break
            time.sleep(0.05)
        orphan = int(pidfile.read_text())
        assert orphan in reaper.descendants()  # adopted: its parent is gone, it is ours
        assert reaper.sweep() >= 1 and reaper.descendants() == []

    ctx = multiprocessing.get_context("fork")
    proc = ctx.Process(target=run)
    proc.start()
    proc.join(60)
    assert proc.exitcode == 0 and not _daemon_alive(pidfile)


def _gradescope_root(tmp_path: Path, overlay: str = "") -> Path:
    root = tmp_path / "autograder"
    published(root / "submission", overlay)
    (root / "results").mkdir()
    return root


def test_gradescope_refuses_to_write_a_verdict_it_cannot_protect(tmp_path: Path, monkeypatch,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    marker = tmp_path / "ran"
    root = _gradescope_root(tmp_path, f"\nopen({str(marker)!r}, 'w').close()\n")
    monkeypatch.setattr(driver, "sandbox_mode", lambda requested, rubric: "process")  # no bubblewrap here
    code = grade_main(["--gradescope", "--gradescope-root", str(root), "--rubric", str(_rubric(tmp_path))])
    assert code == 2 and "cannot protect its results" in capsys.readouterr().err
    document = json.loads((root / "results" / "results.json").read_text(encoding="utf-8"))
    assert document["score"] == 0 and "bubblewrap" in document["output"]
    assert not marker.exists()  # not one line of the submission ran


@pytest.mark.skipif(bwrap_problem() is not None, reason=f"bubblewrap cannot run here: {bwrap_problem()}")
def test_on_gradescope_a_submission_cannot_rewrite_its_results(tmp_path: Path) -> None:
    pidfile = tmp_path / "daemon.pid"
    root = tmp_path / "autograder"
    root = _gradescope_root(tmp_path, DAEMON.format(target=str(root / "results" / "results.json"),
                                                    pidfile=str(pidfile)))
    assert grade_main(["--gradescope", "--gradescope-root", str(root), "--rubric", str(_rubric(tmp_path))]) == 0
    time.sleep(1.0)
    document = json.loads((root / "results" / "results.json").read_text(encoding="utf-8"))
    assert document["score"] == FULL and not _daemon_alive(pidfile)


def test_discover_lists_a_folder_with_nothing_to_grade(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "_instructor").mkdir()  # a leading _ or . keeps the instructor's own folders out
    found = {s.name: s for s in discover(tmp_path)}
    assert set(found) == {"empty"} and "no .py file or cbatch.toml" in (found["empty"].problem or "")


# --------------------------------------------------------- the grader's time

SLOW = '''
_published_simulate = simulate


def simulate(events, **config):
    import time
    time.sleep(0.3)
    return _published_simulate(events, **config)
'''


def test_the_hidden_child_and_the_graders_work_share_the_submissions_time(tmp_path: Path) -> None:
    text = RUBRIC.replace("call_seconds = 60", "call_seconds = 5\nsubmission_seconds = 2")
    rubric = load_rubric(_rubric(tmp_path, text + f'"{HIDDEN_TEST}" = {{ points = 5 }}\n'))
    plan = build_plan(rubric, _hidden(tmp_path / "hidden", "hx1"))
    folder = published(tmp_path / "slow", SLOW)
    sub = Submission("slow", str(folder), LoadSpec(str(folder), submission_files(str(folder))))
    out = tmp_path / "out"
    out.mkdir()
    result = grade_submission(sub, rubric, plan, out, "process")
    completes = next(t for t in result.tests if t.name == "contract.completes")
    used_up = "used up its 2 s (limit submission_seconds: its calls and the grader's work"
    assert not completes.passed and "used up its 2 s" in completes.output and "not run" in completes.output
    hidden = next(t for t in result.tests if t.name == HIDDEN_TEST)
    assert not hidden.passed  # its child had no time of its own left: the workloads are the submission's
    assert used_up in (out / "hidden-failures.txt").read_text(encoding="utf-8")


def _dies_on_one(submission, rubric, plan, out_dir, sandbox):
    """A stand-in for the worker's grading: the submission "hog" kills its worker, as the OOM killer would."""
    if submission.name == "hog":
        os._exit(9)
    return driver._grade_one(submission, rubric, plan, out_dir, sandbox)


def test_a_worker_killed_for_memory_costs_only_its_own_submission(tmp_path: Path) -> None:
    subs = tmp_path / "subs"
    for name in ("alice", "bob", "carol", "hog"):
        published(subs / name)
    rubric = load_rubric(_rubric(tmp_path))
    plan = build_plan(rubric)
    found = discover(subs)
    events = [e for e in driver._in_pool(found, rubric, plan, tmp_path / "out", 2, "process", _dies_on_one) if e]
    outcome = dict(events)
    assert sorted(outcome) == ["alice", "bob", "carol", "hog"] and len(events) == 4  # each exactly once
    assert isinstance(outcome["hog"], RuntimeError) and "worker process died" in str(outcome["hog"])
    assert all(outcome[n].score == FULL for n in ("alice", "bob", "carol"))


def test_on_a_ray_worker_a_hostile_name_is_graded_under_the_name_it_has_on_the_driver(tmp_path: Path) -> None:
    from pytest_cbatch.grading.bundle import pack, unpack
    from pytest_cbatch.grading.ray_runner import grade_remote
    from pytest_cbatch.grading.shards import kit_version

    subs = tmp_path / "subs"
    folder = published(subs / "caf\udce9 =x")
    (folder / "notes\udcff.txt").write_bytes(b"a file named with invalid UTF-8\n")
    (sub,) = discover(subs)
    assert sub.name == "caf%E9%20%3Dx"
    bundle = pack(sub)
    assert len(bundle.digest()) == 64  # a name of any bytes fingerprints
    (tmp_path / "elsewhere").mkdir()
    unpacked = unpack(bundle, tmp_path / "elsewhere")  # the worker's side: the bundle's safe name, its files
    assert sorted(p.name for p in unpacked.iterdir()) == sorted(p.name for p in folder.iterdir())
    rubric = load_rubric(_rubric(tmp_path))
    returned = grade_remote(bundle, rubric, build_plan(rubric), "process", kit_version(), driver._grade_one, discover)
    assert returned.result.name == sub.name and returned.result.score == FULL


def test_a_failure_text_escapes_what_the_implementation_wrote() -> None:
    from pytest_cbatch.contract import Violation
    from pytest_cbatch.explain import explain_failure

    trace = [{"time": 0, "event": "arrival", "id": "a\x1b[2J", "prompt_tokens": 1, "output_tokens": 1}]
    text = explain_failure(spec="x", clause="completes", workload="w",
                           violations=[Violation("completes", "it raised ValueError: \x1b[31mred\x07\rforged")],
                           trace=trace, config={}, report=None, trace_path="t.jsonl",
                           stack="Traceback\n  \x1b]0;title\x07")
    assert "\x1b" not in text and "\x07" not in text and "\r" not in text and "\\x1b[31mred" in text
