"""The pytest plugin end to end, run through ``pytester`` from a user's own project.

Most runs are subprocesses: selecting an implementation loads a hypothesis
profile (global state) and loads implementation files as modules, neither of
which may leak into this process.  Runs that stop at a usage error in
``pytest_configure``, before any of that happens, are in-process.  Most runs
collect ``test_contract.py`` alone (``run_contract``) and select a ``-k``
subset; only ``test_shipped_suite_passes_on_reference_from_an_empty_directory``
runs the whole suite, and ``test_suite_runs_under_strict_markers`` collects it.
"""

from __future__ import annotations

import importlib.util

import os
import re
import shlex
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Callable

import pytest

from pytest_cbatch import cli
from pytest_cbatch.explain import clause_statement
from pytest_cbatch.plugin import suite_dir
from pytest_cbatch.runner import ALL_CLAUSES
from pytest_cbatch.workloads import WORKLOADS

OK = pytest.ExitCode.OK
USAGE_ERROR = pytest.ExitCode.USAGE_ERROR

# test_contract on the demo workload alone: one test per clause (invalid_input_refused has workloads of its
# own).  Other suite modules are left out so that the expected counts below are exact.
DEMO = "test_contract and demo and not serial"
DEMO_CHECKS = len([c for c in ALL_CLAUSES if c != "invalid_input_refused"])

WRAPPER = """
    from pytest_cbatch.reference.scheduler_sim import simulate as _s

    def simulate(trace, **config):
        return _s(trace, **config)
"""

EXEC_SCRIPT = """
    import json
    import sys

    from pytest_cbatch.reference.scheduler_sim import simulate

    payload = json.load(sys.stdin)
    try:
        report = simulate(payload["trace"], **payload["config"])
    except ValueError as exc:
        sys.exit(f"refused: {exc}")
    json.dump(report, sys.stdout)
"""

NO_ADMISSION = """
    from pytest_cbatch.reference.scheduler_sim import simulate as _s

    def simulate(trace, *, capacity, block_size, token_budget, max_active, prefill_chunk, release_delay, policy):
        return _s(trace, capacity=capacity, block_size=block_size, token_budget=token_budget,
                  max_active=max_active, prefill_chunk=prefill_chunk, release_delay=release_delay, policy=policy)
"""

CAPACITY_ONLY = """
    from pytest_cbatch.reference.scheduler_sim import simulate as _s

    def simulate(trace, *, capacity):
        return _s(trace, capacity=capacity)
"""

TTFT_ZERO_ON_CANCEL = """
    from pytest_cbatch.reference.scheduler_sim import simulate as _s

    def simulate(trace, **config):
        report = _s(trace, **config)
        for row in report["requests"].values():
            if row["status"] == "cancelled" and not row["token_times"]:
                row["ttft_ticks"] = 0  # the bug: TTFT 0 instead of null
        return report
"""

# Writes the hypothesis profile that is really active at the end of the run (not what any header claims).
PROFILE_PROBE = """
    from hypothesis import settings

    settings.register_profile("mine", max_examples=7)

    def pytest_terminal_summary(terminalreporter):
        terminalreporter.write_line("active hypothesis profile: " + settings.get_current_profile_name())
"""

SUMMARY = re.compile(r"impl (?P<spec>.+): judged (?P<ran>\d+) of (?P<total>\d+) contract clauses selected "
                     r"\(the contract has \d+\)[^;]*; "
                     r"(?P<passed>\d+) checks passed, (?P<failed>\d+) failed, (?P<skipped>\d+) skipped")


# -- helpers -------------------------------------------------------------------

def run_contract(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    """Run pytest in a subprocess with the suite's other modules ignored: only ``test_contract.py`` is collected.

    The other modules (lifecycle, numerics) have their own tests; leaving them out keeps these runs fast
    (no torch import) and the expected counts exact.  The full-suite run does not use this.
    """
    others = sorted(p for p in suite_dir().glob("test_*.py") if p.name != "test_contract.py")
    return pytester.runpytest_subprocess(*args, *(f"--ignore={p}" for p in others))


def write_impl(pytester: pytest.Pytester, name: str, source: str) -> str:
    """Write ``name.py`` into the user's project; return its file SPEC."""
    pytester.makepyfile(**{name: source})
    return f"{name}.py:simulate"


def summary(result: pytest.RunResult) -> dict[str, str]:
    """The pytest-cbatch summary line's fields; fails if the section is missing."""
    assert "pytest-cbatch" in result.stdout.str(), result.stdout.str()
    match = SUMMARY.search(result.stdout.str())
    assert match, result.stdout.str()
    return match.groupdict()


def assert_demo_passed(result: pytest.RunResult, spec: str) -> None:
    """Every clause passed on the demo workload, reported under ``spec``."""
    assert result.ret == OK, result.stdout.str() + result.stderr.str()
    outcomes = result.parseoutcomes()
    outcomes.pop("deselected", None)  # absent under xdist, where the workers deselect
    outcomes.pop("warnings", None)
    assert outcomes == {"passed": DEMO_CHECKS}, outcomes
    result.stdout.fnmatch_lines([f"cbatch: impl {spec} (*)"])
    found = summary(result)
    assert (found["spec"], found["ran"], found["total"]) == (spec, str(DEMO_CHECKS), str(DEMO_CHECKS))


def assert_usage_error(result: pytest.RunResult, *fragments: str) -> None:
    """One clean usage error (no traceback, no internal error) whose message holds every fragment."""
    output = result.stdout.str() + result.stderr.str()
    assert result.ret == USAGE_ERROR, output
    assert "INTERNALERROR" not in output and "Traceback" not in output, output
    errors = [line for line in result.stderr.lines if line.startswith("ERROR:")]
    assert len(errors) == 1, output
    message = result.stderr.str()
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in:\n{message}"


@pytest.fixture
def not_in_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    """Hide CI variables: with them hypothesis loads its own ``ci`` profile on import."""
    from hypothesis import _settings

    for name in getattr(_settings, "_CI_VARS", {"CI": None}):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def in_ci(not_in_ci: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CI", "true")


# -- 1. inert without an implementation ------------------------------------------

@pytest.mark.usefixtures("not_in_ci")
def test_plugin_is_inert_without_an_implementation(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_mine="""
        from hypothesis import settings

        def test_hypothesis_defaults_untouched():
            assert settings().max_examples == 100
            assert settings().derandomize is False
    """)
    result = pytester.runpytest_subprocess()
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["plugins:*cbatch-*", "collected 1 item"])  # installed, and nothing more collected
    result.stdout.no_fnmatch_line("cbatch: *")
    result.stdout.no_fnmatch_line("*pytest-cbatch*")
    assert "test_contract" not in result.stdout.str()


# -- 2. the whole suite ------------------------------------------------------------

def test_shipped_suite_passes_on_reference_from_an_empty_directory(pytester: pytest.Pytester,
                                                                 lifecycle_profile: list[str]) -> None:
    """Every suite module, collected whole; the contract part on the demo workload, the lifecycle under a
    brief profile, the numerics in float64 on the demo and chunked workloads (the negative control's).  With
    --run-slow: every workload, every dtype, the ci profile, a truly empty directory.  (Every clause on every
    workload passes on the reference in process: test_broken_schedulers; the numeric checks of the
    reference's schedules on every workload, float64 and float32: tests/gpu_checks.)"""
    slow = not lifecycle_profile
    only = [] if slow else ["-k", "(demo or float64-chunked] or not (test_contract or test_numerics)) and not float32"]
    result = pytester.runpytest_subprocess("--cbatch-impl=reference", "-rp", *lifecycle_profile, *only)
    outcomes = result.parseoutcomes()
    assert result.ret == OK, result.stdout.str()
    assert "failed" not in outcomes and "errors" not in outcomes, outcomes
    assert outcomes["passed"] > (500 if slow else DEMO_CHECKS + 3), outcomes
    assert slow or outcomes["deselected"] > 500, outcomes
    result.stdout.fnmatch_lines(["cbatch: impl reference (entry point reference = *)"])
    if importlib.util.find_spec("torch") is not None:
        # the reference's chunked schedule does show batch variance: the negative control passes, not skips
        result.stdout.fnmatch_lines(["PASSED *test_numerics.py::test_numerics[[]negative_control-float64-chunked[]]"])
    assert summary(result)["failed"] == "0"


# -- 3. every SPEC form ----------------------------------------------------------------

def _entry_point_spec(pytester: pytest.Pytester) -> str:
    return "reference"


def _module_attr_spec(pytester: pytest.Pytester) -> str:
    return "pytest_cbatch.reference.scheduler_sim:simulate"


def _file_attr_spec(pytester: pytest.Pytester) -> str:
    return write_impl(pytester, "student", WRAPPER)


def _exec_spec(pytester: pytest.Pytester) -> str:
    script = pytester.makepyfile(student_exec=EXEC_SCRIPT)
    return f"exec:{shlex.quote(sys.executable)} {shlex.quote(str(script))}"


@pytest.mark.parametrize("make_spec", [_entry_point_spec, _module_attr_spec, _file_attr_spec, _exec_spec],
                         ids=["entry_point", "module_attr", "file_attr", "exec"])
def test_each_spec_form_runs_the_suite(pytester: pytest.Pytester,
                                       make_spec: Callable[[pytest.Pytester], str]) -> None:
    spec = make_spec(pytester)
    result = run_contract(pytester, f"--cbatch-impl={spec}", "-k", DEMO)
    assert_demo_passed(result, spec)


# -- 4. bad SPECs are one usage error --------------------------------------------------

@pytest.mark.parametrize("spec,fragments", [
    ("no_such_engine", ["'no_such_engine'", "installed", "reference",
                        "package.module[:attr]", "path/to/file.py[:attr]", "exec:COMMAND"]),
    ("missing.py:simulate", ["missing.py", "no such file"]),
    ("student.py:no_such_attr", ["student.py", "no attribute 'no_such_attr'"]),
    ("needs_missing_dep:simulate", ["needs_missing_dep", "not_a_real_dependency_xyz"]),
    ("raises_on_import:simulate", ["raises_on_import", "boom at import"]),
], ids=["unknown_name", "missing_file", "missing_attr", "module_missing_dependency", "module_raises_on_import"])
def test_bad_spec_is_a_single_usage_error(pytester: pytest.Pytester, spec: str, fragments: list[str]) -> None:
    write_impl(pytester, "student", WRAPPER)
    pytester.makepyfile(needs_missing_dep="import not_a_real_dependency_xyz",
                        raises_on_import="raise RuntimeError('boom at import')")
    pytester.syspathinsert()
    result = pytester.runpytest(f"--cbatch-impl={spec}")  # fails in pytest_configure: nothing global is touched
    assert_usage_error(result, *fragments)


# -- 5. ini settings -----------------------------------------------------------------

@pytest.mark.parametrize("ini,profile", [
    ('cbatch_impl = "reference"', "cbatch-ci"),
    ('cbatch_impl = "reference"\ncbatch_profile = "dev"', "cbatch-dev"),
], ids=["impl", "impl_and_profile"])
def test_pyproject_ini_selects_implementation_and_profile(pytester: pytest.Pytester, ini: str, profile: str) -> None:
    pytester.makepyprojecttoml(f"[tool.pytest.ini_options]\n{ini}\n")
    result = run_contract(pytester, "-k", DEMO)
    assert_demo_passed(result, "reference")
    result.stdout.fnmatch_lines([f"cbatch: hypothesis profile {profile};*"])


# -- 6. collection survives the user's ini -------------------------------------------------

def test_suite_collected_despite_user_python_files(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\npython_files = check_*.py\n")
    result = run_contract(pytester, "--cbatch-impl=reference", "-k", DEMO)
    assert_demo_passed(result, "reference")


def test_suite_runs_under_strict_markers(pytester: pytest.Pytester) -> None:
    """A common user setting: every marker the suite's modules use must be registered by the plugin."""
    result = pytester.runpytest_subprocess("--strict-markers", "--cbatch-impl=reference", "-k", DEMO)
    outcomes = result.parseoutcomes()
    assert result.ret == OK, result.stdout.str() + result.stderr.str()
    # Without torch the numerics module skips as a whole; every contract check of the demo still passes.
    assert outcomes["passed"] == DEMO_CHECKS and outcomes.get("skipped", 0) <= 1, outcomes


def _project_with_testpaths(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\naddopts = -p no:cacheprovider\ntestpaths = mytests\n")
    pytester.mkdir("mytests").joinpath("test_mine.py").write_text("def test_mine():\n    pass\n")


def test_suite_runs_despite_user_addopts_and_testpaths(pytester: pytest.Pytester) -> None:
    _project_with_testpaths(pytester)
    result = run_contract(pytester, "--cbatch-impl=reference", "-k", f"test_mine or ({DEMO})")
    assert_demo_passed(result, "reference")  # exactly the demo checks: the user's test_mine was not collected
    assert not pytester.path.joinpath(".pytest_cache").exists()  # the user's addopts still applied


def test_an_ini_implementation_keeps_the_projects_own_tests(pytester: pytest.Pytester) -> None:
    """cbatch_impl in the project's ini: plain pytest runs the suite and the testpaths' tests, and says so in
    its header; a -k that picks only the project's tests is no usage error."""
    _project_with_testpaths(pytester)
    pytester.makeini("[pytest]\naddopts = -p no:cacheprovider\ntestpaths = mytests\ncbatch_impl = reference\n")
    result = run_contract(pytester, "-k", f"test_mine or ({DEMO})")
    assert result.ret == OK, result.stdout.str() + result.stderr.str()
    assert result.parseoutcomes()["passed"] == DEMO_CHECKS + 1, result.stdout.str()
    result.stdout.fnmatch_lines(["cbatch: collecting the conformance suite and this project's own tests (mytests)*",
                                 "mytests/test_mine.py .*"])
    only_mine = run_contract(pytester, "-k", "test_mine")
    assert only_mine.ret == OK and only_mine.parseoutcomes()["passed"] == 1, only_mine.stdout.str()


def test_a_command_line_implementation_says_it_runs_the_suite_only(pytester: pytest.Pytester) -> None:
    _project_with_testpaths(pytester)
    result = run_contract(pytester, "--cbatch-impl=reference", "-k", DEMO)
    result.stdout.fnmatch_lines(["cbatch: collecting the conformance suite only (no paths given)"])


def test_explicit_paths_run_only_the_users_tests(pytester: pytest.Pytester) -> None:
    _project_with_testpaths(pytester)
    result = pytester.runpytest_subprocess("mytests", "--cbatch-impl=reference")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["mytests/test_mine.py .*"])
    assert "test_contract" not in result.stdout.str()


@pytest.mark.parametrize("ini,args", [
    ("[pytest]\npython_functions = check_*\n", []),
    (None, ["-k", "nothing_matches_this"]),
], ids=["python_functions", "k_matches_nothing"])
def test_selecting_no_conformance_test_is_a_usage_error(pytester: pytest.Pytester, ini: str | None,
                                                        args: list[str]) -> None:
    if ini:
        pytester.makeini(ini)
    result = run_contract(pytester, "--cbatch-impl=reference", *args)
    assert_usage_error(result, "no conformance test was selected")


# -- 7. capability skips ------------------------------------------------------------------

def test_missing_admission_keyword_skips_optimistic_workloads(pytester: pytest.Pytester) -> None:
    spec = write_impl(pytester, "no_admission", NO_ADMISSION)
    preempt = [name for name in WORKLOADS if name.startswith("preempt_")]
    assert preempt
    result = run_contract(pytester, f"--cbatch-impl={spec}", "-rs",
                                           "-k", "test_contract and (preempt_ or demo) and not serial")
    outcomes = result.parseoutcomes()
    assert result.ret == OK, result.stdout.str()
    assert "failed" not in outcomes, outcomes
    assert (outcomes["passed"], outcomes["skipped"]) == (DEMO_CHECKS, DEMO_CHECKS * len(preempt)), outcomes
    skip_lines = [line for line in result.stdout.lines if line.startswith("SKIPPED")]
    assert skip_lines and all("admission" in line for line in skip_lines), skip_lines
    found = summary(result)
    assert (found["ran"], found["total"]) == (str(DEMO_CHECKS), str(DEMO_CHECKS))
    assert (found["passed"], found["failed"], found["skipped"]) == (
        str(outcomes["passed"]), "0", str(outcomes["skipped"]))


def test_implementation_skipping_almost_everything_gets_a_loud_warning(pytester: pytest.Pytester) -> None:
    spec = write_impl(pytester, "capacity_only", CAPACITY_ONLY)
    result = run_contract(pytester, f"--cbatch-impl={spec}", "-k", DEMO)
    assert result.parseoutcomes()["skipped"] == DEMO_CHECKS
    assert "passed" not in result.parseoutcomes()
    assert summary(result)["ran"] == "0"
    result.stdout.fnmatch_lines(["NOTHING JUDGED: no clause was judged for *",
                                 "WARNING: most conformance checks were SKIPPED*"])
    assert result.ret == pytest.ExitCode.TESTS_FAILED   # a run that judged nothing is not green


# -- 8. failure output and replay ----------------------------------------------------------

def test_violation_is_explained_and_replayable(pytester: pytest.Pytester, capsys: pytest.CaptureFixture) -> None:
    spec = write_impl(pytester, "broken", TTFT_ZERO_ON_CANCEL)
    result = run_contract(pytester, f"--cbatch-impl={spec}", "-k", "ttft_null_on_cancel-demo and not serial")
    outcomes = result.parseoutcomes()
    assert result.ret == pytest.ExitCode.TESTS_FAILED and outcomes["failed"] == 1 and "passed" not in outcomes
    out = result.stdout.str()
    cancel_line = next(line for line in WORKLOADS["demo"].trace if line["event"] == "cancel")
    for expected in ("test_contract[ttft_null_on_cancel-demo]", "[ttft_null_on_cancel]",
                     clause_statement("ttft_null_on_cancel"), "'cancel-me'", '"id": "cancel-me"',
                     f'"time": {cancel_line["time"]}, "event": "cancel"', "timeline:", "  cancel-me: t="):
        assert expected in out, f"{expected!r} missing from:\n{out}"
    # The failure text holds the replay command; with CI set, pytest's short summary repeats the whole message.
    replay = [line.strip() for line in result.stdout.lines if line.strip().startswith("cbatch check --impl")]
    assert replay and len(set(replay)) == 1, out
    argv = shlex.split(replay[0])
    trace_path = argv[argv.index("--trace") + 1]
    assert Path(trace_path) == pytester.path / ".cbatch-failures" / "ttft_null_on_cancel-demo.jsonl"
    assert Path(trace_path).is_file() and Path(argv[argv.index("--impl") + 1].partition(":")[0]).is_absolute()

    capsys.readouterr()
    elsewhere = pytester.path / "elsewhere"
    elsewhere.mkdir()
    os.chdir(elsewhere)  # the replay works from any directory (pytester restores the cwd)
    assert cli.main(argv[1:]) == 1
    printed = capsys.readouterr().out
    assert "[ttft_null_on_cancel]" in printed and "cancel-me" in printed, printed


# -- 9. the suite needs an implementation --------------------------------------------------

def test_suite_without_implementation_is_a_usage_error(pytester: pytest.Pytester) -> None:
    result = run_contract(pytester, "--pyargs", "pytest_cbatch.suite")
    assert_usage_error(result, "--cbatch-impl")


# -- 10. xdist and JUnit XML ---------------------------------------------------------------

def test_suite_passes_under_xdist(pytester: pytest.Pytester) -> None:
    pytest.importorskip("xdist")
    result = run_contract(pytester, "-n", "2", "--cbatch-impl=reference", "-k", DEMO)
    assert_demo_passed(result, "reference")  # the controller's summary counts the workers' results


def test_junit_xml_carries_the_clause_of_each_suite_test(pytester: pytest.Pytester) -> None:
    result = run_contract(pytester, "--cbatch-impl=reference", "-k", DEMO, "--junitxml=out.xml")
    assert result.ret == OK, result.stdout.str()
    cases = ET.parse(pytester.path / "out.xml").getroot().iter("testcase")
    clauses = {}
    for case in cases:
        props = {p.get("name"): p.get("value") for p in case.iter("property")}
        clauses[case.get("name")] = props.get("cbatch_clause")
    assert len(clauses) == DEMO_CHECKS
    assert all(name == f"test_contract[{clause}-demo]" for name, clause in clauses.items()), clauses


# -- 11. hypothesis profiles -----------------------------------------------------------------

@pytest.mark.parametrize("args,profile", [([], "cbatch-ci"), (["--cbatch-profile=dev"], "cbatch-dev")],
                         ids=["default", "dev"])
@pytest.mark.usefixtures("in_ci")
def test_kit_profile_replaces_hypothesis_ci_profile(pytester: pytest.Pytester, args: list[str], profile: str) -> None:
    pytester.makeconftest(PROFILE_PROBE)
    result = run_contract(pytester, "--cbatch-impl=reference", "-k", f"completes and {DEMO}", *args)
    assert result.ret == OK, result.stdout.str()
    result.stdout.fnmatch_lines([f"cbatch: hypothesis profile {profile};*", f"active hypothesis profile: {profile}"])


@pytest.mark.usefixtures("in_ci")
def test_users_explicit_hypothesis_profile_wins(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(PROFILE_PROBE)
    result = run_contract(pytester, "--cbatch-impl=reference", "-k", f"completes and {DEMO}",
                          "--hypothesis-profile=mine")
    assert result.ret == OK, result.stdout.str()
    result.stdout.fnmatch_lines(["active hypothesis profile: mine"])
    result.stdout.no_fnmatch_line("cbatch: hypothesis profile cbatch-*")  # the header must not claim its own


# -- 12. fixtures for the user's own tests ------------------------------------------------------

USER_TESTS = """
    from pytest_cbatch.reference.scheduler_sim import demo_trace

    def test_cbatch_run_returns_report(cbatch_run):
        report = cbatch_run(demo_trace(), {"capacity": 8})
        assert report["requests"]["cancel-me"]["status"] == "cancelled"

    def test_cbatch_schemas_loads_report_schema(cbatch_schemas):
        assert "$id" in cbatch_schemas.load_schema("report")

    def test_cbatch_impl_is_the_spec(cbatch_impl):
        assert cbatch_impl.spec == "reference"
"""


def test_user_fixtures_work_on_reference(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_engine=USER_TESTS)
    result = pytester.runpytest_subprocess("test_engine.py", "--cbatch-impl=reference")
    result.assert_outcomes(passed=3)


def test_cbatch_run_fails_users_test_with_explanation(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_engine=USER_TESTS)
    spec = write_impl(pytester, "broken", TTFT_ZERO_ON_CANCEL)
    result = pytester.runpytest_subprocess("test_engine.py", f"--cbatch-impl={spec}", "-k", "cbatch_run")
    result.assert_outcomes(failed=1, deselected=2)
    result.stdout.fnmatch_lines([f"[[]ttft_null_on_cancel[]] failed on workload 'cbatch_run' with --cbatch-impl={spec}",
                                 "*request 'cancel-me'*", "replay:", "  cbatch check --impl *"])


# -- 11. base-setting overrides ------------------------------------------------------------

INSTANT_RELEASE_ONLY = """
    from pytest_cbatch.reference.scheduler_sim import simulate as _s

    def simulate(trace, **config):
        if config.get("release_delay") != 0:
            raise NotImplementedError("this engine frees pages at once: release_delay must be 0")
        return _s(trace, **config)
"""


def test_cbatch_config_overrides_base_settings_but_not_what_a_workload_tests(pytester: pytest.Pytester) -> None:
    spec = write_impl(pytester, "instant", INSTANT_RELEASE_ONLY)
    selected = "test_contract and completes and (demo or release_delay_3) and not serial"
    plain = run_contract(pytester, f"--cbatch-impl={spec}", "-k", selected).parseoutcomes()
    assert (plain.get("passed", 0), plain["skipped"]) == (0, 2), plain
    result = run_contract(pytester, f"--cbatch-impl={spec}", "--cbatch-config", "release_delay=0", "-k", selected,
                          "-rs")
    outcomes = result.parseoutcomes()
    # demo now runs at release_delay 0; release_delay_3 keeps the delay it exists to test, and skips.
    assert (outcomes["passed"], outcomes["skipped"]) == (1, 1), result.stdout.str()
    result.stdout.fnmatch_lines(["*release_delay must be 0*"])


@pytest.mark.parametrize("item", ["release_delay", "speed=2", "release_delay=-1", "policy=fifo"])
def test_bad_cbatch_config_is_a_usage_error(pytester: pytest.Pytester, item: str) -> None:
    from hypothesis import settings

    before = settings.get_current_profile_name()
    result = pytester.runpytest("--cbatch-impl=reference", "--cbatch-config", item, "-k", DEMO)  # in process
    assert_usage_error(result, "--cbatch-config", item)
    assert settings.get_current_profile_name() == before  # refused before the kit's profile was loaded


# -- 12. the course's published files, as students have them ---------------------------------

REFERENCE_DIR = Path(__file__).resolve().parent.parent / "reference"


def student_folder(pytester: pytest.Pytester) -> Path:
    """The published two-file layout: scheduler_sim.py and scheduler_faults.py side by side, not installed."""
    folder = pytester.path / "alice"
    folder.mkdir()
    for name in ("scheduler_sim.py", "scheduler_faults.py"):
        (folder / name).write_text((REFERENCE_DIR / name).read_text(encoding="utf-8"), encoding="utf-8")
    return folder


def test_the_published_simulator_file_passes_every_clause(pytester: pytest.Pytester) -> None:
    student_folder(pytester)
    result = run_contract(pytester, "--cbatch-impl=alice/scheduler_sim.py")
    assert result.ret == OK, result.stdout.str()
    outcomes = result.parseoutcomes()
    assert "failed" not in outcomes and "skipped" not in outcomes and outcomes["passed"] > 500, outcomes


def test_the_published_folder_runs_the_scheduler_and_lifecycle_suites(pytester: pytest.Pytester,
                                                                      lifecycle_profile: list[str]) -> None:
    student_folder(pytester)
    result = pytester.runpytest_subprocess("--cbatch-impl=alice", "-k", "test_lifecycle or (test_contract and demo)",
                                           *lifecycle_profile)
    assert result.ret == OK, result.stdout.str()
    result.stdout.fnmatch_lines(["*by part: *contract * passed; lifecycle 3 passed*"])


def test_the_published_report_passes_cbatch_check(pytester: pytest.Pytester) -> None:
    folder = student_folder(pytester)
    done = pytester.run(sys.executable, str(folder / "scheduler_sim.py"), "--output", "continuous.json")
    assert done.ret == 0
    assert cli.main(["check", "--report", str(pytester.path / "continuous.json")]) == 0
    (pytester.path / "broken.json").write_text("{not json", encoding="utf-8")
    assert cli.main(["check", "--report", str(pytester.path / "broken.json")]) == 2


def test_summary_counts_agree_with_pytest_for_lifecycle_alone(pytester: pytest.Pytester,
                                                             lifecycle_profile: list[str]) -> None:
    result = pytester.runpytest_subprocess("--cbatch-impl=reference", "-k", "test_lifecycle", *lifecycle_profile)
    outcomes = result.parseoutcomes()
    result.stdout.fnmatch_lines([f"*by part: *lifecycle {outcomes['passed']} passed*"])


def test_help_lists_every_spec_form(pytester: pytest.Pytester) -> None:
    """pytest --help names every SPEC form the kinds registry resolves, and a NAME (an entry point)."""
    from pytest_cbatch.impls import available_kinds

    text = " ".join(pytester.runpytest("--help").stdout.str().split())
    forms = [kind.form for _, kind in available_kinds() if kind.form]
    assert forms and "reference | NAME" in text
    assert [form for form in forms if form not in text] == [], text[text.index("--cbatch-impl"):][:600]
