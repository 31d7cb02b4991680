"""The generated-trace tests: one clause judged on the examples Hypothesis draws, covered violations set aside.

Each clause has its own generated test per strategy (``test_generated_traces[<clause>]``), and all of them
judge the same examples: those are drawn once per run (``GeneratedExamples.drawn``), and every clause reads
the report the ``Judge`` cached for each, so an example costs one simulation for all clauses.  A violation
an expectation entry covers (``expect.covering_entry``) is counted and set aside, never raised; only a
clause with an uncovered violation runs Hypothesis itself (``GeneratedExamples.search``), which draws the
same examples, fails on the same one, and shrinks it for that clause alone.
"""

from __future__ import annotations

import random
from typing import Any, Callable

import pytest
from hypothesis import given, seed, settings
from hypothesis.control import current_build_context
from hypothesis.database import ReadOnlyDatabase
from hypothesis.strategies import SearchStrategy

from .expect import Entry, covering_entry, xfail_covered
from .failure_report import fail_clause
from .run_state import CbatchState

__all__ = ["GeneratedExamples", "judge_generated", "GENERATED_SKIPPED"]

GENERATED_SKIPPED = ("invalid_input_refused", "deterministic")
"""Clauses without a generated test: invalid inputs have their own cases, determinism reruns every example."""

Example = tuple[list[dict[str, Any]], dict[str, Any]]


def _searcher(strategy: SearchStrategy[Example], run_seed: int | None,
              chosen: settings | None = None) -> Callable[..., None]:
    """A Hypothesis search over ``strategy`` that hands each example to its ``check`` argument.

    Every searcher this makes has the same source, so the same digest: derandomized, or given the same
    ``run_seed``, each draws the same examples until its check first fails.
    """
    @given(workload=strategy)
    def search(workload: Example, check: Callable[[Example], None]) -> None:
        check(workload)

    search = search if chosen is None else chosen(search)
    return search if run_seed is None else seed(run_seed)(search)


class GeneratedExamples:
    """The run's generated examples, drawn once per strategy and shared by every clause's test."""

    def __init__(self) -> None:
        self.seed = None if settings.default.derandomize else random.getrandbits(64)
        self._drawn: dict[str, list[Example]] = {}

    def drawn(self, key: str, strategy: SearchStrategy[Example]) -> list[Example]:
        """The examples the search over ``strategy`` draws when nothing fails (``key`` names the strategy).

        Drawn under the profile in effect, reading (never changing) its example database, so examples it
        remembers failing are among them.
        """
        if key not in self._drawn:
            found: list[Example] = []
            database = settings.default.database
            chosen = settings(settings.default, database=None if database is None else ReadOnlyDatabase(database))
            _searcher(strategy, self.seed, chosen)(check=found.append)
            self._drawn[key] = found
        return self._drawn[key]

    def search(self, strategy: SearchStrategy[Example]) -> Callable[..., None]:
        """The search that draws the same examples, for a clause that failed on one of them to shrink it."""
        return _searcher(strategy, self.seed)


class _ClauseCheck:
    """Judges one clause on one generated example; a violation an expectation covers is counted, not raised."""

    def __init__(self, state: CbatchState, clause: str, workload: str, covered_by: Entry | None,
                 preemption: bool) -> None:
        self.state, self.clause, self.workload = state, clause, workload
        self.covered_by = covered_by
        self.preemption = preemption
        self.judged = self.deviated = 0
        self.skip_reason = ""
        self.stopped = False  # the implementation was stopped for a limit on the last example judged

    def __repr__(self) -> str:  # how Hypothesis's falsifying example names the check
        return f"<{self.clause} on {self.workload}>"

    def failure(self, example: Example) -> tuple[list[dict[str, Any]], dict[str, Any], Any] | None:
        """The trace, config and result of an uncovered violation of the clause on ``example``, or None."""
        trace, config = example[0], self.state.workload_config(example[1])
        if self.preemption:
            reason = self.state.impl.unsupported_reason(config)
            if reason:
                pytest.skip(reason)
        result = self.state.judge.judge(self.clause, trace, config)
        if result.status == "skip":
            self.stopped = bool(result.blocked_by) and bool(self.state.judge.run(trace, config).outcome.stopped)
            self.skip_reason = result.reason if self.stopped else self.skip_reason or result.reason
            return None
        self.judged += 1
        if result.status == "pass":
            return None
        if self.covered_by is not None:
            self.deviated += 1
            return None
        return trace, config, result

    def __call__(self, example: Example) -> None:
        found = self.failure(example)
        if found is None:
            return
        trace, config, result = found
        if not (result.stopped or current_build_context().is_final):  # a step of the search or its shrinking
            pytest.fail(f"[{self.clause}] failed on workload {self.workload!r}", pytrace=False)
        fail_clause(self.state, self.clause, self.workload, trace, config, result, shrink=False)  # the one reported


def judge_generated(state: CbatchState, item: pytest.Item, examples: GeneratedExamples, clause: str,
                    workload: str, strategy: SearchStrategy[Example], *, preemption: bool = False) -> None:
    """The generated-trace test of ``clause`` on ``workload`` (``generated-reserve``, say), the examples of
    ``strategy``: fails with the clause's first uncovered violation, shrunk; is an expected failure when
    every violation was covered; skips when no example could judge the clause; passes otherwise.
    ``preemption``: skip when the implementation does not support an example's config.  Only the example
    reported writes a replay file and a picture (not each step of Hypothesis's search and shrinking)."""
    check = _ClauseCheck(state, clause, workload, covering_entry(item), preemption)
    drawn = examples.drawn(workload, strategy)
    failing = None
    for example in drawn:
        failing = check.failure(example)
        if failing is not None or check.stopped:  # a run stopped for a limit: the next ones would wait it out too
            break
    if failing is not None:
        examples.search(strategy)(check=check)
        # the search met no failure this time (an implementation that is not deterministic): the drawn one fails
        fail_clause(state, clause, workload, *failing, shrink=False)
    if check.covered_by is not None and check.deviated:
        xfail_covered(item, check.covered_by, check.deviated, check.judged)
    if check.stopped:
        pytest.skip(f"{clause} was judged on {check.judged} generated examples, then the implementation was "
                    f"stopped for a limit: {check.skip_reason}")
    if not check.judged:
        pytest.skip(f"{clause} was judged on none of the {len(drawn)} generated examples: {check.skip_reason}")
