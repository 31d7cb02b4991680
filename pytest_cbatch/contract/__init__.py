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
from typing import Any, Collection, Iterator, Mapping, Sequence

# Importing the families registers their clauses; this order is the clause table's order.
from . import requests  # noqa: F401  (isort: skip)
from . import rows  # noqa: F401  (isort: skip)
from . import pages  # noqa: F401  (isort: skip)
from . import course  # noqa: F401  (isort: skip)
from .core import (
    CLAUSES, RUNNER_CLAUSES, Clause, ReportIndex, Violation, clause, required_blocks,
)

__all__ = [
    "CLAIMS", "CLAUSES", "RUNNER_CLAUSES", "Clause", "Violation", "ReportIndex",
    "asked_settings", "check_report", "claim_violations", "clause_ids", "opt_in_ids", "out_of_scope", "required_blocks",
    "schema_kinds", "unobservable", "clause",
]

CLAIMS: frozenset[str] = frozenset({"observed", "time_unit", "server.ignore_eos"})
"""The report fields that narrow what is judged: ``observed`` (the event kinds the report can see; clauses
that need others are skipped), ``time_unit`` ``seconds`` (times with slack, determinism not judged) and
``server.ignore_eos`` false (the server refused to force lengths: a row finished with ``stop`` may be short).
Only an implementation kind that declares them has them honoured (``Implementation.claims``: a live
``http:`` server, an engine adapter registered as a ``pytest_cbatch.impls`` entry point); from any other
kind they are ``schema_valid`` violations and every clause is judged as if they were absent."""

CLAIMANTS = "a live http: server or an engine adapter registered as a pytest_cbatch.impls entry point"


def clause_ids(opt_in: Collection[str] = ()) -> list[str]:
    """The id of every clause judged by default and of the opt-in ones in ``opt_in``, report clauses first,
    in registration order."""
    return [cid for cid, c in CLAUSES.items() if not c.opt_in or cid in opt_in] + list(RUNNER_CLAUSES)


def opt_in_ids() -> list[str]:
    """The clauses judged only when asked for (``Clause.opt_in`` says how)."""
    return [cid for cid, c in CLAUSES.items() if c.opt_in]


def out_of_scope(cid: str, config: Mapping[str, Any]) -> str | None:
    """Why clause ``cid`` does not judge a run asked for with ``config`` (``Clause.scope``), or None."""
    found = CLAUSES.get(cid)
    return found.scope(config) if found is not None and found.scope is not None else None


def unobservable(cid: str, report: Mapping[str, Any], honoured: Collection[str] = ()) -> str | None:
    """Why clause ``cid`` cannot be judged on ``report`` (it lacks the events it needs), or None.

    Only a report whose ``observed`` claim is ``honoured`` (see ``CLAIMS``) can hide a clause."""
    found = CLAUSES.get(cid)
    observed = report.get("observed") if "observed" in honoured and isinstance(report, dict) else None
    if found is None or not found.needs or not isinstance(observed, list) or not all(type(k) is str for k in observed):
        return None  # none claimed or honoured, or a claim schema_valid refuses
    missing = sorted(found.needs - set(observed))
    if not missing:
        return None
    return (f"not observable from this report: {cid} needs {', '.join(missing)} events, and the report "
            f"(time_unit {report.get('time_unit')!r}) observes only {', '.join(observed) or 'nothing'}")


def claim_violations(report: Any, honoured: Collection[str] = (), claimant: str = "") -> list[Violation]:
    """The ``schema_valid`` violations of ``report``'s claims (see ``CLAIMS``) that are not ``honoured``.

    ``claimant`` names the implementation in the message (e.g. ``file hostile.py``)."""
    if not isinstance(report, Mapping):
        return []
    source = f"it is not honoured from {claimant}" if claimant else "this implementation's kind declares no claims"
    out = []
    if "observed" not in honoured and "observed" in report:
        out.append(Violation("schema_valid", f"/observed: `observed` narrows what is judged, so it may only be "
                                             f"declared by {CLAIMANTS}; {source}, and every clause is judged as "
                                             f"if it were absent"))
    unit = report.get("time_unit")
    if "time_unit" not in honoured and type(unit) is str and unit == "seconds":
        out.append(Violation("schema_valid", f"/time_unit: 'seconds' relaxes what is judged, so only {CLAIMANTS} "
                                             f"may declare it; {source}: expected 'synthetic_tick', and times are "
                                             f"judged as ticks"))
    server = report.get("server")
    if "server.ignore_eos" not in honoured and isinstance(server, Mapping) and server.get("ignore_eos") is False:
        out.append(Violation("schema_valid", f"/server/ignore_eos: false excuses requests that finish short, so only "
                                             f"{CLAIMANTS} may declare it; {source}, and every finished request must "
                                             f"emit its requested tokens"))
    return out


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
    opt_in: Collection[str] = (),
    max_per_clause: int = 20,
    honoured: Collection[str] = (),
    claimant: str = "",
) -> list[Violation]:
    """Check ``report`` (produced from ``trace`` under ``config``) against the contract.

    Returns the violations of every report clause judged by default and of the
    opt-in ones named in ``opt_in`` (or of ``clauses`` only), at
    most ``max_per_clause`` each plus one line counting the rest.  ``trace``
    must be a valid trace (see ``scheduler_sim.validate_trace``).  A report
    that is not schema-valid yields only its ``schema_valid`` violations: the
    first issue of each distinct kind, then the rest up to ``max_per_clause``.
    Clauses the report cannot observe (see ``unobservable``) and clauses whose
    scope leaves this config out (see ``out_of_scope``) are not checked.

    ``config`` holds the settings the run asked for; those it leaves out are the reference's defaults
    (``DEFAULT_CONFIG``), and every clause judges these, never the report's own config (which
    ``config_recorded`` compares with them).  ``config`` and ``trace`` are checked as ``cbatch check``
    checks its input (``validate_config``, ``validate_trace``): a ValueError names the first bad setting
    or trace line and its value.

    ``honoured`` names the claims (see ``CLAIMS``) the implementation's kind may make; the default,
    none, is the strict case: a claim is then a ``schema_valid`` violation (``claim_violations``,
    naming ``claimant``) and every clause is still judged, as if the report did not make it.
    """
    from ..reference.scheduler_sim import validate_trace
    from ..schemas import schema_issues

    config, trace = asked_settings(config), validate_trace(_plain("trace", trace))
    claims = claim_violations(report, honoured, claimant)
    strict = report
    if any(v.message.startswith("/time_unit") for v in claims):  # validated as the tick report it must then be
        strict = {**report, "time_unit": "synthetic_tick"}
    with _collector_paused():
        issues = schema_issues(strict, "report", limit=max(200, max_per_clause))
        if issues:
            return claims + _schema_violations(issues, max_per_clause)
        index = ReportIndex(report, trace, config, honoured)
        wanted = clause_ids(opt_in) if clauses is None else clauses
        chosen = [c for cid, c in CLAUSES.items()
                  if c.check is not None and cid in wanted and index.observes(c.needs)
                  and out_of_scope(cid, config) is None]
        index.replaying = [c.id for c in chosen if c.at]   # one replay judges them all
        out: list[Violation] = [] if clauses is not None and "schema_valid" not in clauses else claims
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


def asked_settings(config: Any) -> dict[str, Any]:
    """``config``, the settings a run was asked for, over the reference's defaults for those it leaves out.

    Raises ValueError naming the setting and its value when ``config`` is not one ``cbatch check`` and the
    workloads accept (``validate_config``: an unknown key, a value of the wrong type or range)."""
    from ..reference.scheduler_sim import DEFAULT_CONFIG, validate_config

    config = _plain("config", config)
    if not isinstance(config, dict):
        raise ValueError(f"config: expected a mapping of settings, got {type(config).__name__}")
    return {**DEFAULT_CONFIG, **validate_config(config)}


def _plain(what: str, value: Any) -> Any:
    """A plain copy of ``value`` (see ``plain``): ValueError naming ``what`` and the place where it is not."""
    from ..plain import NotPlain, plain

    try:
        return plain(value)
    except NotPlain as exc:
        raise ValueError(f"{what}{exc.path}: {exc.problem}") from None


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
