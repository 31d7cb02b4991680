"""Searched lifecycle parts (pytest_cbatch.sandbox.search): the child runs each search ahead, the grader
judges it as it comes, and the verdicts are those of the same search judged in process or over the live
channel; whatever goes wrong in the child's search, the part is judged again over the live channel."""

from __future__ import annotations

import gc
import re

from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase
from hypothesis import settings as Settings
from hypothesis.errors import FlakyStrategyDefinition
from hypothesis.stateful import run_state_machine_as_test

from pytest_cbatch.lifecycle import MAX_FAILURES, PARTS, lifecycle_verdicts
from pytest_cbatch.lifecycle import verdicts as verdicts_module
from pytest_cbatch.lifecycle.clauses import StoppedViolation
from pytest_cbatch.sandbox import (
    IsolatedImplementation, KitGuard, Limits, LoadSpec, bwrap_problem, lifecycle_verdicts_of, submission_files,
)
from pytest_cbatch.sandbox import search as searching
from pytest_cbatch.sandbox.process import SandboxTimeout
from pytest_cbatch.sandbox.protocol import SandboxFailure, native_copy, search_settings, settings_document
from pytest_cbatch.sandbox.proxies import LiveChannel
from pytest_cbatch.sandbox.search import SearchChannel, SearchDiverged, run_search, searched
from grading_samples import make_samples
from sandbox_cases import (  # noqa: F401 - pytest_generate_tests is pytest's hook
    BROKEN, FINDS, HANGS, QUICK, REFERENCE, SETTINGS, TAMPERS, isolated, parametrize_broken as pytest_generate_tests,
    part_of,
)

SHRINKS = Settings(FINDS, phases=(Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink))


def searched_verdicts(impl: IsolatedImplementation, part: str, settings: Settings = SETTINGS, **options: Any) -> dict:
    """The part's verdicts, searched by the child; fails if any search fell back to another way."""
    channel = impl.lifecycle_channel(SearchChannel)
    verdicts = lifecycle_verdicts(part, channel.namespace, settings, wrap=lambda cls: searched(cls, channel),
                                  search=lambda machine, stage: run_search(channel, machine, stage), **options)
    assert channel.searches > 0 and not channel.running
    return verdicts


class Ways:
    """Counts, during a test, the searches the child began, the requests the live channel sent and the
    calls that timed out."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.searches = self.live = self.timeouts = self.live_timeouts = 0
        start, exchange, timeout = SearchChannel.start, LiveChannel.exchange, SandboxTimeout.__init__

        def counted_start(channel: SearchChannel, *args: Any) -> None:
            self.searches += 1
            start(channel, *args)

        def counted_exchange(channel: LiveChannel, *args: Any) -> dict:
            self.live += 1
            return exchange(channel, *args)

        def counted_timeout(failure: SandboxTimeout, *args: Any) -> None:
            self.timeouts += 1
            timeout(failure, *args)

        monkeypatch.setattr(SearchChannel, "start", counted_start)
        monkeypatch.setattr(SandboxTimeout, "__init__", counted_timeout)
        monkeypatch.setattr(LiveChannel, "exchange", counted_exchange)


@pytest.fixture
def ways(monkeypatch: pytest.MonkeyPatch) -> Ways:
    return Ways(monkeypatch)


def test_searched_verdicts_of_a_correct_submission_equal_those_in_process(ways: Ways) -> None:
    impl = isolated(REFERENCE)
    settings = Settings(SETTINGS, max_examples=5)  # enough for some run to reach every clause
    try:
        for part in PARTS:
            live = ways.live
            verdicts, note = lifecycle_verdicts_of(impl, part, settings)
            assert ways.live == live, part  # no request went over the live channel
            assert note == "" and verdicts == lifecycle_verdicts(part, impl.namespace, settings), part
            assert {v.status for v in verdicts.values()} == {"pass"}, part
    finally:
        impl.close()
    assert ways.searches == 2 * len(PARTS)  # a short and a long search per part


def test_searched_verdicts_of_a_broken_submission_equal_the_live_ones(broken: str) -> None:
    part = part_of(broken)
    impl = isolated(f"pytest_cbatch.examples.broken_lifecycle:{broken}")
    try:  # two failing clauses at most: the second search has the first clause disabled
        live = lifecycle_verdicts(part, impl.namespace, FINDS, max_failures=2)
        assert searched_verdicts(impl, part, FINDS, max_failures=2) == live
    finally:
        impl.close()
    clause = BROKEN[broken][1]
    if broken in QUICK:
        assert live[clause].status == "fail" and live[clause].message.startswith(f"[{clause}] ")


def test_the_violation_is_the_childs_shrunk_example_judged_by_the_grader() -> None:
    # A bug whose example shrinks to its end in well under SHRINK_SECONDS: both shrinks then stop at the same
    # example, wherever they run and however fast.
    namespace, clause = BROKEN["reads_in_flight"]
    impl = isolated("pytest_cbatch.examples.broken_lifecycle:reads_in_flight")
    try:
        unshrunk = searched_verdicts(impl, "transfer", FINDS, max_failures=1)
        shrunk = searched_verdicts(impl, "transfer", SHRINKS, max_failures=1)
    finally:
        impl.close()
    assert shrunk == lifecycle_verdicts("transfer", namespace, SHRINKS, max_failures=1)
    assert unshrunk[clause].status == shrunk[clause].status == "fail"
    assert len(shrunk[clause].message) < len(unshrunk[clause].message)


def test_a_search_with_a_random_seed_is_the_same_on_both_sides(ways: Ways) -> None:
    impl = isolated(REFERENCE)
    try:
        verdicts, note = lifecycle_verdicts_of(impl, "transfer", Settings(SETTINGS, derandomize=False))
    finally:
        impl.close()
    # A random draw may reach a rare check in none of its few runs (then one more search, of twice the
    # examples, runs): such a clause is not judged, never failed.
    unreached = [v for v in verdicts.values() if v.status == "skip" and "examples; run more" in v.message]
    assert note == "" and ways.searches in ((3,) if unreached else (2, 3)) and ways.live == 0
    assert {v.status for v in verdicts.values()} <= {"pass", "skip"} and len(unreached) <= 1, verdicts


def _reported_as_flaky(run: Any) -> Any:
    """``run_state_machine_as_test`` as Hypothesis may run it when an example ends on a BaseException before
    drawing as far as an earlier example with the same first draws: it reports a FlakyStrategyDefinition of
    its own instead (seen with a child that timed out between two flushes of its lines)."""

    def masked(machine: Any, settings: Settings) -> None:
        try:
            run(machine, settings=settings)
        except (searching.SearchStopped, StoppedViolation, SearchDiverged) as end:
            raise FlakyStrategyDefinition("Inconsistent data generation! The second run stopped drawing "
                                          "earlier than the first run") from end

    return masked


def mask_ends(monkeypatch: pytest.MonkeyPatch) -> None:
    """From here on, every search of this test ends as ``_reported_as_flaky`` says Hypothesis may end it."""
    for module in (searching, verdicts_module):
        monkeypatch.setattr(module, "run_state_machine_as_test", _reported_as_flaky(run_state_machine_as_test))


def handed_over(path: Path, source: str, ways: Ways, max_failures: int = 1,
                masking: pytest.MonkeyPatch | None = None, **limits: Any) -> dict:
    """The allocator verdicts of the submission ``source`` (written to ``path``), checked to equal the live
    ones and to come from the live channel after the child's search stopped (with ``masking``: while
    Hypothesis reports each end of a search as an error of its own, ``mask_ends``)."""
    path.write_text(source)
    impl = isolated(str(path), **limits)
    try:  # the first failing clause is enough (by default): every later search would meet the same end
        live = lifecycle_verdicts("allocator", impl.namespace, SETTINGS, max_failures=max_failures)
        ways.live_timeouts, ways.timeouts, ways.live = ways.timeouts, 0, 0
        impl.close()
        if masking is not None:
            mask_ends(masking)
        verdicts, note = lifecycle_verdicts_of(impl, "allocator", SETTINGS, max_failures=max_failures)
    finally:
        impl.close()
    assert note == "" and verdicts == live and ways.searches == 1 and ways.live > 0
    return verdicts


def test_a_search_that_hangs_is_judged_again_over_the_live_channel(tmp_path: Path, ways: Ways,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    # A call that hangs ends the part: its clause fails, unshrunk and not run again, the rest are not judged.
    # The child's search stopping and the live channel's stop are each what the part is judged by, even
    # reported by Hypothesis as an error of its own (masking); the live run is judged unmasked.
    verdicts = handed_over(tmp_path / "hangs.py", HANGS, ways, max_failures=MAX_FAILURES, masking=monkeypatch,
                           call_seconds=2)
    failed = [(cid, v.message) for cid, v in verdicts.items() if v.status == "fail"]
    assert len(failed) == 1, failed
    clause, message = failed[0]
    assert "pool.fork(" in message and "did not return: the submission did not answer within 2 s" in message
    assert message.rstrip().splitlines()[-1].strip().startswith("pool.fork(")  # the replay ends at the hung call
    assert re.search(r'File "hangs.py", line 7, in fork', message), message  # where the loop was stopped
    stopped = f"not judged: the allocator part stopped at a call that did not return in time ({clause})"
    assert {v.message for v in verdicts.values() if v.status != "fail"} == {stopped}
    assert ways.live_timeouts == 1  # over the live channel: one wait, no shrinking, no final run
    assert ways.timeouts == 2       # the child's search, then the live channel: one wait each


def test_a_divergence_that_hypothesis_reports_as_flaky_is_still_a_divergence(tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "tampers.py").write_text(TAMPERS)
    impl = isolated(str(tmp_path / "tampers.py"))
    try:
        live = lifecycle_verdicts("allocator", impl.namespace, SETTINGS)
        impl.close()
        mask_ends(monkeypatch)
        verdicts, note = lifecycle_verdicts_of(impl, "allocator", SETTINGS)
    finally:
        impl.close()
    assert verdicts == live and "judged one request at a time" in note, note
    assert {v.status for v in verdicts.values()} == {"pass"}


EXITS = '''
import sys

from pytest_cbatch.reference.scheduler_faults import PagedKV as _PagedKV, RecomputeRequest, TransferManager


class PagedKV(_PagedKV):
    def fork(self, source, target):
        sys.exit(3)
'''


def test_a_search_whose_submission_exits_is_judged_again_over_the_live_channel(tmp_path: Path,
                                                                               ways: Ways) -> None:
    verdicts = handed_over(tmp_path / "exits.py", EXITS, ways)
    assert any("sys.exit(3)" in v.message for v in verdicts.values() if v.status == "fail"), verdicts


def test_a_proxy_from_before_an_exit_releases_nothing_of_the_next_child(tmp_path: Path) -> None:
    """The child is restarted after a call that exits, and the next one numbers its objects afresh: a proxy of
    the old child collected later must not release the new child's object of the same number."""
    (tmp_path / "exits.py").write_text(EXITS)
    impl = isolated(str(tmp_path / "exits.py"))
    try:
        old = impl.namespace.PagedKV(4, 1)
        old.create("a")
        with pytest.raises(SandboxFailure, match=r"called sys\.exit\(3\)"):
            old.fork("a", "b")
        new = impl.namespace.PagedKV(4, 1)
        del old
        gc.collect()
        new.create("a")
        assert sorted(new.free) == [0, 1, 2, 3]
    finally:
        impl.close()


def test_a_submission_that_exits_mid_example_fails_the_clauses_of_that_call(tmp_path: Path,
                                                                            request: pytest.FixtureRequest) -> None:
    """Judged over the live channel with shrinking and a second search: the calls that exit fail their clauses,
    saying so, and nothing is a kit error (the proxies of each exited child used to release the next child's
    objects while Hypothesis replayed an example: FlakyStrategyDefinition, every clause "error").  The same
    power by default: test_a_proxy_from_before_an_exit_releases_nothing_of_the_next_child."""
    if not request.config.getoption("--run-slow"):
        pytest.skip("shrinks examples over a child restarted at each exit (seconds): with --run-slow")
    (tmp_path / "exits.py").write_text(EXITS)
    impl = isolated(str(tmp_path / "exits.py"))
    try:
        verdicts = lifecycle_verdicts("allocator", impl.namespace, Settings(SHRINKS, max_examples=3), max_failures=2)
    finally:
        impl.close()
    failed = {cid: v.message for cid, v in verdicts.items() if v.status == "fail"}
    assert "error" not in {v.status for v in verdicts.values()}, verdicts
    assert failed and all("called sys.exit(3)" in message for message in failed.values()), failed


SKIPS_SEARCH = '''
from pytest_cbatch.reference.scheduler_faults import PagedKV, RecomputeRequest, TransferManager
import hypothesis.stateful as _stateful

_stateful.run_state_machine_as_test = lambda *args, **kwargs: None  # the child's searches run no example
'''


def test_a_submission_that_stops_its_childs_search_is_judged_one_request_at_a_time(tmp_path: Path,
                                                                                   ways: Ways) -> None:
    (tmp_path / "skips.py").write_text(SKIPS_SEARCH)
    impl = isolated(str(tmp_path / "skips.py"))
    try:
        verdicts, note = lifecycle_verdicts_of(impl, "allocator", SETTINGS)
        assert verdicts == lifecycle_verdicts("allocator", impl.namespace, SETTINGS)
    finally:
        impl.close()
    assert "judged one request at a time" in note and "where the grader starts an example" in note, note
    assert ways.searches == 1 and ways.live > 0


@pytest.mark.skipif(bwrap_problem() is not None, reason=f"bubblewrap cannot run here: {bwrap_problem()}")
def test_parts_are_searched_inside_bubblewrap(ways: Ways, tmp_path: Path) -> None:
    """As grading runs a student's folder: bubblewrap leaves the kit's reference out, and the child's search
    imports none of it (it once did, through the contract package, and every part of every graded submission
    was judged again one request at a time)."""
    make_samples(tmp_path, only=("correct",))
    folder = str(tmp_path / "correct")
    impl = IsolatedImplementation("correct", LoadSpec(folder, submission_files(folder)), Limits(), mode="bwrap",
                                  guard=KitGuard())
    try:
        verdicts, note = lifecycle_verdicts_of(impl, "recompute", Settings(SETTINGS, max_examples=4))
    finally:
        impl.close()
    assert note == "" and {v.status for v in verdicts.values()} == {"pass"}
    assert ways.searches == 2 and ways.live == 0


def test_the_search_settings_are_the_same_on_both_sides_but_for_shrinking() -> None:
    base = Settings(max_examples=7, stateful_step_count=13, derandomize=False, deadline=None,
                    suppress_health_check=[HealthCheck.filter_too_much],
                    phases=(Phase.explicit, Phase.generate, Phase.shrink))
    doc = settings_document(base)
    child, seed = search_settings(doc, shrink=True)
    grader, same_seed = search_settings(doc, shrink=False)
    assert seed == same_seed and isinstance(seed, int)
    assert Phase.shrink in child.phases and Phase.shrink not in grader.phases
    for settings in (child, grader):
        assert (settings.max_examples, settings.stateful_step_count, settings.database) == (7, 13, None)
        assert {HealthCheck.filter_too_much, HealthCheck.too_slow} <= set(settings.suppress_health_check)
    assert settings_document(Settings(base, derandomize=True))["seed"] is None


@pytest.mark.parametrize("value", [[1, "a", None, 2.5, True], {"a": [1, {"b": []}]}, [], {}])
def test_plain_json_values_travel_as_they_are(value: Any) -> None:
    plain, copy = native_copy(value)
    assert plain and copy == value and (copy is not value)


@pytest.mark.parametrize("value", [(1, 2), {1: "a"}, [{1, 2}], [object()], {"a": (1,)}])
def test_other_values_are_encoded(value: Any) -> None:
    assert native_copy(value) == (False, None)


def test_a_submission_that_patches_its_copy_of_the_kit_is_judged_one_request_at_a_time(tmp_path: Path) -> None:
    (tmp_path / "tampers.py").write_text(TAMPERS)
    # No limit of seconds is part of what this judges: a loaded machine once took the default 10 s per call.
    impl = isolated(str(tmp_path / "tampers.py"), call_seconds=600, import_seconds=600)
    try:
        verdicts, note = lifecycle_verdicts_of(impl, "allocator", SETTINGS)
        assert "judged one request at a time" in note and "the child made" in note, note
        assert verdicts == lifecycle_verdicts("allocator", impl.namespace, SETTINGS)
    finally:
        impl.close()
    assert {v.status for v in verdicts.values()} == {"pass"}


def test_pytest_cbatch_isolate_judges_the_lifecycle_suite_from_the_sandbox(pytester: pytest.Pytester) -> None:
    pytester.makeconftest("""
        from hypothesis import Phase, settings
        settings.register_profile("tiny", max_examples=10, derandomize=True, database=None, deadline=None,
                                  phases=[Phase.explicit, Phase.reuse, Phase.generate])
    """)
    result = pytester.runpytest_subprocess(
        "--cbatch-isolate", "--cbatch-sandbox=process", "--hypothesis-profile=tiny",
        "--cbatch-impl=pytest_cbatch.examples.broken_lifecycle:replay_refeed", "-k", "test_lifecycle and recompute")
    outcomes = result.parseoutcomes()  # (without torch the numerics module is one skip)
    assert outcomes.get("failed") == 1 and not outcomes.get("passed") and not outcomes.get("errors"), outcomes
    result.stdout.fnmatch_lines(["*[[]lifecycle.replay_no_refeed[]]*", "*lifecycle recompute clauses do not hold*"])
    assert "one request at a time" not in result.stdout.str()
