"""Expected-failure files (--cbatch-expect) and ``cbatch expect --from-junit``, end to end.

Runs are pytester subprocesses (the plugin loads a hypothesis profile), each on
one or two conformance tests selected with -k, so each costs a couple of seconds.
"""

from __future__ import annotations

import datetime as dt
import textwrap

import pytest

from pytest_cbatch import cli
from pytest_cbatch.expect import ExpectError, load_expectations
from pytest_cbatch.plugin import suite_dir

BROKEN = "pytest_cbatch.examples.broken_schedulers:ttft_zero_on_cancel"
ONE_TEST = "ttft_null_on_cancel and demo and not serial"   # fails on BROKEN, passes on the reference
CONTRACT = str(suite_dir() / "test_contract.py")  # the suite module these tests select from
ENTRY = """
    [[expect]]
    clause = "ttft_null_on_cancel"
    workload = "demo"
    action = "{action}"
    reason = "TTFT 0 on cancel, tracked upstream"
    issue = "https://example.org/engine/issues/7"
"""


def run(pytester: pytest.Pytester, impl: str, toml: str | None, *args: str) -> pytest.RunResult:
    extra = []
    if toml is not None:
        pytester.makefile(".toml", expect=textwrap.dedent(toml))
        extra.append("--cbatch-expect=expect.toml")
    return pytester.runpytest_subprocess(CONTRACT, f"--cbatch-impl={impl}", "-p", "no:cacheprovider", "-rxXs",
                                         "-k", ONE_TEST, *extra, *args)


def test_xfail_entry_turns_the_failure_into_an_expected_failure(pytester: pytest.Pytester) -> None:
    result = run(pytester, BROKEN, ENTRY.format(action="xfail"))
    result.assert_outcomes(xfailed=1)
    result.stdout.fnmatch_lines(["*expected by expect.toml entry #1*issues/7: TTFT 0 on cancel*"])
    assert result.ret == 0
    without = run(pytester, BROKEN, None)
    without.assert_outcomes(failed=1)  # the same test fails when no file is given


def test_skip_entry_skips_with_the_reason(pytester: pytest.Pytester) -> None:
    result = run(pytester, BROKEN, ENTRY.format(action="skip"))
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*SKIPPED*expected by expect.toml entry #1*TTFT 0 on cancel*"])


def test_strict_fails_an_expected_failure_that_passes(pytester: pytest.Pytester) -> None:
    lenient = run(pytester, "reference", ENTRY.format(action="xfail"))
    lenient.assert_outcomes(xpassed=1)
    assert lenient.ret == 0
    result = run(pytester, "reference", "strict = true\n" + ENTRY.format(action="xfail"))
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*XPASS(strict)*passed, but expected by expect.toml entry #1*remove the entry*"])
    assert result.ret == 1


def test_stale_entry_warns_and_fails_strict_runs(pytester: pytest.Pytester) -> None:
    stale = ENTRY.format(action="xfail") + '\n[[expect]]\nclause = "no_such_clause"\naction = "xfail"\nreason = "old"\n'
    lenient = run(pytester, BROKEN, stale)
    assert lenient.ret == 0
    lenient.stdout.fnmatch_lines(["*warning: expect.toml entry #2 (clause = 'no_such_clause') matches no test*"])
    strict = run(pytester, BROKEN, stale, "--cbatch-expect-strict")
    strict.assert_outcomes(xfailed=1)
    strict.stdout.fnmatch_lines(["*FAIL: expect.toml entry #2*matches no test and no failure*"])
    assert strict.ret == 1


def test_expired_entry_no_longer_applies(pytester: pytest.Pytester) -> None:
    expired = ENTRY.format(action="xfail") + "expires = 2020-01-01\n"
    lenient = run(pytester, BROKEN, expired)
    lenient.assert_outcomes(failed=1)
    lenient.stdout.fnmatch_lines(["*warning: expect.toml entry #1*expired on 2020-01-01*"])
    future = ENTRY.format(action="xfail") + f"expires = {dt.date.today().year + 5}-01-01\n"
    strict = run(pytester, BROKEN, "strict = true\n" + future)
    strict.assert_outcomes(xfailed=1)
    assert strict.ret == 0


def test_malformed_toml_is_one_usage_error_naming_file_and_line(pytester: pytest.Pytester) -> None:
    result = run(pytester, BROKEN, '[[expect]]\nclause = "x"\naction xfail\n')
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: expect.toml: invalid TOML: *line 3*"])


@pytest.mark.parametrize("body, message", [
    ('[[expect]]\naction = "xfail"\nreason = "r"\n', "needs at least one of test, clause, workload"),
    ('[[expect]]\nclause = "a"\naction = "xpass"\nreason = "r"\n', "action must be one of xfail, skip"),
    ('[[expect]]\nclause = "a"\naction = "skip"\n', "reason must be a non-empty string"),
    ('[[expect]]\nclause = "a"\naction = "skip"\nreason = "r"\nowner = "me"\n', "unknown key 'owner'"),
    ('[[expect]]\nclause = "a"\naction = "skip"\nreason = "r"\nexpires = "soon"\n', "expires must be a date"),
    ('strict = "yes"\n', "strict must be true or false"),
])
def test_invalid_entries_name_the_entry(tmp_path, body: str, message: str) -> None:
    path = tmp_path / "e.toml"
    path.write_text(body)
    with pytest.raises(ExpectError, match=message) as info:
        load_expectations(path)
    assert str(info.value).startswith(f"{path}:")


def test_test_globs_treat_brackets_literally(tmp_path) -> None:
    path = tmp_path / "e.toml"
    path.write_text('[[expect]]\ntest = "test_contract[row_shape-*]"\naction = "xfail"\nreason = "r"\n')
    entry = load_expectations(path).entries[0]
    assert entry.matches("test_contract[row_shape-demo]", None, None)
    assert not entry.matches("test_contract[o]", None, None)  # '[row...]' is not a character class


def test_a_list_selector_matches_any_of_its_globs(tmp_path) -> None:
    path = tmp_path / "e.toml"
    path.write_text('[[expect]]\nclause = ["row_shape", "impossible_*"]\naction = "xfail"\nreason = "r"\n')
    entry = load_expectations(path).entries[0]
    assert entry.matches("t", "impossible_rejected", None) and entry.matches("t", "row_shape", None)
    assert not entry.matches("t", "budget_respected", None)


def test_file_written_from_junit_expects_exactly_the_failures(pytester: pytest.Pytester) -> None:
    first = run(pytester, BROKEN, None, "--junitxml=run.xml")
    first.assert_outcomes(failed=1)
    out = pytester.path / "expect.toml"
    assert cli.main(["expect", "--from-junit", str(pytester.path / "run.xml"), "-o", str(out), "--strict"]) == 0
    written = load_expectations(out)
    assert written.strict
    assert [e.selectors for e in written.entries] == [{"clause": "ttft_null_on_cancel", "workload": "demo"}]
    assert "expected ttft_ticks null" in written.entries[0].reason
    again = pytester.runpytest_subprocess(CONTRACT, f"--cbatch-impl={BROKEN}", "-p", "no:cacheprovider", "-k", ONE_TEST,
                                          "--cbatch-expect=expect.toml")
    again.assert_outcomes(xfailed=1)
    assert again.ret == 0


def test_generated_trace_failure_is_matched_by_the_clause_it_names(pytester: pytest.Pytester,
                                                                 unshrunk_profile: list[str]) -> None:
    toml = ('strict = true\n[[expect]]\ntest = "test_generated_traces"\nclause = "ttft_null_on_cancel"\n'
            'workload = "generated-reserve"\naction = "xfail"\nreason = "TTFT 0 on cancel"\n')
    pytester.makefile(".toml", expect=toml)
    result = pytester.runpytest_subprocess(CONTRACT, f"--cbatch-impl={BROKEN}", "-p", "no:cacheprovider",
                                           "-k", "test_generated_traces and not preemption",
                                           "--cbatch-expect=expect.toml", *unshrunk_profile)
    result.assert_outcomes(xfailed=1)
    assert result.ret == 0


def test_from_junit_reports_an_unreadable_file(tmp_path, capsys) -> None:
    bad = tmp_path / "bad.xml"
    bad.write_text("<testsuite><testcase")
    assert cli.main(["expect", "--from-junit", str(bad)]) == 2
    assert f"error: {bad}: not JUnit XML" in capsys.readouterr().err
