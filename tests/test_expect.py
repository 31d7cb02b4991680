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


def run(pytester: pytest.Pytester, impl: str, toml: str | None, *args: str, select: str = ONE_TEST) -> pytest.RunResult:
    extra = []
    if toml is not None:
        pytester.makefile(".toml", expect=textwrap.dedent(toml))
        extra.append("--cbatch-expect=expect.toml")
    return pytester.runpytest_subprocess(CONTRACT, f"--cbatch-impl={impl}", "-p", "no:cacheprovider", "-rxXs",
                                         "-k", select, *extra, *args)


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


def test_strict_fails_an_entry_whose_every_expected_failure_passed(pytester: pytest.Pytester) -> None:
    lenient = run(pytester, "reference", ENTRY.format(action="xfail"))
    lenient.assert_outcomes(xpassed=1)
    assert lenient.ret == 0
    result = run(pytester, "reference", "strict = true\n" + ENTRY.format(action="xfail"))
    result.assert_outcomes(failed=1, xpassed=1)  # the entry is the failure, counted in the run's last line
    result.stdout.fnmatch_lines(["*FAIL: expect.toml entry #1*matched no failure in this run: every test it "
                                 "expects to fail passed (test_contract?ttft_null_on_cancel-demo?)*remove the entry*"])
    assert result.ret == 1


SPLIT = """
    strict = true

    [[expect]]
    clause = "ttft_null_on_cancel"
    workload = ["demo", "budget_1"]
    action = "xfail"
    reason = "TTFT 0 on cancel"
"""
STALE = """
    [[expect]]
    clause = "row_shape"
    workload = "no_such_workload"
    action = "xfail"
    reason = "fixed long ago"
"""
SPLIT_TESTS = "ttft_null_on_cancel and (demo or budget_1) and not serial and not generated"


@pytest.mark.parametrize("workers", [[], ["-n", "2"]], ids=["one process", "two workers"])
def test_strictness_is_decided_per_entry_over_the_whole_run(pytester: pytest.Pytester, workers: list[str]) -> None:
    """An entry that still matches a failure is not stale because another test it selects passed; one that
    matches nothing is, and a strict run fails on it, saying so in its last line, also under xdist (where
    each worker sees only part of the run)."""
    matched = run(pytester, BROKEN, SPLIT, *workers, select=SPLIT_TESTS)
    matched.assert_outcomes(xfailed=1, xpassed=1)
    assert matched.ret == 0, matched.stdout.str()
    matched.stdout.fnmatch_lines(["*note: expect.toml entry #1*still matched 1 failing test(s); 1 test(s) it "
                                  "expects to fail passed (test_contract?ttft_null_on_cancel-budget_1?)*"])
    assert "FAIL:" not in matched.stdout.str()
    stale = run(pytester, BROKEN, SPLIT + STALE, *workers, select=SPLIT_TESTS)
    stale.assert_outcomes(failed=1, xfailed=1, xpassed=1)
    assert stale.ret == 1
    stale.stdout.fnmatch_lines(["*FAIL: expect.toml entry #2*matches no test and no failure in this run*"])
    assert "FAIL: expect.toml entry #1" not in stale.stdout.str()
    assert "1 failed" in stale.outlines[-1]  # red: the run's last line says why it failed


def test_stale_entry_warns_and_fails_strict_runs(pytester: pytest.Pytester) -> None:
    stale = ENTRY.format(action="xfail") + ('\n[[expect]]\nclause = "row_shape"\nworkload = "no_such_workload"\n'
                                            'action = "xfail"\nreason = "old"\n')
    lenient = run(pytester, BROKEN, stale)
    assert lenient.ret == 0
    lenient.stdout.fnmatch_lines(["*warning: expect.toml entry #2 (clause = 'row_shape', workload = "
                                  "'no_such_workload') matches no test*"])
    strict = run(pytester, BROKEN, stale, "--cbatch-expect-strict")
    strict.assert_outcomes(failed=1, xfailed=1)  # the stale entry is the failure
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
    ('[[expect]]\nclause = "row_shape"\naction = "xpass"\nreason = "r"\n', "action must be one of xfail, skip"),
    ('[[expect]]\nclause = "row_shape"\naction = "skip"\n', "reason must be a non-empty string"),
    ('[[expect]]\nclause = "row_shape"\naction = "skip"\nreason = "r"\nowner = "me"\n', "unknown key 'owner'"),
    ('[[expect]]\nclause = "row_shape"\naction = "skip"\nreason = "r"\nexpires = "soon"\n', "expires must be a date"),
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
                                           "-k", "test_generated_traces and not preemption", "-rx",
                                           "--cbatch-expect=expect.toml", *unshrunk_profile)
    outcomes = result.parseoutcomes()
    assert outcomes.get("xfailed") == 1 and "failed" not in outcomes, result.stdout.str()
    result.stdout.fnmatch_lines(["XFAIL *test_generated_traces[[]ttft_null_on_cancel[]] - expected by expect.toml "
                                 "entry #1*of 100 generated examples deviated so, set aside*"])
    assert result.ret == 0


TWO_BUGS = """
from pytest_cbatch.examples.broken_schedulers import ttft_zero_on_cancel


def simulate(trace, **config):
    \"\"\"TTFT 0 for a request cancelled before its first token, and an ITL of [0] for a one-token output.\"\"\"
    report = ttft_zero_on_cancel(trace, **config)
    for row in report["requests"].values():
        if row["output_tokens"] == 1:
            row["itl_ticks"] = [0]
    return report
"""
SHRINKING_PROFILE = """
from hypothesis import settings

settings.register_profile("brief-shrinking", max_examples=20, derandomize=True, database=None, deadline=None)
"""


def test_generated_traces_judge_what_the_expectations_do_not_cover(pytester: pytest.Pytester) -> None:
    """An entry covering one clause on generated traces sets its violations aside; a second broken clause's
    generated test still fails, shrunk to its own smallest example (a one-token request), not the covered one."""
    pytester.makepyfile(twobugs=TWO_BUGS, cbatch_shrinking=SHRINKING_PROFILE)
    toml = ('strict = true\n[[expect]]\ntest = "test_generated_traces*"\nclause = "ttft_null_on_cancel"\n'
            'workload = "generated-*"\naction = "xfail"\nreason = "TTFT 0 on cancel"\n')
    pytester.makefile(".toml", expect=toml)
    result = pytester.runpytest_subprocess(CONTRACT, "--cbatch-impl=twobugs.py", "-p", "no:cacheprovider",
                                           "-p", "cbatch_shrinking", "--hypothesis-profile=brief-shrinking",
                                           "-k", "test_generated_traces and not preemption", "-rfx",
                                           "--cbatch-expect=expect.toml")
    outcomes = result.parseoutcomes()
    assert (outcomes.get("failed"), outcomes.get("xfailed")) == (1, 1), result.stdout.str()
    result.stdout.fnmatch_lines(["FAILED *test_generated_traces[[]itl_empty_for_one_token[]]*",
                                 "XFAIL *test_generated_traces[[]ttft_null_on_cancel[]]*set aside*"])
    text = result.stdout.str()
    failure = text[text.index("[itl_empty_for_one_token] failed on workload 'generated-reserve'"):]
    assert "trace (1 line):" in failure and '"output_tokens": 1' in failure.split("timeline:")[0]
    pages = sorted(page.name for page in (pytester.path / ".cbatch-failures").glob("*.html"))
    assert pages == ["itl_empty_for_one_token-generated-reserve.html"]  # only the failure reported draws a page


def test_an_unknown_clause_is_refused_at_once(pytester: pytest.Pytester) -> None:
    result = run(pytester, "reference", 'strict = true\n\n[[expect]]\nclause = "ttft_nul_on_cancel"\n'
                                        'action = "xfail"\nreason = "r"\n')
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: expect.toml: ??expect?? entry #1 (line 4): unknown clause "
                                 "'ttft_nul_on_cancel' (did you mean 'ttft_null_on_cancel'?; known: completes, *"])


def test_clause_globs_must_match_a_clause(tmp_path) -> None:
    path = tmp_path / "e.toml"
    path.write_text('[[expect]]\nclause = ["impossible_*", "row_shape"]\naction = "xfail"\nreason = "r"\n')
    assert load_expectations(path).entries[0].matches("t", "impossible_rejected", None)
    path.write_text('[[expect]]\nclause = ["row_shape", "imposible_*"]\naction = "xfail"\nreason = "r"\n')
    with pytest.raises(ExpectError, match=r"entry #1 \(line 2\): unknown clause 'imposible_\*'"):
        load_expectations(path)


JUNIT_CASE = """<testcase classname="suite.test_contract" name="test_contract[pages_cover_rows-{w}]">
<properties><property name="cbatch_clause" value="pages_cover_rows"/>
<property name="cbatch_workload" value="{w}"/></properties>
<failure message="[pages_cover_rows] failed on workload '{w}' with --cbatch-impl=x">[pages_cover_rows] failed on \
workload '{w}' with --cbatch-impl=x
  clause: Every snapshot gives each running request its pages.
  - [pages_cover_rows] (request 'r{w}', t=1) has fed 2 rows, which need 1 page; the snapshot shows 0
</failure></testcase>"""


def test_from_junit_writes_the_violations_in_a_stable_order(tmp_path) -> None:
    """Each reason is the failure's violation, even where the message attribute holds only the header, and
    the file is the same whatever order the workers finished in."""
    written = []
    for order in (["demo", "budget_1"], ["budget_1", "demo"]):
        xml = tmp_path / "run.xml"
        xml.write_text("<testsuite>" + "".join(JUNIT_CASE.format(w=w) for w in order) + "</testsuite>")
        out = tmp_path / f"expect-{order[0]}.toml"
        assert cli.main(["expect", "--from-junit", str(xml), "-o", str(out)]) == 0
        written.append(out.read_text())
    assert written[0] == written[1]
    entries = load_expectations(tmp_path / "expect-demo.toml").entries
    assert [e.selectors["workload"] for e in entries] == ["budget_1", "demo"]
    assert entries[1].reason == "[pages_cover_rows] (request 'rdemo', t=1) has fed 2 rows, which need 1 page; " \
                                "the snapshot shows 0"


def test_from_junit_reports_an_unreadable_file(tmp_path, capsys) -> None:
    bad = tmp_path / "bad.xml"
    bad.write_text("<testsuite><testcase")
    assert cli.main(["expect", "--from-junit", str(bad)]) == 2
    assert f"error: {bad}: not JUnit XML" in capsys.readouterr().err
