"""What one pytest-cbatch run resolved and tallied: the implementation, its settings, and every suite test's
outcome by clause and by part (read by the fixtures, the failure reports and the end-of-run summary)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

if TYPE_CHECKING:
    import pytest

SUITE_PACKAGE = "pytest_cbatch.suite"
OUTCOMES = ("passed", "failed", "skipped", "xfailed", "xpassed", "error")


@dataclass
class CbatchState:
    """What the plugin resolved for this run, shared by fixtures and hooks."""

    spec: str
    impl: Any
    artifacts: Path
    profile: str
    redirected: bool
    overrides: dict[str, Any] = field(default_factory=dict)             # native settings, then --cbatch-config
    native: dict[str, Any] = field(default_factory=dict)                # the engine's CBATCH_NATIVE_CONFIG in effect
    outcomes: dict[str, dict[str, int]] = field(default_factory=dict)   # clause -> outcome counts
    parts: dict[str, dict[str, int]] = field(default_factory=dict)      # suite part -> outcome counts
    unobservable: int = 0
    blocked: dict[str, int] = field(default_factory=dict)              # clause -> checks skipped: it failed there
    part_skips: dict[str, str] = field(default_factory=dict)            # suite part skipped whole -> why
    unjudged: dict[str, list[str]] = field(default_factory=dict)        # lifecycle clause -> parts that never reached it
    opt_in: tuple[str, ...] = ()                                        # opt-in clauses asked for (--cbatch-course)
    collected: str = ""                                                 # what the plugin collects, when it chose
    _judge: Any = None

    @property
    def clauses(self) -> tuple[str, ...]:
        """Every clause this run judges: those judged by default and the opt-in ones asked for."""
        from .runner import judged_clauses

        return judged_clauses(self.opt_in)

    def workload_config(self, config: Mapping[str, Any], explicit: Sequence[str] = ()) -> dict[str, Any]:
        """``config`` with the --cbatch-config overrides applied, except to the settings in ``explicit``
        (those a fixed workload sets itself, because it exists to test them)."""
        return {**config, **{k: v for k, v in self.overrides.items() if k not in explicit}}

    def count(self, part: str, clause: str | None, outcome: str, *, unobservable: bool = False,
              blocked: bool = False) -> None:
        """Tally one suite test's outcome (passed, failed, skipped or error) for the end-of-run summary;
        ``blocked``: a skip because the implementation failed completes or schema_valid on that workload."""
        self.parts.setdefault(part, dict.fromkeys(OUTCOMES, 0))[outcome] += 1
        if clause is not None:
            self.count_clause(clause, outcome)
            if blocked:
                self.blocked[clause] = self.blocked.get(clause, 0) + 1
        self.unobservable += unobservable

    def count_clause(self, clause: str, outcome: str) -> None:
        """Tally one verdict of ``clause`` (a test of it, or the examples of a generated-trace test)."""
        self.outcomes.setdefault(clause, dict.fromkeys(OUTCOMES, 0))[outcome] += 1

    def judged(self) -> list[str]:
        """The clauses (and lifecycle parts, numeric checks) that passed or failed on some test."""
        return sorted(c for c, n in self.outcomes.items() if judged_count(n))

    def judged_nothing(self) -> bool:
        """Whether suite tests ran and no clause of the implementation (contract, lifecycle part, numeric check
        on its reports, a clause of a generated-trace example) reached a verdict, whatever else passed."""
        return bool(self.parts) and not any(judged_count(n) for n in self.outcomes.values())

    @property
    def judge(self) -> Any:
        if self._judge is None:
            from .runner import Judge

            self._judge = Judge(self.impl)
        return self._judge


def suite_dir() -> Path:
    """The folder of the shipped conformance suite."""
    import pytest_cbatch.suite as suite

    return Path(suite.__file__).parent


def is_suite_item(item: pytest.Item) -> bool:
    """Whether ``item`` is a test of the shipped conformance suite."""
    fn = getattr(item, "function", None)
    return fn is not None and getattr(fn, "__module__", "").startswith(SUITE_PACKAGE)


def judged_count(counts: Mapping[str, int]) -> int:
    """How many of the tests counted in ``counts`` reached a verdict (not skipped, not an error)."""
    return counts["passed"] + counts["failed"] + counts["xfailed"] + counts["xpassed"]
