"""The engine adapter tests' shared helper: a report's violations sorted into documented findings.

An engine adapter's tests hold a classifier that names which documented finding (a line of the
engine's ``cbatch-expect*.toml``) explains a violation; ``unexplained`` runs the contract checker
and keeps what no finding explains.
"""

from __future__ import annotations

from typing import Any, Callable

from pytest_cbatch.contract import Violation, check_report

Finding = Callable[[Violation, dict[str, Any], list[dict[str, Any]]], "str | None"]


def unexplained(report: dict[str, Any], trace: list[dict[str, Any]], config: dict[str, Any], finding: Finding,
                seen: set[str]) -> list[str]:
    """The violations of ``report`` (for ``trace`` under ``config``) that ``finding`` explains by no
    name, as text; the names of those it explains are added to ``seen``."""
    out = []
    for v in check_report(report, trace, config):
        kind = finding(v, report, trace)
        if kind is None:
            out.append(str(v))
        else:
            seen.add(kind)
    return out
