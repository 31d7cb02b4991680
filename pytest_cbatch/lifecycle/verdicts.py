"""Running the lifecycle machines: settings, missing parts, and one verdict per clause for grading."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from hypothesis import settings as Settings
from hypothesis.stateful import RuleBasedStateMachine, run_state_machine_as_test

from ..bounded import Bounds, bounded_machine
from .allocator import allocator_machine
from .clauses import PART_CLAUSES, PARTS, LifecycleViolation
from .recompute import recompute_machine
from .transfer import transfer_machine

__all__ = ["MACHINES", "MAX_FAILURES", "MIN_STEPS", "Verdict", "lifecycle_settings", "lifecycle_verdicts",
           "missing_parts"]

MIN_STEPS = 50
"""Floor for ``stateful_step_count`` (a profile may ask for more): replay and drain bugs need
histories of a few dozen operations."""

MAX_FAILURES = 4
"""How many failing clauses ``lifecycle_verdicts`` isolates in one part before it stops judging."""

MACHINES: dict[str, Callable[..., type[RuleBasedStateMachine]]] = {
    "allocator": allocator_machine,
    "recompute": recompute_machine,
    "transfer": transfer_machine,
}
"""Part -> machine factory ``(impl, disabled=frozenset()) -> RuleBasedStateMachine subclass``."""


@dataclass(frozen=True)
class Verdict:
    """One clause's verdict: ``status`` is ``pass``, ``fail``, ``skip`` (not judged, ``message`` says why)
    or ``error`` (the run broke down outside any clause, for example a non-deterministic implementation)."""

    status: str
    message: str = ""


def missing_parts(impl: object) -> dict[str, str]:
    """Map each part of PARTS that ``impl`` cannot run to the reason; every part needs PagedKV."""
    missing = {}
    for part, name in PARTS.items():
        absent = [n for n in dict.fromkeys(("PagedKV", name)) if not callable(getattr(impl, n, None))]
        if absent:
            missing[part] = f"the implementation exposes no {' or '.join(absent)}"
    return missing


def lifecycle_settings(base: Settings | None = None) -> Settings:
    """Return ``base`` (default: the active profile) with no deadline and at least MIN_STEPS steps.

    ``max_examples``, derandomization and the database are left to the profile.
    One step is added because Hypothesis spends the first step of each run on
    the ``@initialize`` rule, so the count is the number of operations.  Only
    the first bug of a run is reported: ``lifecycle_verdicts`` isolates the rest.
    """
    base = Settings() if base is None else base
    return Settings(base, deadline=None, report_multiple_bugs=False,
                    stateful_step_count=max(base.stateful_step_count, MIN_STEPS) + 1)


def lifecycle_verdicts(part: str, namespace: object, settings: Settings | None = None, *,
                       max_failures: int = MAX_FAILURES, bounds: Bounds | None = None) -> dict[str, Verdict]:
    """Judge every clause of ``part`` on the implementation ``namespace``: ``{clause id: Verdict}``.

    The part's machine runs under ``lifecycle_settings(settings)``.  When it
    fails on clause X, X's verdict is ``fail`` with the violation's message
    (clause id first, then a runnable replay) and the machine runs again with X
    disabled: a run that breaks X halts there instead of failing, so one bug
    does not cost every clause.  After ``max_failures`` failing clauses the
    rest are ``skip``; a part the namespace lacks is ``skip`` throughout; a run
    that breaks down outside any clause makes the clauses not yet judged ``error``.
    With ``bounds``, every example runs under them (``bounded.bounded_machine``): a stuck one
    raises ``bounded.CallStopped`` at once, without shrinking.
    """
    if part not in PARTS:
        raise ValueError(f"unknown lifecycle part {part!r}; expected one of {', '.join(PARTS)}")
    clauses = PART_CLAUSES[part]
    missing = missing_parts(namespace).get(part)
    if missing is not None:
        return {cid: Verdict("skip", f"lifecycle {part}: {missing}") for cid in clauses}
    verdicts: dict[str, Verdict] = {}
    config = lifecycle_settings(settings)
    while len(verdicts) < max_failures:
        machine = MACHINES[part](namespace, frozenset(verdicts))
        if bounds is not None:
            machine = bounded_machine(machine, bounds)
        try:
            run_state_machine_as_test(machine, settings=config)
        except LifecycleViolation as violation:
            verdicts[violation.clause] = Verdict("fail", str(violation))
            continue
        except Exception as exc:  # Flaky, a health check, or the implementation broke the machine itself
            rest = Verdict("error", f"lifecycle {part} broke down outside any clause: {type(exc).__name__}: {exc}")
        else:
            rest = Verdict("pass")
        return {cid: verdicts.get(cid, rest) for cid in clauses}
    skipped = Verdict("skip", f"not judged: the {part} part stopped after {max_failures} failing clauses")
    return {cid: verdicts.get(cid, skipped) for cid in clauses}
