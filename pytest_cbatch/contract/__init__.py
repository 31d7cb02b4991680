"""The event and snapshot contract: one named clause per property, as pure functions.

``check_report(report, trace, config)`` returns every violation of the report
clauses; it needs neither pytest nor the implementation.  Three clauses need
the implementation itself (running it twice, watching its input, feeding it
bad input); they are registered in ``core.RUNNER_CLAUSES`` with their
statements and checked by :mod:`pytest_cbatch.runner`.

Every clause holds for any correct scheduler, whatever its admission order,
rotation, chunking, preemption victims, page ids, or when it allocates a
dispatch's pages.  The clauses live by family: ``requests`` (each request's
record, also visible to a client), ``rows`` (dispatches), ``pages`` (the KV
pool).  A report that fails ``schema_valid`` is not checked further, so one
malformed field gives one failure, not fifty.
"""

from __future__ import annotations

import gc
import re
from contextlib import contextmanager
from typing import Any, Iterator, Mapping, Sequence

# Importing the families registers their clauses; this order is the clause table's order.
from . import requests  # noqa: F401  (isort: skip)
from . import rows  # noqa: F401  (isort: skip)
from . import pages  # noqa: F401  (isort: skip)
from .core import (
    CLAUSES, RUNNER_CLAUSES, Clause, ReportIndex, Violation, clause, required_blocks,
)

__all__ = [
    "CLAUSES", "RUNNER_CLAUSES", "Clause", "Violation", "ReportIndex",
    "check_report", "clause_ids", "required_blocks", "schema_kinds", "unobservable", "clause",
]

def clause_ids() -> list[str]:
    """Every clause id, report clauses first, in registration order."""
    return list(CLAUSES) + list(RUNNER_CLAUSES)


def unobservable(cid: str, report: Mapping[str, Any]) -> str | None:
    """Why clause ``cid`` cannot be judged on ``report`` (it lacks the events it needs), or None."""
    found = CLAUSES.get(cid)
    observed = report.get("observed")
    if found is None or not found.needs or observed is None:
        return None
    missing = sorted(found.needs - set(observed))
    if not missing:
        return None
    return (f"not observable from this report: {cid} needs {', '.join(missing)} events, and the report "
            f"(time_unit {report.get('time_unit')!r}) observes only {', '.join(observed) or 'nothing'}")


def _kind(path: str, message: str) -> tuple[str, str]:
    """What makes two schema issues the same kind: the path with indices and ids blurred, the message's shape."""
    blurred = re.sub(r"/[^/]+", lambda m: "/*" if m.group(0)[1:].isdigit() else m.group(0), path)
    return re.sub(r"^/requests/[^/]+", "/requests/*", blurred), re.sub(r"'[^']*'|\d+(\.\d+)?", "_", message)


def schema_kinds(violations: Sequence[Violation]) -> set[tuple[str, str]]:
    """The distinct kinds of schema_valid violations (see ``check_report``), for shrinking that keeps them all."""
    out = set()
    for v in violations:
        if v.clause == "schema_valid" and not v.message.startswith("... and "):
            path, _, message = v.message.partition(": ")
            out.add(_kind("" if path == "/" else path, message))
    return out


def check_report(
    report: Mapping[str, Any],
    trace: Sequence[Mapping[str, Any]],
    config: Mapping[str, Any],
    *,
    clauses: Sequence[str] | None = None,
    max_per_clause: int = 20,
) -> list[Violation]:
    """Check ``report`` (produced from ``trace`` under ``config``) against the contract.

    Returns the violations of every report clause (or of ``clauses`` only), at
    most ``max_per_clause`` each plus one line counting the rest.  ``trace``
    must be a valid trace (see ``scheduler_sim.validate_trace``).  A report
    that is not schema-valid yields only its ``schema_valid`` violations: the
    first issue of each distinct kind, then the rest up to ``max_per_clause``.
    Clauses the report cannot observe (see ``unobservable``) are not checked.
    """
    from ..schemas import schema_issues

    with _collector_paused():
        issues = schema_issues(report, "report", limit=max(200, max_per_clause))
        if issues:
            return _schema_violations(issues, max_per_clause)
        index = ReportIndex(report, trace, config)
        chosen = [c for cid, c in CLAUSES.items()
                  if c.check is not None and (clauses is None or cid in clauses) and index.observes(c.needs)]
        index.replaying = [c.id for c in chosen if c.at]   # one replay judges them all
        out: list[Violation] = []
        for c in chosen:
            cid = c.id
            found = 0
            for v in c.check(index):
                found += 1
                if found <= max_per_clause:
                    out.append(v)
            if found > max_per_clause:
                out.append(Violation(cid, f"... and {found - max_per_clause} more violations of this clause"))
        # Freed while the collector is paused: resumed with the index alive, its first pass would walk all of it.
        del index
        return out


@contextmanager
def _collector_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector for the block.

    The index allocates a tuple per event; each allocation burst would trigger
    full collections that walk the whole report (hundreds of thousands of
    dicts), about a third of check_report's time on a large report.  The
    checker makes no reference cycles, so nothing is left for the collector.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _schema_violations(issues: Sequence[Any], limit: int) -> list[Violation]:
    firsts: dict[tuple[str, str], Any] = {}
    for issue in issues:
        firsts.setdefault(_kind(issue.path, issue.message), issue)
    chosen = list(firsts.values())
    chosen += [issue for issue in issues if issue not in chosen][: max(0, limit - len(chosen))]
    out = [Violation("schema_valid", f"{issue.path or '/'}: {issue.message}") for issue in chosen]
    if len(issues) > len(chosen):
        out.append(Violation("schema_valid", f"... and {len(issues) - len(chosen)} more schema issues"
                                             f"{' (at least)' if len(issues) >= 200 else ''}"))
    return out
