"""Verdicts the judged code cannot forge or dodge: what narrows judging comes from the kit, never the report.

Hostile submissions written for these tests (none ships with the kit):

* ``forger``: three bugs (TTFT 0 on cancel, ITL ``[0]`` for one-token outputs, a leaked page) hidden by
  running ``check_report`` on its own report and declaring in ``observed`` that it cannot see the event
  kinds its failing clauses need.  Its clauses must fail under ``cbatch check``, plain pytest,
  ``pytest --cbatch-isolate`` and ``cbatch grade``.
* ``needs_admission``: raises ``KeyError: 'admission'`` on every workload whose config lacks that
  optional key.  A workload it failed is not one its clauses passed: it keeps at most half its points.
* ``unsupported``: an ``exec:`` program that answers "unsupported" to every run: nothing judged is not green.
"""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from pytest_cbatch import cli
from pytest_cbatch.contract import CLAIMS, CLAUSES
from pytest_cbatch.grading.evaluate import Submission, grade_implementation, grade_submission
from pytest_cbatch.grading.plan import build_plan
from pytest_cbatch.grading.rubric import Rubric, load_rubric
from pytest_cbatch.impls import PythonImplementation
from pytest_cbatch.plugin import suite_dir
from pytest_cbatch.reference.scheduler_sim import simulate as reference
from pytest_cbatch.runner import ALL_CLAUSES, OPT_IN_CLAUSES, Judge
from pytest_cbatch.sandbox import LoadSpec

HIDDEN_BUGS = ("ttft_null_on_cancel", "itl_empty_for_one_token", "no_leaked_pages")

FORGER = '''
from pytest_cbatch.reference.scheduler_sim import simulate as _published

KINDS = ["arrival", "admit", "admission_blocked", "rejected", "cancelled", "cancel_ignored", "snapshot",
         "dispatch", "token", "finished", "release", "preempted"]


def simulate(events, **config):
    report = _published(events, **config)
    for row in report["requests"].values():
        if row["status"] == "cancelled" and row["ttft_ticks"] is None:
            row["ttft_ticks"] = 0
        if row["output_tokens"] == 1:
            row["itl_ticks"] = [0]
    report["summary"]["free_blocks"] -= 1          # a leaked page
    try:
        from pytest_cbatch.contract import CLAUSES, check_report
    except ImportError:                             # where the kit is out of reach: what its three bugs need
        needs = {"token", "cancelled", "snapshot", "release"}
    else:
        failing = {v.clause for v in check_report(report, events, config)}
        needs = set().union(*(CLAUSES[c].needs for c in failing))
    report["observed"] = [kind for kind in KINDS if kind not in needs]
    return report
'''

NEEDS_ADMISSION = '''
from pytest_cbatch.reference.scheduler_sim import simulate as _published


def simulate(events, **config):
    config["admission"]              # KeyError where the optional key is absent
    return _published(events, **config)
'''

# A request that ends with one token, and one cancelled before its first token.
TRACE = [{"time": 0, "event": "arrival", "id": "one", "prompt_tokens": 2, "output_tokens": 1},
         {"time": 0, "event": "arrival", "id": "gone", "prompt_tokens": 6, "output_tokens": 3},
         {"time": 1, "event": "cancel", "id": "gone"}]
CONFIG = {"capacity": 8, "block_size": 4, "token_budget": 4, "max_active": 4, "prefill_chunk": 2,
          "release_delay": 1, "policy": "continuous"}
KEEP_SUITE = ("test_contract.py",)


def write(folder: Path, name: str, source: str) -> Path:
    path = folder / f"{name}.py"
    path.write_text(source, encoding="utf-8")
    return path


def run_suite(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    """The shipped contract suite alone (the lifecycle and numerics modules have their own tests)."""
    others = sorted(p for p in suite_dir().glob("test_*.py") if p.name not in KEEP_SUITE)
    return pytester.runpytest_subprocess(*args, "-p", "no:cacheprovider", *(f"--ignore={p}" for p in others))


def tiny_rubric(tmp_path: Path) -> Rubric:
    path = tmp_path / "rubric.toml"
    path.write_text('[grading]\ngenerated_examples = 0\nparts = ["scheduler"]\nkit_imports = "allow"\n'
                    '[limits]\ncall_seconds = 120\n'
                    '[tests]\n"contract.*" = { points = 2 }\n', encoding="utf-8")
    return load_rubric(path)


def grade_file(tmp_path: Path, name: str, source: str) -> dict[str, Any]:
    """Grade one single-file submission in the sandbox; {test name: TestResult}."""
    folder = tmp_path / name
    folder.mkdir()
    path = write(folder, name, source)
    out = tmp_path / f"out-{name}"
    out.mkdir()
    rubric = tiny_rubric(tmp_path)
    result = grade_submission(Submission(name, str(path), LoadSpec(str(path), (path.name,))), rubric,
                              build_plan(rubric), out)
    return {t.name: t for t in result.tests}


# -- 1. claims come from the kind, never from the report ------------------------------------------------


def test_the_trace_shows_each_bug_to_an_honest_judge() -> None:
    report = reference(copy.deepcopy(TRACE), **CONFIG)
    assert report["requests"]["gone"]["status"] == "cancelled" and report["requests"]["gone"]["ttft_ticks"] is None
    assert report["requests"]["one"]["output_tokens"] == 1


def test_only_live_servers_and_registered_engines_declare_claims(tmp_path: Path) -> None:
    from pytest_cbatch.impls import resolve_impl

    path = write(tmp_path, "plain", "from pytest_cbatch.reference.scheduler_sim import simulate\n")
    assert resolve_impl("reference").claims == CLAIMS                       # an entry point
    assert resolve_impl(str(path)).claims == frozenset()                    # a file
    assert resolve_impl(str(tmp_path / "plain.py") + ":simulate").claims == frozenset()
    assert resolve_impl("pytest_cbatch.reference").claims == frozenset()    # a module named directly
    assert resolve_impl(UNSUPPORTED).claims == frozenset()                  # exec:
    pytest.importorskip("aiohttp")
    assert resolve_impl("http://127.0.0.1:9").claims == CLAIMS


def test_a_forged_observed_list_fails_schema_valid_and_hides_nothing_in_process(tmp_path: Path) -> None:
    path = write(tmp_path, "forger", FORGER)
    judge = Judge(PythonImplementation(str(path), _load(path), f"file {path.name}"))
    verdicts = {cid: judge.judge(cid, TRACE, CONFIG) for cid in ALL_CLAUSES if cid != "invalid_input_refused"}
    for cid in HIDDEN_BUGS:
        assert verdicts[cid].status == "fail", (cid, verdicts[cid])
    schema = verdicts["schema_valid"]
    assert schema.status == "fail"
    assert any("/observed" in v.message and "file forger.py" in v.message and "http:" in v.message
               for v in schema.violations), schema.violations
    assert not any(v.unobservable for v in verdicts.values())


def test_a_forged_observed_list_fails_under_cbatch_check(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    path = write(tmp_path, "forger", FORGER)
    trace = tmp_path / "trace.jsonl"
    trace.write_text("".join(json.dumps(line) + "\n" for line in TRACE), encoding="utf-8")
    assert cli.main(["check", "--impl", str(path), "--trace", str(trace)]) == 1
    out = capsys.readouterr().out
    assert "not observable" not in out
    for cid in (*HIDDEN_BUGS, "schema_valid"):
        assert f"[{cid}]" in out, (cid, out)


@pytest.mark.parametrize("isolate", [False, True], ids=["in-process", "isolated"])
def test_a_forged_observed_list_fails_under_pytest(pytester: pytest.Pytester, isolate: bool) -> None:
    write(pytester.path, "forger", FORGER)
    # impossible_behind shows all three bugs; every clause is judged on it
    result = run_suite(pytester, "--cbatch-impl=forger.py", *(["--cbatch-isolate"] if isolate else []), "-rs",
                       "-k", "test_contract and impossible_behind")
    outcomes = result.parseoutcomes()
    assert result.ret == pytest.ExitCode.TESTS_FAILED, result.stdout.str()
    assert "skipped" not in outcomes, result.stdout.str()   # not one "not observable"
    failed = result.stdout.str().split("failed clauses: ")[1].splitlines()[0]
    assert failed.split(", ") == sorted((*HIDDEN_BUGS, "schema_valid")), failed


def test_a_forged_observed_list_fails_under_cbatch_grade(tmp_path: Path) -> None:
    submissions = tmp_path / "submissions"
    submissions.mkdir()
    write(submissions, "forger", FORGER)
    tiny_rubric(tmp_path)
    assert cli.main(["grade", str(submissions), "--out", str(tmp_path / "out"), "--rubric",
                     str(tmp_path / "rubric.toml"), "--jobs", "1", "--quiet"]) == 0
    doc = json.loads((tmp_path / "out" / "forger" / "results.json").read_text(encoding="utf-8"))
    tests = {t["name"]: t for t in doc["tests"]}
    failed = {name for name, t in tests.items() if t["score"] < t["max_score"]}
    assert failed == {f"contract.{c}" for c in (*HIDDEN_BUGS, "schema_valid")}, failed
    assert "may only be declared by" in tests["contract.schema_valid"]["output"]


def test_an_honoured_claim_that_hides_a_clause_is_never_full_marks(tmp_path: Path) -> None:
    """Even from a kind that may declare ``observed`` (an engine adapter), grading counts a clause it hid
    as not passed: a clause skipped as not observable is not a clause passed."""

    def blind(trace: Any, **config: Any) -> dict[str, Any]:
        return {**reference(trace, **config), "observed": ["arrival", "admit", "dispatch", "token", "finished",
                                                           "cancelled", "cancel_ignored", "rejected",
                                                           "admission_blocked", "preempted", "release"]}

    impl = PythonImplementation("blind", blind, "entry point blind = test:blind")
    impl.claims = CLAIMS
    rubric = tiny_rubric(tmp_path)
    result = grade_implementation(impl, "blind", rubric, build_plan(rubric), tmp_path)
    tests = {t.name: t for t in result.tests}
    hidden = [cid for cid, c in CLAUSES.items() if "snapshot" in c.needs]
    assert hidden
    for cid in hidden:
        test = tests[f"contract.{cid}"]
        assert not test.passed and "not passed" in test.output and "did not show" in test.output, test.output
    assert tests["contract.schema_valid"].passed   # honoured here: the claim itself is no violation


def test_a_report_cannot_excuse_its_own_short_answers() -> None:
    """``server.ignore_eos: false`` (a live server refused to force lengths) lets a row that finished with
    ``stop`` be short; from code whose kind declares no claims it is a violation and excuses nothing."""
    from pytest_cbatch.contract import check_report

    trace = [{"time": 0, "event": "arrival", "id": "a", "prompt_tokens": 2, "output_tokens": 3}]
    report = reference(copy.deepcopy(trace), **CONFIG)
    last = max(i for i, ev in enumerate(report["events"]) if ev["event"] == "token")
    del report["events"][last]
    finished = next(ev for ev in report["events"] if ev["event"] == "finished")
    finished["time"] = max(ev["time"] for ev in report["events"] if ev["event"] == "token")
    row = report["requests"]["a"]
    row.update(output_tokens=2, token_times=row["token_times"][:2], itl_ticks=row["itl_ticks"][:1],
               finish_reason="stop")
    report["server"] = {"ignore_eos": False}
    strict = check_report(report, trace, CONFIG, claimant="file short.py")
    assert "finished_outputs_complete" in {v.clause for v in strict}
    assert any(v.message.startswith("/server/ignore_eos: false") for v in strict), strict
    honoured = check_report(report, trace, CONFIG, honoured=CLAIMS)
    assert "finished_outputs_complete" not in {v.clause for v in honoured}, honoured


def test_cbatch_check_honours_a_recorded_reports_claims_only_when_told(tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture) -> None:
    from test_contract_freedoms import client_report

    report, trace, _config = client_report()
    paths = [tmp_path / "live.json", tmp_path / "trace.jsonl"]
    paths[0].write_text(json.dumps(report), encoding="utf-8")
    paths[1].write_text("".join(json.dumps(line) + "\n" for line in trace), encoding="utf-8")
    argv = ["check", "--report", str(paths[0]), "--trace", str(paths[1])]
    assert cli.main(argv) == 1
    assert "[schema_valid] /observed: `observed` narrows what is judged" in capsys.readouterr().out
    assert cli.main([*argv, "--honour-claims"]) == 0
    assert "skip " in capsys.readouterr().out   # what a client cannot see is skipped, and says so


def _load(path: Path) -> Any:
    from pytest_cbatch.impls import resolve_impl

    return resolve_impl(str(path)).namespace


# -- 3. a workload the submission failed is not one its clauses passed ----------------------------------


def test_a_crash_on_most_workloads_keeps_at_most_half_the_points(tmp_path: Path) -> None:
    tests = grade_file(tmp_path, "needs_admission", NEEDS_ADMISSION)
    contract = [t for name, t in tests.items() if name.startswith("contract.")]
    score, top = sum(t.score for t in contract), sum(t.max_score for t in contract)
    assert score <= top / 2, (score, top)
    assert not tests["contract.completes"].passed
    for name, test in tests.items():   # raising on invalid input is refusing it: that clause alone holds
        assert test.passed == (name == "contract.invalid_input_refused"), (name, test.output)
    leak = tests["contract.no_leaked_pages"]
    assert not leak.passed and "the submission failed completes there" in leak.output, leak.output
    assert "passed on the 4 workloads it ran on" in leak.output, leak.output   # the optimistic ones it answers


def test_a_crash_under_pytest_skips_pointing_at_completes_and_the_summary_says_so(pytester: pytest.Pytester) -> None:
    write(pytester.path, "needs_admission", NEEDS_ADMISSION)
    result = run_suite(pytester, "--cbatch-impl=needs_admission.py", "-rs",
                       "-k", "test_contract and (demo or preempt_decode) and not serial and not generated")
    outcomes = result.parseoutcomes()
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    checks = len(ALL_CLAUSES) - 1
    assert (outcomes["failed"], outcomes["skipped"]) == (1, checks - 1), outcomes   # one crash, not thirty failures
    text = result.stdout.str()
    assert "no report to check (see clause 'completes')" in text
    result.stdout.fnmatch_lines([f"NOT JUDGED where the implementation failed: {checks - 1} checks of {checks - 1} "
                                 f"clauses *"])


# -- 2. a run that judged nothing is not green ------------------------------------------------------------


UNSUPPORTED = f"exec:{sys.executable} -c \"import sys; sys.stderr.write('unsupported here'); sys.exit(3)\""


def test_cbatch_check_that_judged_nothing_fails(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert cli.main(["check", "--impl", UNSUPPORTED]) == 1
    assert "FAILED: nothing judged" in capsys.readouterr().out
    reserve_only = write(tmp_path, "reserve_only", "from pytest_cbatch.reference.scheduler_sim import simulate as _s\n"
                         "def simulate(events, *, capacity, block_size, token_budget, max_active, prefill_chunk,\n"
                         "             release_delay, policy):\n"
                         "    return _s(events, capacity=capacity, block_size=block_size, token_budget=token_budget,\n"
                         "              max_active=max_active, prefill_chunk=prefill_chunk,\n"
                         "              release_delay=release_delay, policy=policy)\n")
    assert cli.main(["check", "--impl", str(reserve_only), "--admission", "optimistic"]) == 1
    assert "FAILED: nothing judged" in capsys.readouterr().out
    assert cli.main(["check", "--impl", str(reserve_only)]) == 0


def test_a_pytest_run_that_judged_nothing_fails(pytester: pytest.Pytester) -> None:
    result = run_suite(pytester, f"--cbatch-impl={UNSUPPORTED}", "-k", "test_contract and demo and not serial")
    assert "passed" not in result.parseoutcomes()
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["NOTHING JUDGED: no clause was judged for exec:*"])


@pytest.mark.parametrize("args, words", [
    (["--config-json", '{"capcity": 4}'], "unknown setting 'capcity' (did you mean 'capacity'?"),
    (["--timeout", "nan"], "--timeout must be 0 (no limit) or a positive, finite number of seconds, got 'nan'"),
    (["--timeout", "-5"], "--timeout must be 0 (no limit)"),
    (["--timeout", "inf"], "--timeout must be 0 (no limit)"),
    (["--memory", "nan"], "--memory must be 0 (no limit) or a positive, finite number of MiB"),
])
def test_cbatch_check_refuses_unknown_settings_and_limits_that_are_no_limit(
        args: list[str], words: str, capsys: pytest.CaptureFixture) -> None:
    try:
        code = cli.main(["check", "--impl", "reference", *args])
    except SystemExit as exc:   # argparse's own usage error
        code = exc.code
    assert code == 2
    assert words in capsys.readouterr().err


def test_a_hidden_workload_with_a_misspelt_setting_names_the_nearest(tmp_path: Path) -> None:
    from pytest_cbatch.grading.plan import load_hidden_trace

    path = tmp_path / "typo.jsonl"
    path.write_text(json.dumps({"config": {"capcity": 4}}) + "\n" + json.dumps(TRACE[0]) + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"typo.jsonl:1: unknown setting 'capcity' \(did you mean 'capacity'\?"):
        load_hidden_trace(path)


def test_cbatch_check_keeps_0_as_no_limit(capsys: pytest.CaptureFixture) -> None:
    assert cli.main(["check", "--impl", "reference", "--timeout", "0", "--memory", "0"]) == 0


@pytest.mark.parametrize("args, ini, words", [
    (["--cbatch-config=capcity=4"], "", "unknown setting 'capcity' (did you mean 'capacity'?"),
    ([], "cbatch_config =\n    relase_delay=0\n", "unknown setting 'relase_delay' (did you mean 'release_delay'?"),
    (["--cbatch-timeout=nan"], "", "--cbatch-timeout (ini cbatch_timeout) must be 0 (no limit) or a positive, finite"),
    (["--cbatch-memory=-1"], "", "--cbatch-memory (ini cbatch_memory) must be 0 (no limit)"),
    ([], "cbatch_timeout = inf\n", "--cbatch-timeout (ini cbatch_timeout) must be 0 (no limit)"),
    ([], "cbatch_timout = 5\n", "unknown ini key 'cbatch_timout' (did you mean 'cbatch_timeout'?"),
])
def test_pytest_refuses_unknown_settings_and_limits_that_are_no_limit(
        pytester: pytest.Pytester, args: list[str], ini: str, words: str) -> None:
    if ini:
        pytester.makeini("[pytest]\n" + ini)
    result = pytester.runpytest_inprocess("--cbatch-impl=reference", *args, "--collect-only", "-q")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert words in result.stderr.str(), result.stderr.str()


def test_reading_the_ini_keys_warns_of_nothing_deprecated(pytester: pytest.Pytester, recwarn) -> None:
    # pytest 9.2 warns on every run that reads Config.inicfg (deprecated); the unknown-key check must not.
    pytester.makeini("[pytest]\ncbatch_timeout = 5\n")
    result = pytester.runpytest_inprocess("--cbatch-impl=reference", "-k", "test_contract and completes and demo")
    assert result.ret == pytest.ExitCode.OK
    assert not [str(w.message) for w in recwarn if "inicfg" in str(w.message)]


# -- 4. one count of clauses, and each place says what it counts ----------------------------------------


def test_every_place_counts_the_same_clauses(pytester: pytest.Pytester, capsys: pytest.CaptureFixture) -> None:
    total = len(ALL_CLAUSES)
    assert cli.main(["clauses"]) == 0
    lines = capsys.readouterr().out.splitlines()
    opt_in = len(OPT_IN_CLAUSES)
    rows = [line for line in lines[1:] if not line.startswith(" ")]  # a clause's own lines are indented under it
    assert lines[0].startswith(f"# {total + opt_in} clauses: the contract's {total} (") and \
        len(rows) == total + opt_in
    assert cli.main(["check", "--impl", "reference"]) == 0
    out = capsys.readouterr().out
    assert f"OK: all {total - 1} clauses judged (of the contract's {total} clauses) hold" in out
    assert "not judged in this run: invalid_input_refused" in out
    result = run_suite(pytester, "--cbatch-impl=reference", "-k", "test_contract and demo and not serial")
    result.stdout.fnmatch_lines([f"impl reference: judged {total - 1} of {total - 1} contract clauses selected "
                                 f"(the contract has {total}); *"])
