"""What grading believes of a submission: its regular files, nothing through a link, and hidden data kept hidden.

Each test grades a hostile submission of its own and shows the attack it
makes failing; where the attack needs the grader to be otherwise, the test
also shows it working that way (so the test can fail).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
from grading_samples import published

import pytest_cbatch.reference.scheduler_sim as reference_sim
from pytest_cbatch.grading.driver import discover, gradescope_submission
from pytest_cbatch.grading.evaluate import Submission, grade_implementation, grade_submission
from pytest_cbatch.grading.plan import HIDDEN_TEST, build_plan
from pytest_cbatch.grading.results import write_summary
from pytest_cbatch.grading.rubric import load_rubric
from pytest_cbatch.impls import ImplementationError
from pytest_cbatch.sandbox import IsolatedImplementation, LoadSpec, load_spec_for, submission_files
from pytest_cbatch.sandbox.files import SubmissionRefused, copy_submission

TOKEN = "SECRET_TOKEN_4242"
MARK = "zq-secret"


def _rubric(tmp_path: Path, grading: str = "", hidden: str = ""):
    path = tmp_path / "rubric.toml"
    numerics = "" if "numerics" in grading else 'numerics = "off"\n'
    path.write_text('[grading]\ngenerated_examples = 0\nlifecycle_examples = 4\n' + numerics + grading
                    + '[limits]\ncall_seconds = 120\n' + hidden
                    + '[tests]\n"contract.*" = { points = 1 }\n"lifecycle.*" = { points = 1 }\n'
                      '"numerics.*" = { points = 1 }\n', encoding="utf-8")
    return load_rubric(path)


def _secret(tmp_path: Path) -> Path:
    """A file outside every submission (on a grading server: root's), holding a token that is valid Python."""
    secret = tmp_path / "private" / "token.py"
    secret.parent.mkdir()
    secret.write_text(f"{TOKEN}\n", encoding="utf-8")
    secret.chmod(0o600)
    return secret


def _everything(out: Path) -> str:
    return "\n".join(p.read_text(encoding="utf-8", errors="replace") for p in sorted(out.rglob("*")) if p.is_file())


# ------------------------------------------------------------------- links


def test_a_single_file_submission_that_is_a_link_is_refused_and_nothing_is_read_through_it(tmp_path: Path) -> None:
    folder = tmp_path / "submissions"
    folder.mkdir()
    (folder / "mallory.py").symlink_to(_secret(tmp_path))
    (folder / "linked_folder").symlink_to(tmp_path / "private")
    rubric = _rubric(tmp_path, 'parts = ["scheduler"]\n')
    plan = build_plan(rubric)
    subs = {s.name: s for s in discover(folder)}
    assert set(subs) == {"mallory", "linked_folder"}
    out = tmp_path / "out"
    results = []
    for sub in subs.values():
        assert sub.refused and "symbolic link" in sub.refused
        (out / sub.name).mkdir(parents=True)
        results.append(grade_submission(sub, rubric, plan, out / sub.name, "process"))
    write_summary(out / "summary.csv", results)
    for result in results:
        assert result.score == 0 and result.max_score > 0
        assert all(t.output.startswith("not judged: the submission is refused: ") for t in result.tests)
        assert "is a symbolic link; a submission is files, not links" in result.tests[0].output
    text = "\n".join(json.dumps(r.gradescope()) for r in results) + (out / "summary.csv").read_text()
    assert TOKEN not in text and "symbolic link" in (out / "summary.csv").read_text()


def test_a_link_given_straight_to_the_sandbox_is_refused(tmp_path: Path) -> None:
    link = tmp_path / "scheduler_sim.py"
    link.symlink_to(_secret(tmp_path))
    with pytest.raises(ImplementationError, match="symbolic link") as caught:
        IsolatedImplementation("x", LoadSpec(str(link), ("scheduler_sim.py",)), _rubric(tmp_path).limits,
                               mode="process")
    assert TOKEN not in str(caught.value)


def test_a_folder_whose_module_is_a_link_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "submissions" / "mallory"
    folder.mkdir(parents=True)
    (folder / "scheduler_sim.py").symlink_to(_secret(tmp_path))
    assert submission_files(str(folder)) == ()
    (sub,) = discover(folder.parent)
    assert sub.refused and "scheduler_sim.py is a symbolic link" in sub.refused
    # under pytest --cbatch-isolate the same file is named outright: refused, not followed
    with pytest.raises(SubmissionRefused, match="scheduler_sim.py is a symbolic link"):
        copy_submission(str(folder), str(tmp_path / "copy"), ("scheduler_sim.py",))
    spec = load_spec_for(str(folder / "scheduler_sim.py"))
    with pytest.raises(ImplementationError, match="symbolic link") as caught:
        IsolatedImplementation("x", spec, _rubric(tmp_path).limits, mode="process")
    assert TOKEN not in str(caught.value)


def test_gradescope_refuses_a_submission_folder_that_is_a_link(tmp_path: Path) -> None:
    (tmp_path / "root").mkdir()
    published(tmp_path / "elsewhere")
    (tmp_path / "root" / "submission").symlink_to(tmp_path / "elsewhere")
    sub = gradescope_submission(tmp_path / "root")
    assert sub.refused and "symbolic link" in sub.refused


LINK_READER = '''
def simulate(events, **config):
    import os
    found = []
    for name in ("outside.txt", "chain.txt", "inside.py", "folder_link/token.py", "sub/up.txt"):
        try:
            with open(name, encoding="utf-8") as fh:
                found.append(name + ": " + fh.read())
        except OSError:
            pass
    if found:
        raise ValueError("READ " + " | ".join(found))
    return _published_simulate(events, **config)
'''


def test_links_inside_a_folder_are_left_out_of_the_copy_and_named(tmp_path: Path) -> None:
    secret = _secret(tmp_path)
    folder = published(tmp_path / "mallory", "\n_published_simulate = simulate\n" + LINK_READER)
    (folder / "outside.txt").symlink_to(secret)                      # a file outside the submission
    (folder / "step.txt").symlink_to(secret)
    (folder / "chain.txt").symlink_to(folder / "step.txt")           # a chain of links
    (folder / "inside.py").symlink_to(folder / "scheduler_sim.py")   # a link that points back inside
    (folder / "folder_link").symlink_to(secret.parent)               # a folder outside
    (folder / "sub").mkdir()
    (folder / "sub" / "up.txt").symlink_to("../outside.txt")         # relative, through another link
    (folder / "fifo").mkdir()
    os.mkfifo(folder / "fifo" / "pipe")                              # a FIFO: opening it would block
    copied = tmp_path / "copy"
    left_out = copy_submission(str(folder), str(copied), submission_files(str(folder)))
    assert sorted(left_out) == sorted(["chain.txt (a symbolic link)", "folder_link (a symbolic link)",
                                       "inside.py (a symbolic link)", "outside.txt (a symbolic link)",
                                       "step.txt (a symbolic link)", "sub/up.txt (a symbolic link)",
                                       "fifo/pipe (not a regular file)"])
    assert not any(p.is_symlink() for p in copied.rglob("*"))
    assert sorted(p.name for p in copied.iterdir()) == ["fifo", "scheduler_faults.py", "scheduler_sim.py", "sub"]
    rubric = _rubric(tmp_path, 'parts = ["scheduler"]\n')
    out = tmp_path / "out"
    out.mkdir()
    sub = Submission("mallory", str(folder), LoadSpec(str(folder), submission_files(str(folder))))
    result = grade_submission(sub, rubric, build_plan(rubric), out, "process")
    assert result.score == result.max_score, [t.output for t in result.tests if not t.passed][:1]
    assert TOKEN not in json.dumps(result.gradescope())
    assert "left out of the copy: " in result.output and "outside.txt (a symbolic link)" in result.output
    assert any("outside.txt" in flag for flag in result.extra["flags"])


# ------------------------------------------------------------ hidden traces

REMEMBERS = '''
import json as _json

_published_simulate = simulate
_seen = []


def _leak():
    if _seen:
        print("LEAK", _json.dumps(_seen[-1]))
        raise ValueError("LEAK " + _json.dumps(_seen[-1]))


def simulate(events, **config):
    if any("zq-secret" in str(e.get("id")) for e in events):
        _seen.append([events, config])
    else:
        _leak()
    return _published_simulate(events, **config)


_PublishedKV = PagedKV


class PagedKV(_PublishedKV):
    def __init__(self, *args, **kwargs):
        _leak()
        super().__init__(*args, **kwargs)
'''


def _hidden_folder(tmp_path: Path) -> Path:
    hidden = tmp_path / "hidden"
    hidden.mkdir()
    lines = [{"config": {"capacity": 7, "block_size": 2, "token_budget": 3}},
             {"time": 0, "event": "arrival", "id": f"{MARK}-1", "prompt_tokens": 3, "output_tokens": 2},
             {"time": 1, "event": "arrival", "id": f"{MARK}-2", "prompt_tokens": 2, "output_tokens": 1}]
    (hidden / "secret_workload.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines),
                                                  encoding="utf-8")
    return hidden


def _student_visible(result, out: Path) -> str:
    """Everything of ``result`` a student sees, now or after the due date: every test but the hidden ones,
    the top-level output, the files beside results.json that a failure tells them to fetch (all but the
    instructor's hidden-failures.txt)."""
    doc = result.gradescope()
    seen = [doc["output"]] + [json.dumps(t) for t in doc["tests"] if t["visibility"] != "hidden"]
    seen += [p.read_text(encoding="utf-8") for p in out.iterdir() if p.name != "hidden-failures.txt"]
    return "\n".join(seen)


@pytest.mark.parametrize("part", ["lifecycle", "numerics"])
def test_a_hidden_trace_a_submission_remembers_reaches_no_student_visible_output(
        tmp_path: Path, part: str, request: pytest.FixtureRequest) -> None:
    if part == "numerics":  # the same child split as the lifecycle case, at the cost of torch's checks
        if not request.config.getoption("--run-slow"):
            pytest.skip("the numerics case runs with --run-slow (about 30 s); the lifecycle case shows the same")
        pytest.importorskip("torch")
    rubric = _rubric(tmp_path, f'parts = ["scheduler", "{part}"]\n',
                     f'[hidden]\ntraces = "{_hidden_folder(tmp_path).name}"\n')
    plan = build_plan(rubric)
    assert plan.counts()["hidden"] == 1
    folder = published(tmp_path / "remembers", REMEMBERS)
    sub = Submission("remembers", str(folder), LoadSpec(str(folder), submission_files(str(folder))))
    # Even in the child that answers the visible tests, the hidden workloads run after every visible test
    # (lifecycle and numerics included), so nothing it remembers of them has a visible call left to show in:
    out = tmp_path / "shared-child"
    out.mkdir()
    impl = IsolatedImplementation("remembers", sub.load, rubric.limits, mode="process")
    try:
        shared = grade_implementation(impl, "remembers", rubric, plan, out)
    finally:
        impl.close()
    assert MARK not in _student_visible(shared, out)
    assert shared.score == shared.max_score
    # Graded as a submission, the hidden workloads have a child of their own: nothing of them shows.
    out = tmp_path / "graded"
    out.mkdir()
    result = grade_submission(sub, rubric, plan, out, "process")
    visible = _student_visible(result, out)
    assert MARK not in visible and '"capacity": 7' not in visible
    assert result.score == result.max_score, [t.output for t in result.tests if not t.passed][:1]
    hidden = next(t for t in result.tests if t.name == HIDDEN_TEST)
    assert hidden.passed and hidden.output == "passed: every clause held on every hidden workload"


FAILS_HIDDEN = '''
_published_simulate = simulate


def simulate(events, **config):
    if any("zq-secret" in str(e.get("id")) for e in events):
        print("HIDDEN", events)
        raise KeyError("HIDDEN " + repr(events) + repr(config))
    return _published_simulate(events, **config)
'''


@pytest.mark.parametrize("reveal", ["outcome", "clauses"])
def test_a_failure_on_a_hidden_workload_goes_to_the_instructor_only(tmp_path: Path, reveal: str) -> None:
    rubric = _rubric(tmp_path, 'parts = ["scheduler"]\n',
                     f'[hidden]\ntraces = "{_hidden_folder(tmp_path).name}"\nreveal = "{reveal}"\n')
    folder = published(tmp_path / "fails_hidden", FAILS_HIDDEN)
    sub = Submission("fails_hidden", str(folder), LoadSpec(str(folder), submission_files(str(folder))))
    out = tmp_path / "out"
    out.mkdir()
    result = grade_submission(sub, rubric, build_plan(rubric), out, "process")
    completes = next(t for t in result.tests if t.name == "contract.completes")
    if reveal == "outcome":  # one bit: the hidden workloads' own test failed; no clause's test says more
        hidden = next(t for t in result.tests if t.name == HIDDEN_TEST)
        assert completes.passed and not hidden.passed and "withheld" in hidden.output
    else:  # a bit per clause, as the rubric chose
        assert HIDDEN_TEST not in [t.name for t in result.tests]
        assert not completes.passed and "failed on hidden workloads (which and how many is withheld)" in \
            completes.output
    assert MARK not in _student_visible(result, out)
    assert MARK in (out / "hidden-failures.txt").read_text(encoding="utf-8")


# ------------------------------------------------------- the kit's own code

CHEAT = {
    "scheduler_sim.py": "from pytest_cbatch.reference.scheduler_sim import *\n",
    "scheduler_faults.py": "from pytest_cbatch.reference.scheduler_faults import *\n",
}
DODGES = {
    "computed_name": ("import importlib\n_m = importlib.import_module('pytest_cbatch.' + 'refer' + 'ence.scheduler_sim')\n"
                      "simulate = _m.simulate\n", 2),
    "dunder_import": ("_m = __import__('pytest_cbatch.reference.scheduler_sim', fromlist=['simulate'])\n"
                      "simulate = _m.simulate\n", 1),
    "reads_and_execs": ("import os, pytest_cbatch\n_ns = {'__name__': 'x'}\n"
                        "for _p in (os.path.join(os.path.dirname(pytest_cbatch.__file__), 'reference', 'scheduler_sim.py'),\n"
                        "           os.path.join(os.path.dirname(pytest_cbatch.__file__), '..', 'reference', 'scheduler_sim.py')):\n"
                        "    try:\n        exec(open(_p).read(), _ns)\n    except OSError:\n        pass\n"
                        "simulate = _ns.get('simulate')\n", 6),
    "removes_the_watch": ("import sys\nsys.meta_path[:] = [f for f in sys.meta_path if type(f).__name__ != 'Watch']\n"
                          "import importlib\n_m = importlib.import_module('pytest_cbatch.reference.scheduler_sim')\n"
                          "simulate = _m.simulate\n", 4),
    "from_the_package": ("from pytest_cbatch import reference\nsimulate = reference.simulate\n", 1),
    "catches_and_waits": ("def simulate(events, **config):\n    try:\n        import pytest_cbatch.lifecycle.oracle\n"
                          "    except ImportError:\n        pass\n    raise ValueError('nothing to run')\n", 3),
}


def _grade_folder(tmp_path: Path, name: str, files: dict[str, str], rubric, mode: str = "process"):
    folder = tmp_path / "subs" / name
    folder.mkdir(parents=True)
    for file, text in files.items():
        (folder / file).write_text(text, encoding="utf-8")
    out = tmp_path / "out" / name
    out.mkdir(parents=True)
    sub = Submission(name, str(folder), LoadSpec(str(folder), submission_files(str(folder))))
    return grade_submission(sub, rubric, build_plan(rubric), out, mode)


@pytest.mark.parametrize("mode", ["process", "auto"])
def test_a_submission_that_only_imports_the_reference_is_refused_and_flagged(tmp_path: Path, mode: str) -> None:
    rubric = _rubric(tmp_path, 'parts = ["scheduler", "lifecycle"]\n')
    result = _grade_folder(tmp_path, "cheat", CHEAT, rubric, mode)
    assert result.score == 0 and result.max_score > 0
    use = "scheduler_sim.py line 1 imports pytest_cbatch.reference.scheduler_sim"
    assert all(t.output.startswith("not judged: the submission is refused: it uses the kit's own code")
               and use in t.output for t in result.tests), result.tests[0].output
    write_summary(tmp_path / "summary.csv", [result])
    assert f"uses the kit's code: {use}" in (tmp_path / "summary.csv").read_text(encoding="utf-8")
    allowed = _rubric(tmp_path, 'parts = ["scheduler", "lifecycle"]\nkit_imports = "allow"\n')
    graded = _grade_folder(tmp_path / "allowed", "cheat", CHEAT, allowed, mode)
    assert graded.score == graded.max_score and f"uses the kit's code (allowed by the rubric): {use}" in \
        graded.extra["flags"]


@pytest.mark.parametrize("dodge", sorted(DODGES))
def test_a_dodged_import_of_the_kit_is_caught_with_the_submissions_file_and_line(tmp_path: Path, dodge: str) -> None:
    source, line = DODGES[dodge]
    rubric = _rubric(tmp_path, 'parts = ["scheduler"]\n')
    result = _grade_folder(tmp_path, dodge, {"scheduler_sim.py": source}, rubric)
    assert result.score == 0
    assert f"scheduler_sim.py line {line} " in result.tests[0].output, result.tests[0].output
    assert "uses the kit's code: scheduler_sim.py" in "; ".join(result.extra["flags"])


def test_in_bubblewrap_the_reference_is_not_there_unless_the_rubric_allows_it(tmp_path: Path) -> None:
    from pytest_cbatch.sandbox import bwrap_problem
    from pytest_cbatch.sandbox.guard import KitGuard

    if bwrap_problem():
        pytest.skip(f"bubblewrap cannot run here: {bwrap_problem()}")
    folder = Path(reference_sim.__file__).parent
    probe = tmp_path / "probe.py"
    probe.write_text(f"import os\n\ndef simulate(events, **config):\n    raise ValueError(str(os.listdir({str(folder)!r})))\n",
                     encoding="utf-8")
    for refuse, visible in ((True, False), (False, True)):
        impl = IsolatedImplementation("probe", LoadSpec(str(probe), ("probe.py",)), _rubric(tmp_path).limits,
                                      mode="bwrap", guard=KitGuard(refuse=refuse))
        try:
            outcome = impl.run([], {})
        finally:
            impl.close()
        assert ("scheduler_sim.py" in (outcome.refused or "")) is visible, outcome.refused


# ------------------------------------------------------------ what a failure shows

CRASHES = '''
def _pick(config):
    return config["admission"]


def simulate(events, **config):
    _pick(config)
'''


def test_a_sandboxed_crash_shows_the_submissions_own_traceback_relative_to_it(tmp_path: Path) -> None:
    rubric = _rubric(tmp_path, 'parts = ["scheduler"]\n')
    result = _grade_folder(tmp_path, "crashes", {"scheduler_sim.py": CRASHES}, rubric)
    completes = next(t for t in result.tests if t.name == "contract.completes")
    assert "KeyError: 'admission'" in completes.output
    assert 'File "scheduler_sim.py", line 3, in _pick' in completes.output, completes.output
    assert 'File "scheduler_sim.py", line 7, in simulate' in completes.output
    assert "child.py" not in completes.output and str(tmp_path) not in completes.output


def test_a_load_failure_names_the_submissions_line_not_the_graders(tmp_path: Path) -> None:
    rubric = _rubric(tmp_path, 'parts = ["scheduler"]\n')
    result = _grade_folder(tmp_path, "unloadable", {"scheduler_sim.py": "x = 1\nraise RuntimeError('at import')\n"},
                           rubric)
    text = result.tests[0].output
    assert 'File "scheduler_sim.py", line 2, in <module>' in text and "RuntimeError: at import" in text, text
    assert "child.py" not in text and "importlib" not in text


SLOW_IMPORT = "import time\ntime.sleep(2.5)\n\n\ndef simulate(events, **config):\n    raise NotImplementedError\n"


def test_the_start_up_import_has_its_own_limit_larger_than_a_calls(tmp_path: Path) -> None:
    (tmp_path / "slow.py").write_text(SLOW_IMPORT, encoding="utf-8")
    spec = LoadSpec(str(tmp_path / "slow.py"), ("slow.py",))
    from pytest_cbatch.sandbox import Limits

    assert Limits().import_seconds > Limits().call_seconds
    impl = IsolatedImplementation("slow", spec, Limits(call_seconds=1, import_seconds=600), mode="process")
    impl.close()  # loaded: the import took longer than a call may
    with pytest.raises(ImplementationError, match=r"did not finish within 1 s \(limit import_seconds\)"):
        IsolatedImplementation("slow", spec, Limits(call_seconds=1, import_seconds=1), mode="process")


LOOPS = '''
def _spin(n):
    while True:
        n += 1


def simulate(events, **config):
    _spin(0)
'''


def test_a_call_stopped_at_its_limit_shows_the_line_the_submission_was_looping_on(tmp_path: Path) -> None:
    from pytest_cbatch.sandbox import Limits

    (tmp_path / "loops.py").write_text(LOOPS, encoding="utf-8")
    impl = IsolatedImplementation("loops", LoadSpec(str(tmp_path / "loops.py"), ("loops.py",)),
                                  Limits(call_seconds=2), mode="process")
    try:
        outcome = impl.run([], {})
    finally:
        impl.close()
    assert outcome.stopped and "did not answer within 2 s" in outcome.stopped
    assert re.search(r'File "loops.py", line [34], in _spin', outcome.stack), outcome.stack  # the loop's lines
    assert 'File "loops.py", line 8, in simulate' in outcome.stack and "child.py" not in outcome.stack


def test_under_cbatch_isolate_a_crash_shows_the_submissions_own_traceback(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(crashes=CRASHES)
    result = pytester.runpytest_subprocess("--cbatch-isolate", "--cbatch-sandbox=process", "--cbatch-impl=crashes.py",
                                           "-k", "completes and demo", "-p", "no:cacheprovider")
    assert result.parseoutcomes().get("failed"), result.stdout.str()[-2000:]
    # (makepyfile drops the source's first, empty line)
    result.stdout.fnmatch_lines(['*File "crashes.py", line 2, in _pick*', "*KeyError: 'admission'*"])
    assert "child.py" not in result.stdout.str()


LOOPING_KV = '''
class PagedKV:
    def __init__(self, *args, **kwargs):
        self.n = 0
        while True:
            self.n += 1
'''


def test_a_lifecycle_call_stopped_at_its_limit_shows_the_line_it_was_at(tmp_path: Path) -> None:
    from hypothesis import settings as Settings

    from pytest_cbatch.lifecycle import lifecycle_verdicts
    from pytest_cbatch.sandbox import Limits

    (tmp_path / "kv.py").write_text(LOOPING_KV, encoding="utf-8")
    impl = IsolatedImplementation("kv", LoadSpec(str(tmp_path / "kv.py"), ("kv.py",)), Limits(call_seconds=2),
                                  mode="process")
    try:
        verdicts = lifecycle_verdicts("allocator", impl.namespace, Settings(max_examples=2, database=None,
                                                                            deadline=None))
    finally:
        impl.close()
    failed = [v.message for v in verdicts.values() if v.status == "fail"]
    assert failed and "did not return" in failed[0], verdicts
    assert re.search(r'File "kv.py", line [56], in __init__', failed[0]), failed[0]


def test_an_installed_kit_has_an_empty_tmpfs_over_its_reference_in_bubblewrap(tmp_path: Path, monkeypatch) -> None:
    """Installed into site-packages, the reference lies inside a bound folder: an empty tmpfs covers it."""
    from pytest_cbatch.sandbox import bwrap

    site = "/opt/venv/lib/python3/site-packages"
    monkeypatch.setattr(bwrap.shutil, "which", lambda name: "/usr/bin/bwrap")
    monkeypatch.setattr(bwrap, "_python_roots", lambda modules: [site])
    monkeypatch.setattr(bwrap, "_package_folders", lambda names: [f"{site}/pytest_cbatch/reference"])
    monkeypatch.setattr(bwrap.os, "geteuid", lambda: 1000)
    for reference, covered in ((False, True), (True, False)):
        argv = list(bwrap.confine(str(tmp_path), str(tmp_path / "work"), True, 8, (), reference=reference).prefix)
        pairs = list(zip(argv, argv[1:]))
        assert (("--tmpfs", f"{site}/pytest_cbatch/reference") in pairs) is covered
        if covered:
            assert pairs.index(("--tmpfs", f"{site}/pytest_cbatch/reference")) > argv.index(site)
