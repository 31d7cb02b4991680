"""Nothing judged is never passed: a suite test, part, summary line or exit status counts a pass only where a
report of the implementation was judged, and the summary's counts add up to the tests that ran.

Each case runs the plugin on a tiny submission written here: a program that answers exit 3 (not supported)
to everything, a lifecycle-only module whose ``simulate`` raises NotImplementedError, a scheduler that
crashes on generated traces.
"""

from __future__ import annotations

import importlib.util
import re
import stat

import pytest

from pytest_cbatch.run_state import suite_dir
from pytest_cbatch.runner import ALL_CLAUSES

NOTHING = "#!/bin/sh\necho 'not supported: nothing at all' >&2\nexit 3\n"

LIFECYCLE_ONLY = """
    def simulate(trace, **config):
        raise NotImplementedError("this submission is the lifecycle part only")
"""

# Correct on the fixed demo workload, crashes on any trace of more than five lines.
CRASHES_ON_LONG_TRACES = """
    from pytest_cbatch.reference.scheduler_sim import simulate as _s

    def simulate(trace, **config):
        if len(trace) > 5:
            raise RuntimeError("boom")
        return _s(trace, **config)
"""

GENERATED = "test_generated_traces"
PER_MODE = len(ALL_CLAUSES) - 2  # a generated test per clause, but invalid_input_refused and deterministic
SUMMARY = re.compile(r"judged (?P<ran>\d+) of (?P<selected>\d+) contract clauses selected \(the contract has \d+\)"
                     r"[^;]*; (?P<passed>\d+) checks passed, (?P<failed>\d+) failed, (?P<skipped>\d+) skipped")


def only(pytester: pytest.Pytester, *modules: str, args: tuple[str, ...] = ()) -> pytest.RunResult:
    """Run pytest on the shipped suite with every module but ``modules`` left out."""
    others = sorted(p for p in suite_dir().glob("test_*.py") if p.stem not in modules)
    return pytester.runpytest_subprocess("-rs", "-p", "no:cacheprovider", *args, *(f"--ignore={p}" for p in others))


def nothing_spec(pytester: pytest.Pytester) -> str:
    path = pytester.path / "nothing.sh"
    path.write_text(NOTHING)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return f"--cbatch-impl=exec:{path}"


def counts(result: pytest.RunResult) -> dict[str, int]:
    match = SUMMARY.search(result.stdout.str())
    assert match, result.stdout.str()
    return {k: int(v) for k, v in match.groupdict().items()}


def test_generated_traces_whose_every_example_was_declined_skip_saying_so(pytester: pytest.Pytester,
                                                                          unshrunk_profile: list[str]) -> None:
    result = only(pytester, "test_contract", args=(nothing_spec(pytester), "-k", GENERATED, *unshrunk_profile))
    out = result.stdout.str()
    result.assert_outcomes(skipped=2 * PER_MODE)
    result.stdout.fnmatch_lines(["SKIPPED [[]*[]] *was judged on none of the * generated examples*"
                                 "not supported: nothing at all*"])
    result.stdout.fnmatch_lines(["*NOTHING JUDGED: no clause was judged for exec:*"])
    assert result.ret == pytest.ExitCode.TESTS_FAILED, out
    assert counts(result)["ran"] == 0 and counts(result)["passed"] == 0


def test_a_lifecycle_only_submission_gets_no_generated_trace_pass(pytester: pytest.Pytester,
                                                                 unshrunk_profile: list[str]) -> None:
    pytester.makepyfile(lifecycle_only=LIFECYCLE_ONLY)
    result = only(pytester, "test_contract", args=("--cbatch-impl=lifecycle_only.py:simulate", "-k", GENERATED,
                                                   *unshrunk_profile))
    out = result.stdout.str()
    assert "passed" not in out.splitlines()[-1], out  # not one generated test passed on a report never written
    result.stdout.fnmatch_lines(["SKIPPED [[]*[]] *generated examples*"])
    assert result.ret == pytest.ExitCode.TESTS_FAILED, out


def test_numerics_on_no_report_of_the_implementation_are_not_its_passes(pytester: pytest.Pytester) -> None:
    """The kit's own schedule (the implementation supports none) and the kit's kernels judge nothing of it."""
    if importlib.util.find_spec("torch") is None:   # not imported here: pytester would unload it after the test
        pytest.skip("the numerics need torch")
    result = only(pytester, "test_numerics", args=(
        nothing_spec(pytester), "-k", "(page_reuse-float64-bounds) or (attention_parity-float64)"))
    out = result.stdout.str()
    result.assert_outcomes(skipped=2)
    assert "not judged: computed on the kit's own schedule of workload 'bounds', not on a report of exec:" in out, out
    assert "not judged: the kit's attention kernels" in out, out
    result.stdout.fnmatch_lines(["*NOTHING JUDGED: no clause was judged for exec:*"])
    assert result.ret == pytest.ExitCode.TESTS_FAILED, out


def test_a_generated_trace_crash_counts_completes_as_a_failed_clause(pytester: pytest.Pytester,
                                                                     unshrunk_profile: list[str]) -> None:
    pytester.makepyfile(crashes=CRASHES_ON_LONG_TRACES)
    result = only(pytester, "test_contract", args=(
        "--cbatch-impl=crashes.py:simulate", "-k", f"{GENERATED} and not preemption", *unshrunk_profile))
    found = counts(result)
    # completes' own generated test failed, and the summary says so; no clause passed on the crashed examples
    assert found["failed"] >= 1 and found["passed"] + found["failed"] + found["skipped"] == PER_MODE, found
    assert 1 <= found["ran"] <= found["selected"], found
    result.stdout.fnmatch_lines(["failed clauses: *completes*"])
    assert "NOTHING JUDGED" not in result.stdout.str()


def test_generated_traces_count_the_clauses_their_examples_judged(pytester: pytest.Pytester,
                                                                 unshrunk_profile: list[str]) -> None:
    result = only(pytester, "test_contract", args=(
        "--cbatch-impl=reference", "-k", f"{GENERATED} and not preemption", *unshrunk_profile))
    result.assert_outcomes(passed=PER_MODE)
    found = counts(result)
    assert (found["passed"], found["failed"], found["skipped"]) == (PER_MODE, 0, 0), found
    assert found["ran"] == found["selected"] > 20, found
    assert result.ret == pytest.ExitCode.OK
