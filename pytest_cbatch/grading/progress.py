"""Progress of a class being graded, on stderr (stdout carries the results): a line at once, then one per submission.

The first line comes before any submission is graded (what is being graded,
where); each graded submission adds its line: a bar, done/total, its name and
score, then the rate so far (submissions per minute) and the estimated time
left (the time per submission so far times the submissions left).  While
nothing finishes for ``heartbeat`` seconds, a line says the run is still going.
The clock is a parameter, so the format is tested without waiting.
"""

from __future__ import annotations

import sys
import time
from typing import Callable, TextIO

from .results import SubmissionResult

__all__ = ["HEARTBEAT_SECONDS", "Progress", "duration"]

HEARTBEAT_SECONDS = 30.0
_BAR = 24


def duration(seconds: float) -> str:
    """``45 s``, ``3 min 20 s``, ``2 h 05 min``: a person's reading of a span of time."""
    whole = max(0, round(seconds))
    if whole < 60:
        return f"{whole} s"
    if whole < 3600:
        return f"{whole // 60} min {whole % 60:02d} s"
    return f"{whole // 3600} h {whole % 3600 // 60:02d} min"


class Progress:
    """Progress lines for ``total`` submissions; ``enabled=False`` prints nothing."""

    def __init__(self, total: int, where: str, stream: TextIO | None = None,
                 clock: Callable[[], float] = time.monotonic, enabled: bool = True) -> None:
        self.total, self.where, self.enabled = total, where, enabled
        self._stream, self._clock = stream, clock
        self._start = clock()
        self.done = 0

    def _print(self, line: str) -> None:
        if self.enabled:
            print(line, file=self._stream or sys.stderr, flush=True)

    def started(self) -> None:
        """The first line, before anything is graded."""
        self._print(f"grading {self.total} submission{'s' if self.total != 1 else ''} {self.where}")

    def finished(self, result: SubmissionResult) -> None:
        """One submission graded (each exactly once)."""
        self.done += 1
        filled = _BAR * self.done // max(self.total, 1)
        bar = "#" * filled + "." * (_BAR - filled)
        self._print(f"[{bar}] {self.done}/{self.total} {result.name}: {result.score:g}/{result.max_score:g} "
                    f"({result.execution_time:.1f} s) | {self._pace()}")

    def waiting(self) -> None:
        """Nothing finished lately: say the run is alive and how far it is."""
        self._print(f"... {self.done}/{self.total} done, still grading | {self._pace()}")

    def _pace(self) -> str:
        elapsed = self._clock() - self._start
        if not self.done or elapsed <= 0:
            return f"{duration(elapsed)} elapsed, time left known after the first submission"
        per_submission = elapsed / self.done
        left = (self.total - self.done) * per_submission
        return (f"{self.done / elapsed * 60:.1f}/min, {duration(elapsed)} elapsed, "
                + ("done" if self.done >= self.total else f"about {duration(left)} left"))
