"""Mirrored lifecycle steps (pytest_cbatch.sandbox.mirror): the child runs each step first, the parent
judges it from the record, and the verdicts are exactly those of judging one request at a time."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings as Settings

from pytest_cbatch.lifecycle import PARTS, lifecycle_verdicts
from pytest_cbatch.sandbox import IsolatedImplementation, bwrap_problem, lifecycle_verdicts_of, mirrored
from pytest_cbatch.sandbox.mirror import ReplayChannel
from sandbox_cases import (
    BROKEN, FINDS, HANGS, QUICK, REFERENCE, SETTINGS, TAMPERS, isolated, parametrize_broken, part_of,
)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    # Mirrored steps judge a part only when the child's search stops early: one bug by default.
    parametrize_broken(metafunc, QUICK[:1])


def mirrored_verdicts(impl: IsolatedImplementation, part: str, settings: Settings = SETTINGS, **options: Any) -> dict:
    channel = impl.lifecycle_channel(ReplayChannel)
    verdicts = lifecycle_verdicts(part, channel.namespace, settings, wrap=lambda cls: mirrored(cls, channel),
                                  **options)
    assert channel.exchanges > 0 and channel.divergence is None
    return verdicts


def test_mirrored_verdicts_of_a_correct_submission_equal_the_live_ones() -> None:
    impl = isolated(REFERENCE)
    settings = Settings(SETTINGS, max_examples=3)
    try:
        for part in PARTS:
            live = lifecycle_verdicts(part, impl.namespace, settings)
            assert mirrored_verdicts(impl, part, settings) == live
            assert {v.status for v in live.values()} == {"pass"}, part
    finally:
        impl.close()


def test_mirrored_verdicts_of_a_broken_submission_equal_the_live_ones(broken: str) -> None:
    namespace, clause = BROKEN[broken]
    part = part_of(broken)
    impl = isolated(f"pytest_cbatch.examples.broken_lifecycle:{broken}")
    try:  # up to the first failing clause: the searches after it, with that clause disabled, add nothing here
        live = lifecycle_verdicts(part, impl.namespace, FINDS, max_failures=1)
        assert mirrored_verdicts(impl, part, FINDS, max_failures=1) == live
    finally:
        impl.close()
    if broken in QUICK:  # a few bugs need more examples (or seeds) than these searches get
        assert live[clause].status == "fail" and live[clause].message.startswith(f"[{clause}] ")
    in_process = lifecycle_verdicts(part, namespace, FINDS, max_failures=1)
    assert {c: v.status for c, v in live.items()} == {c: v.status for c, v in in_process.items()}


def test_a_step_that_hangs_times_out_at_the_call_that_hangs(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    if not request.config.getoption("--run-slow"):  # the searched path's hang test compares with live by default
        pytest.skip("with --run-slow: test_sandbox_search judges a hang end to end by default")
    (tmp_path / "hangs.py").write_text(HANGS)
    impl = isolated(str(tmp_path / "hangs.py"), call_seconds=2)
    try:  # the first failing clause is enough: every later search would wait for the hang again
        live = lifecycle_verdicts("allocator", impl.namespace, SETTINGS, max_failures=1)
        impl.close()
        assert mirrored_verdicts(impl, "allocator", SETTINGS, max_failures=1) == live
    finally:
        impl.close()
    failed = [v.message for v in live.values() if v.status == "fail"]
    assert len(failed) == 1 and "pool.fork(" in failed[0] and "did not answer within 2 s" in failed[0], failed



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


@pytest.mark.skipif(bwrap_problem() is not None, reason=f"bubblewrap cannot run here: {bwrap_problem()}")
def test_steps_are_mirrored_inside_bubblewrap() -> None:
    impl = isolated(REFERENCE, mode="bwrap")
    try:
        verdicts = mirrored_verdicts(impl, "recompute", Settings(SETTINGS, max_examples=4))
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
    assert "one request at a time" not in result.stdout.str() and "one step at a time" not in result.stdout.str()
