"""Running the lifecycle machines: settings, missing parts, and one verdict per clause for grading."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from hypothesis import Phase, Verbosity
from hypothesis import settings as Settings
from hypothesis.stateful import RuleBasedStateMachine, run_state_machine_as_test

from ..bounded import Bounds, bounded_machine
from .allocator import allocator_machine
from .clauses import PART_CLAUSES, PARTS, LifecycleViolation, StoppedViolation
from .oracle import PoolState
from .recompute import recompute_machine
from .transfer import transfer_machine

__all__ = ["MACHINES", "MAX_FAILURES", "MIN_STEPS", "SHORT_STEPS", "SHRINK_SECONDS", "Verdict", "lifecycle_settings",
           "lifecycle_verdicts", "missing_parts", "search_here", "shrink_budget", "steady_draws"]

MIN_STEPS = 50
"""Floor for ``stateful_step_count`` (a profile may ask for more): replay and drain bugs need
histories of a few dozen operations."""

MAX_FAILURES = 4
"""How many failing clauses ``lifecycle_verdicts`` isolates in one part before it stops judging."""

SHORT_STEPS = 12
"""Steps of the short runs ``lifecycle_verdicts`` tries before the long ones: most bugs show
within a dozen operations, and a short failing run shrinks in a fraction of a second, where a
failure found at step 50 takes minutes to shrink."""

SHRINK_SECONDS = 6.0
"""How long ``lifecycle_verdicts`` shrinks one failing clause's example.  Most of the shortening
comes in the first second; Hypothesis's own limit is five minutes per failure."""

MACHINES: dict[str, Callable[..., type[RuleBasedStateMachine]]] = {
    "allocator": allocator_machine,
    "recompute": recompute_machine,
    "transfer": transfer_machine,
}
"""Part -> machine factory ``(impl, disabled=frozenset()) -> RuleBasedStateMachine subclass``."""


@dataclass(frozen=True)
class Verdict:
    """One clause's verdict: ``status`` is ``pass`` (judged, and it held), ``fail``, ``skip`` (not judged,
    ``message`` says why, naming the failing clause that kept it from being judged, if one did) or ``error``
    (the run broke down outside any clause, for example a non-deterministic implementation).  A failing
    clause's ``steps`` are its replay's lines, each with the contract's model of the pool after it
    (``LifecycleViolation.steps``): what its picture draws."""

    status: str
    message: str = ""
    steps: tuple[tuple[str, PoolState | None], ...] = ()


def missing_parts(impl: object) -> dict[str, str]:
    """Map each part of PARTS that ``impl`` cannot run to the reason; every part needs PagedKV."""
    missing = {}
    for part, name in PARTS.items():
        absent = [n for n in dict.fromkeys(("PagedKV", name)) if not callable(getattr(impl, n, None))]
        if absent:
            missing[part] = f"the implementation exposes no {' or '.join(absent)}"
    return missing


def lifecycle_settings(base: Settings | None = None) -> Settings:
    """Return ``base`` (default: the active profile) with no deadline, at least MIN_STEPS steps
    and no explain phase.

    ``max_examples``, derandomization and the database are left to the profile.
    One step is added because Hypothesis spends the first step of each run on
    the ``@initialize`` rule, so the count is the number of operations.  Only
    the first bug of a run is reported: ``lifecycle_verdicts`` isolates the rest.
    The explain phase is dropped: it re-runs the shrunk example hundreds of
    times with parts varied, which took minutes for a failing part, to annotate
    a Hypothesis report that the violation's own replay replaces.  For the same
    reason Hypothesis itself is quiet: its step listing and warnings would
    repeat or contradict the violation's message.
    """
    base = Settings() if base is None else base
    return Settings(base, deadline=None, report_multiple_bugs=False, verbosity=Verbosity.quiet,
                    phases=tuple(phase for phase in base.phases if phase is not Phase.explain),
                    stateful_step_count=max(base.stateful_step_count, MIN_STEPS) + 1)


@contextmanager
def shrink_budget(seconds: float) -> Iterator[None]:
    """Within the block, Hypothesis stops shrinking a failure after ``seconds`` (never longer than its own limit).

    Hypothesis has no setting for it; its engine reads the limit from a module
    constant when shrinking starts.  Where a Hypothesis version lacks the
    constant, this does nothing.
    """
    from hypothesis.internal.conjecture import engine

    limit = getattr(engine, "MAX_SHRINKING_SECONDS", None)
    if not isinstance(limit, (int, float)):
        yield
        return
    engine.MAX_SHRINKING_SECONDS = min(limit, seconds)  # type: ignore[assignment]
    try:
        yield
    finally:
        engine.MAX_SHRINKING_SECONDS = limit  # type: ignore[assignment]


@contextmanager
def steady_draws() -> Iterator[None]:
    """Within the block, Hypothesis draws no constants from the modules this process has loaded.

    Hypothesis now and then draws a constant it found in the source of
    "local" modules (any not installed in site-packages), so one seeded
    search draws other examples in a process that has loaded other modules:
    a student's pytest run and the grading command, or the sandbox child and
    the grader that judges its search.  Without them every process draws the
    same.  Where a Hypothesis version lacks the hook, this does nothing.
    """
    from hypothesis.internal.conjecture import providers

    found, cache = getattr(providers, "_get_local_constants", None), getattr(providers, "CONSTANTS_CACHE", None)
    if found is None or cache is None or not hasattr(providers, "Constants"):
        yield
        return
    none = providers.Constants()
    providers._get_local_constants = lambda: none
    cache.cache.clear()  # its entries hold the local constants seen so far
    try:
        yield
    finally:
        providers._get_local_constants = found
        cache.cache.clear()


MachineWrap = Callable[[type[RuleBasedStateMachine]], type[RuleBasedStateMachine]]
Search = Callable[[type[RuleBasedStateMachine], Settings], None]
"""Runs one search of a machine class under the settings, raising the violation it finds (shrunk)."""


def search_here(machine: type[RuleBasedStateMachine], settings: Settings) -> None:
    """The default ``Search``: Hypothesis runs the machine in this process, shrinking for SHRINK_SECONDS,
    with ``steady_draws``."""
    with shrink_budget(SHRINK_SECONDS), steady_draws():
        run_state_machine_as_test(machine, settings=settings)


def lifecycle_verdicts(part: str, namespace: object, settings: Settings | None = None, *,
                       max_failures: int = MAX_FAILURES, bounds: Bounds | None = None,
                       wrap: MachineWrap | None = None, search: Search | None = None) -> dict[str, Verdict]:
    """Judge every clause of ``part`` on the implementation ``namespace``: ``{clause id: Verdict}``.

    The part's machine runs under ``lifecycle_settings(settings)``.  When it
    fails on clause X, X's verdict is ``fail`` with the violation's message
    (clause id first, then a runnable replay) and the machine runs again with X
    disabled: a run that breaks X halts there instead of failing, so one bug
    does not cost every clause.  After ``max_failures`` failing clauses the
    rest are ``skip``; a part the namespace lacks is ``skip`` throughout; a run
    that breaks down outside any clause makes the clauses not yet judged ``error``.
    A clause is ``pass`` only if it was judged (``machine``: a check of it ran
    to its end and held) on at least one run of the part's searches and never
    failed; when the searches end with no (further) failure, a clause no run
    judged, because every run failed or halted on an earlier step (a constructor
    that always raises, once its clause is disabled), is ``skip``, "not judged",
    naming the failing clauses that stopped the runs first.  Before that, the
    part gets one more search at full length with twice the examples (a rare
    check of a correct part is then seldom left unreached).
    Each search runs the profile's examples twice: first with runs of
    SHORT_STEPS operations, then (if those find nothing) at full length, so a
    passing part keeps every long run and gains the short ones.  Each failing
    clause's example is shrunk for at most SHRINK_SECONDS.  A call that does not return in time
    (``bounded.CallTimedOut``: a sandbox child that did not answer) fails the clause of its step,
    unshrunk, and ends the part: the clauses not yet judged are ``skip``.
    With ``bounds``, every example runs under them (``bounded.bounded_machine``): a stuck one
    raises ``bounded.CallStopped`` at once, without shrinking.  ``wrap``, when given, turns each
    machine class bound to ``namespace`` into the one that runs (``sandbox.search.searched``), and
    ``search`` runs each search in place of ``search_here`` (``sandbox.search``).
    """
    if part not in PARTS:
        raise ValueError(f"unknown lifecycle part {part!r}; expected one of {', '.join(PARTS)}")
    clauses = PART_CLAUSES[part]
    missing = missing_parts(namespace).get(part)
    if missing is not None:
        return {cid: Verdict("skip", f"lifecycle {part}: {missing}") for cid in clauses}
    verdicts: dict[str, Verdict] = {}
    held: set[str] = set()
    config = lifecycle_settings(settings)
    stages = (Settings(config, stateful_step_count=SHORT_STEPS + 1), config)
    extended = False
    while len(verdicts) < max_failures:
        try:
            violation = _first_violation(part, namespace, frozenset(verdicts), stages, held, bounds, wrap, search)
        except StoppedViolation as stop:
            clause = stop.violation.clause
            verdicts.setdefault(clause, Verdict("fail", str(stop.violation), stop.violation.steps()))
            rest = Verdict("skip", f"not judged: the {part} part stopped at a call that did not return in time "
                                   f"({clause})")
            return {cid: verdicts.get(cid, rest) for cid in clauses}
        except Exception as exc:  # Flaky, a health check, or the implementation broke the machine itself
            rest = Verdict("error", f"lifecycle {part} broke down outside any clause: {type(exc).__name__}: {exc}")
            return {cid: verdicts.get(cid, rest) for cid in clauses}
        if violation is None and not extended and any(cid not in verdicts and cid not in held for cid in clauses):
            # Some clause no run reached: one more search with twice the examples (new draws, seeded or not)
            # before calling it not judged, so a rare check of a correct part is seldom left unjudged.
            extended, stages = True, (Settings(config, max_examples=2 * config.max_examples),)
            continue
        if violation is None:
            return {cid: verdicts.get(cid) or (Verdict("pass") if cid in held else
                                              _unjudged(part, verdicts, 4 * config.max_examples))
                    for cid in clauses}
        verdicts[violation.clause] = Verdict("fail", str(violation), violation.steps())
    skipped = Verdict("skip", f"not judged: the {part} part stopped after {max_failures} failing clauses")
    return {cid: verdicts.get(cid, skipped) for cid in clauses}


def _unjudged(part: str, failed: dict[str, Verdict], examples: int) -> Verdict:
    """The verdict of a clause that no run of ``part`` judged, though the searches ended: ``failed`` (the
    clauses that failed, disabled in the later runs) stopped every run before a check of it, or, with none,
    the ``examples`` runs of its searches were too few to reach it."""
    if failed:
        return Verdict("skip", f"not judged: no run of the {part} part reached a check of this clause: every run "
                               f"stopped first at the failing clause {' or '.join(failed)} (fix that first)")
    return Verdict("skip", f"not judged: no run of the {part} part reached a check of this clause in {examples} "
                           f"examples; run more (the Hypothesis profile's max_examples, or "
                           f"lifecycle_examples in a grading rubric)")


def _first_violation(part: str, namespace: object, disabled: frozenset[str], stages: tuple[Settings, ...],
                     held: set[str], bounds: Bounds | None = None, wrap: MachineWrap | None = None,
                     search: Search | None = None) -> LifecycleViolation | None:
    """Run the part's machine under each of ``stages`` in turn; the first violation found, shrunk, or None.
    Adds to ``held`` the clauses judged on its runs (``LifecycleMachine.held``)."""
    for stage in stages:
        machine = MACHINES[part](namespace, disabled)
        if wrap is not None:
            machine = wrap(machine)
        if bounds is not None:
            machine = bounded_machine(machine, bounds)
        try:
            (search or search_here)(machine, stage)
        except LifecycleViolation as violation:
            return violation
        except Exception:
            if machine.stops:  # Hypothesis reported its own error (a FlakyStrategyDefinition, when an earlier
                raise machine.stops[0] from None  # example drew further) for the example the stop cut short
            raise
        finally:
            held |= machine.held
    return None
