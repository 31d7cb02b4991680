"""The breaker: after a run of calls stopped at the time limit, the next calls run at a short limit.

A scheduler that loops on every call would cost the whole time limit on every workload (some
fifty minutes for the suite at the default 60 s).  ``Breaker(limit)`` watches one
implementation's calls: after ``limit`` calls in a row were stopped at the time limit, it trips,
and every later call still runs, under ``short_seconds(full)`` instead of the full limit.  A call
that returns (a report, a refusal, anything but a stop for time) ends the streak, and the calls
after it have the full limit again.  So every workload is still run and judged, a loop costs
``short_seconds`` a call, and a submission that hangs only on some traces scores the same in any
workload order.  ``limit == 0`` never trips.  Grading has the same rule for a sandboxed submission
(``sandbox.Sandbox``, ``max_failures``).
"""

from __future__ import annotations

__all__ = ["DEFAULT_MAX_TIMEOUTS", "SHORT_SECONDS_MAX", "SHORT_SECONDS_MIN", "Breaker", "short_seconds"]

DEFAULT_MAX_TIMEOUTS = 3
"""Calls in a row stopped at the time limit before the next calls run at the short limit."""
SHORT_SECONDS_MIN = 1.0
SHORT_SECONDS_MAX = 10.0


def short_seconds(full: float) -> float:
    """The short limit of a tripped breaker: a tenth of ``full``, at least 1 s and at most 10 s, never
    more than ``full`` itself (``full <= 0``, no limit, stays no limit)."""
    if full <= 0:
        return full
    return min(full, max(SHORT_SECONDS_MIN, min(full / 10, SHORT_SECONDS_MAX)))


class Breaker:
    """Counts one implementation's calls stopped at the time limit in a row; see the module."""

    def __init__(self, limit: int = DEFAULT_MAX_TIMEOUTS, option: str = "--cbatch-max-timeouts") -> None:
        self.limit, self.option = limit, option
        self.streak = 0

    @property
    def tripped(self) -> bool:
        """Whether the next call runs at the short limit."""
        return self.limit > 0 and self.streak >= self.limit

    def note(self, timed_out: bool) -> None:
        """Record the outcome of one call: stopped at the time limit, or not (which ends the streak)."""
        self.streak = self.streak + 1 if timed_out else 0

    def seconds(self, full: float) -> float:
        """The time limit of the next call: ``full``, or ``short_seconds(full)`` while tripped."""
        return short_seconds(full) if self.tripped else full

    def why_short(self, full: float) -> str:
        """Why the next call runs at the short limit, for a stopped call's message ("" when it does not)."""
        if not self.tripped or short_seconds(full) >= full:
            return ""
        return (f" (the short limit of {short_seconds(full):g} s instead of {full:g} s: the {self.streak} calls "
                f"before it in a row did not finish within their limit; a call that finishes restores the full "
                f"limit; {self.option}={self.limit} sets how many, 0 never shortens it)")
