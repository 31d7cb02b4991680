"""The regimes a schedule reaches: the kinds of steps and of page events in a report (no torch).

A numerics check can only catch an engine bug on a schedule that reaches the
regime the bug lives in.  :func:`regimes` names what a report's events reach,
so two sets of schedules (the pytest suite's and ``python -m gpu_checks``'s)
can be compared, and so a strategy can be shown to reach what it is meant to.

Step regimes name each dispatch's rows by kind: ``prefill-first`` (a
request's first prompt chunk in its incarnation), ``prefill-next`` (a later
chunk), ``decode``, ``recompute-first`` and ``recompute-next``:

* ``step: A + B``: a dispatch whose rows are of exactly those kinds;
* ``longest A beside B``: a dispatch whose longest row is of kind A (alone
  longest), with a row of kind B beside it.

Page regimes:

* ``cancel queued`` / ``cancel running`` / ``cancel preempted``: a cancel of a
  request that never ran, that holds rows, or that waits after a preemption;
* ``release at end`` / ``release delayed``: a release at its request's end
  time, or later;
* ``dispatch while draining``: a dispatch while an ended request's pages
  wait for their release;
* ``preempt``, ``preempt during recompute`` (fewer rows rebuilt than its last
  incarnation had computed), ``preempt after cut recompute`` (a request
  preempted again after a recompute of it was cut short).
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

__all__ = ["regimes", "union"]

_ENDS = ("finished", "cancelled", "rejected")


class _Walk:
    """Per-request state while the events are read in order."""

    def __init__(self) -> None:
        self.found: set[str] = set()
        self.fed: dict[str, int] = {}          # rows fed in the current incarnation
        self.target: dict[str, int] = {}       # most rows any earlier incarnation computed
        self.cut: set[str] = set()             # a recompute of it was cut short
        self.requeued: set[str] = set()        # waiting after a preemption
        self.ended: dict[str, Any] = {}        # end time of requests that ran, until their release

    def dispatch(self, work: list[Mapping[str, Any]]) -> None:
        if self.ended:
            self.found.add("dispatch while draining")
        kinds = []
        for row in work:
            rid, phase, n = row["id"], row["phase"], row["input_tokens"]
            self.requeued.discard(rid)   # running again (a report without admit events says so here)
            first = self.fed.get(rid, 0) == 0
            kinds.append(phase if phase == "decode" else f"{phase}-{'first' if first else 'next'}")
            self.fed[rid] = self.fed.get(rid, 0) + n
        self.found.add("step: " + " + ".join(sorted(set(kinds))))
        sizes = [row["input_tokens"] for row in work]
        top = max(sizes)
        if sizes.count(top) == 1:
            longest = kinds[sizes.index(top)]
            self.found.update(f"longest {longest} beside {k}" for i, k in enumerate(kinds) if sizes[i] != top)

    def preempted(self, rid: str) -> None:
        self.found.add("preempt")
        done, goal = self.fed.get(rid, 0), self.target.get(rid, 0)
        if rid in self.cut:
            self.found.add("preempt after cut recompute")
        if done < goal:
            self.found.add("preempt during recompute")
            self.cut.add(rid)
        self.target[rid] = max(goal, done)
        self.fed[rid] = 0
        self.requeued.add(rid)

    def ended_at(self, kind: str, rid: str, time: Any) -> None:
        if kind == "cancelled":
            state = "preempted" if rid in self.requeued else "running" if self.fed.get(rid) else "queued"
            self.found.add(f"cancel {state}")
        if self.fed.get(rid) or rid in self.requeued:
            self.ended[rid] = time

    def released(self, rid: str, time: Any) -> None:
        end = self.ended.pop(rid, None)
        if end is not None:
            self.found.add("release delayed" if time > end else "release at end")


def regimes(report: Mapping[str, Any]) -> frozenset[str]:
    """The step and page regimes ``report``'s events reach (see the module docstring)."""
    walk = _Walk()
    for event in report.get("events", []):
        kind, rid = event.get("event"), event.get("id")
        if kind == "dispatch" and event.get("work"):
            walk.dispatch(event["work"])
        elif kind == "admit":
            walk.requeued.discard(rid)
        elif kind == "preempted":
            walk.preempted(rid)
        elif kind in _ENDS:
            walk.ended_at(kind, rid, event.get("time"))
            walk.requeued.discard(rid)
        elif kind == "release":
            walk.released(rid, event.get("time"))
    return frozenset(walk.found)


def union(reports: Iterable[Mapping[str, Any]]) -> frozenset[str]:
    """Every regime any of ``reports`` reaches."""
    out: set[str] = set()
    for report in reports:
        out |= regimes(report)
    return frozenset(out)
