"""How a failing lifecycle part is shrunk: no explain phase, a bounded shrink, runs cut at the shortest failure."""

from __future__ import annotations

import pytest
from hypothesis import Phase, Verbosity, settings
from hypothesis.internal.conjecture import engine
from hypothesis.stateful import run_state_machine_as_test

from pytest_cbatch.examples.broken_lifecycle import BROKEN
from pytest_cbatch.lifecycle import MACHINES, LifecycleViolation, lifecycle_settings, lifecycle_verdicts, shrink_budget
from pytest_cbatch.lifecycle.machine import Shortest

BASE = settings(max_examples=40, derandomize=True, database=None, deadline=None)


def test_settings_drop_the_explain_phase_and_keep_the_others() -> None:
    config = lifecycle_settings(BASE)
    assert Phase.explain not in config.phases
    assert set(config.phases) == set(BASE.phases) - {Phase.explain}
    assert config.verbosity == Verbosity.quiet and config.max_examples == 40


def test_shrink_budget_lowers_the_engine_limit_and_restores_it() -> None:
    before = engine.MAX_SHRINKING_SECONDS
    with shrink_budget(1.5):
        assert engine.MAX_SHRINKING_SECONDS == 1.5
    assert engine.MAX_SHRINKING_SECONDS == before
    with pytest.raises(RuntimeError), shrink_budget(2.0):
        raise RuntimeError
    assert engine.MAX_SHRINKING_SECONDS == before
    with shrink_budget(10 * before):  # never longer than Hypothesis's own limit
        assert engine.MAX_SHRINKING_SECONDS == before


def test_shortest_remembers_the_fewest_lines() -> None:
    shortest = Shortest()
    assert not shortest.exceeded(10**6)
    shortest.note(30)
    shortest.note(40)
    assert shortest.lines == 30 and shortest.exceeded(31) and not shortest.exceeded(30)


def test_a_run_longer_than_the_shortest_failure_halts_unjudged() -> None:
    """After a failure at N script lines, a later run of the same class stops judging past N lines."""
    namespace, clause = BROKEN["second_cancel_raises"]
    machine = MACHINES["recompute"](namespace)
    with pytest.raises(LifecycleViolation):
        run_state_machine_as_test(machine, settings=lifecycle_settings(settings(BASE, phases=(Phase.generate,))))
    assert machine.shortest.lines is not None
    run = machine()
    run.setup(capacity=4, block_size=1, prompts=[[1]])
    run.script += ["# padding"] * machine.shortest.lines
    run.advance(pick=0, prefer_active=True, action="sample")
    assert run.halted and not run.failed


def test_shrinking_keeps_the_clause_and_shortens_the_replay() -> None:
    namespace, clause = BROKEN["second_cancel_raises"]
    few = settings(BASE, max_examples=10)
    found = lifecycle_verdicts("recompute", namespace, settings(few, phases=(Phase.explicit, Phase.generate)))
    shrunk = lifecycle_verdicts("recompute", namespace, few)
    assert {c for c, v in shrunk.items() if v.status == "fail"} == {c for c, v in found.items() if v.status == "fail"}
    assert shrunk[clause].message.count("\n") <= found[clause].message.count("\n")


def test_the_final_run_is_never_halted(monkeypatch: pytest.MonkeyPatch) -> None:
    """Hypothesis reports the least failing example by its own order, which may have a longer script than
    the shortest failure seen: its final run must fail again, so it is judged to the end (else the part
    broke down with a FlakyFailure)."""
    from pytest_cbatch.lifecycle import machine as machines

    namespace, _clause = BROKEN["second_cancel_raises"]
    cls = MACHINES["recompute"](namespace)
    cls.shortest.note(1)
    for final, halted in ((True, False), (False, True)):
        monkeypatch.setattr(machines, "final_run", lambda: final)
        run = cls()
        run.setup(capacity=4, block_size=1, prompts=[[1]])
        run.advance(pick=0, prefer_active=True, action="sample")
        assert run.halted is halted
