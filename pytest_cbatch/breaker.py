"""The breaker: an implementation whose calls keep hitting the time limit stops being called.

A scheduler that loops on every call would cost the whole time limit on every workload (some
fifty minutes for the suite at the default 60 s).  ``Breaker(limit)`` watches one
implementation's calls: after ``limit`` calls in a row were stopped at the time limit, it trips,
and every later call fails at once with ``Breaker.tripped``, which says why and which option
changes it.  A call that returns (a report, a refusal, anything but a stop for time) ends the
streak.  ``limit == 0`` never trips.  Grading has the same rule for a sandboxed submission.
"""

from __future__ import annotations

__all__ = ["DEFAULT_MAX_TIMEOUTS", "Breaker"]

DEFAULT_MAX_TIMEOUTS = 3
"""Calls in a row stopped at the time limit before the rest of a run's calls fail at once."""


class Breaker:
    """Counts one implementation's calls stopped at the time limit in a row; see the module."""

    def __init__(self, limit: int = DEFAULT_MAX_TIMEOUTS, option: str = "--cbatch-max-timeouts") -> None:
        self.limit, self.option = limit, option
        self.streak = 0
        self.tripped: str | None = None  # why the rest of the calls fail at once (a predicate: "was not run ...")

    def note(self, timed_out: bool) -> None:
        """Record the outcome of one call: stopped at the time limit, or not."""
        if self.tripped is not None:
            return
        self.streak = self.streak + 1 if timed_out else 0
        if self.limit > 0 and self.streak >= self.limit:
            self.tripped = (f"was not run: {self.streak} calls in a row did not finish within the time limit, so "
                            f"the rest fail at once ({self.option}={self.limit} sets how many; 0 never stops "
                            f"calling)")
