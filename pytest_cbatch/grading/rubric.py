"""The grading rubric: points and visibility per test, example counts, hidden traces, limits (TOML).

Format (every table optional; ``cbatch grade`` without ``--rubric`` uses the
shipped ``default_rubric.toml``)::

    [grading]
    seed = 20240901            # hypothesis seed of the generated traces: the same for every student
    generated_examples = 100   # generated traces per admission mode (reserve, optimistic)
    lifecycle_examples = 100   # state-machine runs per lifecycle part
    numerics = "auto"          # "auto" (when torch is importable) or "off"
    numerics_workloads = ["demo"]
    numerics_dtypes = ["float64"]
    parts = ["scheduler", "lifecycle", "numerics"]   # what the assignment has: the tests of the others are left out
    sandbox = "auto"           # "auto", "bwrap" (required: grading fails without it) or "process"
    course = false             # true: also grade contract.course_results, the course's exact results
    runtimes = []              # language runtimes outside /usr a program submission may use (absolute folders)
    kit_imports = "refuse"     # a submission that uses the kit's code (its reference) scores 0; "allow": graded
    optional = []              # settings a submission may decline: its workloads that need them do not count
                               # (e.g. ["admission=optimistic"]); any other decline scores as not passed

    [limits]                   # see pytest_cbatch.sandbox.Limits
    call_seconds = 10
    import_seconds = 60        # the start-up import

    [hidden]
    traces = "hidden"          # folder of JSONL traces, relative to the rubric (or --traces DIR)
    visibility = "hidden"      # "hidden": their names and contents never reach student-visible output
    reveal = "outcome"         # what a student learns of them: "outcome", one test hidden.workloads (one bit
                               # per submission); "clauses", each clause's test says whether they failed it

    [tests]                    # test name or glob -> points and visibility; the first match wins
    "contract.completes" = { points = 4 }
    "contract.*" = { points = 2, visibility = "visible" }
    "lifecycle.*" = { points = 1 }

A rubric without a ``[tests]`` table gives each test the shipped default's points
(``default_rubric.toml``: contract 2, lifecycle 1, numerics 1, all visible); one whose
rules give no test any points is refused (every score would be 0 / 0).

Test names are ``contract.<clause>`` (part ``scheduler``), ``lifecycle.<clause>``
(the lifecycle clause ids already start with ``lifecycle.``; part
``lifecycle``) and ``numerics.<check>.<dtype>`` (part ``numerics``).  Every
submission of a run is scored on the same tests; a test its layout cannot
answer (no ``TransferManager``, say) scores 0 and says which class and file
are missing and the points at stake.
Visibility is Gradescope's: ``visible``, ``after_due_date``, ``hidden``,
``after_published``.
"""

from __future__ import annotations

import fnmatch
import math
import os
import sys
from dataclasses import dataclass, field, fields
from importlib import resources
from pathlib import Path
from typing import Any, Mapping, Sequence

from ..sandbox import SANDBOX_MODES, Limits
from ..spelling import unknown_name
from ..support import parse_settings

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

__all__ = ["HIDDEN_REVEALS", "PARTS", "VISIBILITIES", "Rubric", "TestRule", "load_rubric"]

VISIBILITIES = ("visible", "after_due_date", "hidden", "after_published")
HIDDEN_REVEALS = ("outcome", "clauses")
PARTS = ("scheduler", "lifecycle", "numerics")
_GRADING_KEYS = {"seed": int, "generated_examples": int, "lifecycle_examples": int, "numerics": str,
                 "numerics_workloads": list, "numerics_dtypes": list, "parts": list, "sandbox": str, "course": bool,
                 "runtimes": list, "kit_imports": str, "optional": list}


_KIND_NAMES = {bool: "boolean (true or false)"}


@dataclass(frozen=True)
class TestRule:
    """Points and visibility for the tests whose names match ``pattern``."""

    pattern: str
    points: float
    visibility: str = "visible"


@dataclass(frozen=True)
class Rubric:
    """A parsed rubric; ``source`` names the file it came from."""

    source: str
    seed: int = 20240901
    generated_examples: int = 100
    lifecycle_examples: int = 100
    numerics: str = "auto"
    numerics_workloads: tuple[str, ...] = ("demo",)
    numerics_dtypes: tuple[str, ...] = ("float64",)
    parts: tuple[str, ...] = PARTS
    sandbox: str = "auto"
    course: bool = False
    runtimes: tuple[str, ...] = ()
    kit_imports: str = "refuse"  # "allow": a submission may use the kit's code (still flagged in summary.csv)
    optional: tuple[str, ...] = ()  # settings whose workloads a submission may decline (``support``)
    limits: Limits = field(default_factory=Limits)
    hidden_traces: Path | None = None
    hidden_visibility: str = "hidden"
    hidden_reveal: str = "outcome"
    rules: tuple[TestRule, ...] = ()

    def rule_for(self, test: str) -> TestRule:
        """The first rule matching ``test`` (an exact name or a glob); unmatched tests are worth 0 points."""
        for rule in self.rules:
            if rule.pattern == test or fnmatch.fnmatchcase(test, rule.pattern):
                return rule
        return TestRule(test, 0.0)


def load_rubric(path: str | Path | None = None) -> Rubric:
    """Parse the rubric at ``path`` (the shipped default when None); ValueError names the bad key."""
    if path is None:
        text = resources.files(__package__).joinpath("default_rubric.toml").read_text(encoding="utf-8")
        source, base = "default rubric", None
    else:
        text = Path(path).read_text(encoding="utf-8")
        source, base = str(path), Path(path).resolve().parent
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"{source}: not valid TOML: {exc}") from None
    _known(data, ("grading", "limits", "hidden", "tests"), f"{source}:", "table")
    grading = _grading(data.get("grading", {}), source)
    hidden = data.get("hidden", {})
    _known(hidden, ("traces", "visibility", "reveal"), f"{source}: [hidden]", "key")
    if hidden.get("reveal", "outcome") not in HIDDEN_REVEALS:
        raise ValueError(f"{source}: [hidden].reveal must be one of {', '.join(HIDDEN_REVEALS)}, "
                         f"got {hidden['reveal']!r}")
    limits = data.get("limits", {})
    _known(limits, [f.name for f in fields(Limits) if f.name != "names"], f"{source}: [limits]", "key")
    for key, value in limits.items():  # nan passes every comparison and inf never fires: neither is a limit
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"{source}: [limits].{key}: must be a positive, finite number, got {value!r}")
    traces = hidden.get("traces")
    if traces is not None and base is None:
        raise ValueError(f"{source}: [hidden].traces needs a rubric file to be relative to")
    return Rubric(
        source=source,
        limits=Limits.from_mapping(limits, f"{source}: [limits]"),
        hidden_traces=(base / traces) if traces is not None and base is not None else None,
        hidden_visibility=_visibility(hidden.get("visibility", "hidden"), f"{source}: [hidden].visibility"),
        hidden_reveal=hidden.get("reveal", "outcome"),
        rules=_rules(data["tests"] if "tests" in data else _default_tests(), source),
        **grading,
    )


def _default_tests() -> Mapping[str, Any]:
    """The ``[tests]`` table of the shipped default rubric."""
    text = resources.files(__package__).joinpath("default_rubric.toml").read_text(encoding="utf-8")
    return tomllib.loads(text)["tests"]


def _rules(tests: Any, source: str) -> tuple[TestRule, ...]:
    """The rules of a ``[tests]`` table; ValueError when no rule gives any points (every score 0 / 0)."""
    if not isinstance(tests, Mapping):
        raise ValueError(f"{source}: [tests] must be a table, got {tests!r}")
    rules = tuple(_rule(pattern, value, source) for pattern, value in tests.items())
    if not any(rule.points for rule in rules):
        raise ValueError(f"{source}: [tests] gives no test any points, so every score would be 0 / 0; give "
                         f"points (\"contract.*\" = {{ points = 2 }}) or leave the table out for the default's")
    return rules


def _known(values: Mapping[str, Any], known: Sequence[str], where: str, what: str) -> None:
    """ValueError naming the first key of ``values`` not in ``known``, and the nearest known one."""
    if not isinstance(values, Mapping):
        raise ValueError(f"{where} must be a table, got {values!r}")
    for key in values:
        if key not in known:
            raise ValueError(f"{where} {unknown_name(what, key, known)}")


def _grading(values: Mapping[str, Any], source: str) -> dict[str, Any]:
    _known(values, list(_GRADING_KEYS), f"{source}: [grading]", "key")
    out: dict[str, Any] = {}
    for key, value in values.items():
        kind = _GRADING_KEYS[key]
        if (isinstance(value, bool) and kind is not bool) or not isinstance(value, kind):
            kind_name = _KIND_NAMES.get(kind, kind.__name__)
            raise ValueError(f"{source}: [grading].{key} must be a {kind_name}, got {value!r}")
        out[key] = tuple(value) if kind is list else value
    if out.get("numerics", "auto") not in ("auto", "off"):
        raise ValueError(f"{source}: [grading].numerics must be \"auto\" or \"off\", got {out['numerics']!r}")
    parts = out.get("parts", PARTS)
    if not parts or set(parts) - set(PARTS):
        raise ValueError(f"{source}: [grading].parts must name one or more of {', '.join(PARTS)}, got {list(parts)}")
    if out.get("sandbox", "auto") not in SANDBOX_MODES:
        raise ValueError(f"{source}: [grading].sandbox must be one of {', '.join(SANDBOX_MODES)}, "
                         f"got {out['sandbox']!r}")
    for folder in out.get("runtimes", ()):
        if not isinstance(folder, str) or not os.path.isabs(folder) or not os.path.isdir(folder):
            raise ValueError(f"{source}: [grading].runtimes must list absolute paths of folders on this machine "
                             f"(a runtime's install folder, e.g. \"/opt/node-v22\"), got {folder!r}")
    if out.get("kit_imports", "refuse") not in ("refuse", "allow"):
        raise ValueError(f"{source}: [grading].kit_imports must be \"refuse\" or \"allow\", got {out['kit_imports']!r}")
    if "optional" in out:
        out["optional"] = parse_settings(out["optional"], f"{source}: [grading].optional")
    for key in ("generated_examples", "lifecycle_examples"):
        if out.get(key, 1) < 0:
            raise ValueError(f"{source}: [grading].{key} must be 0 or more, got {out[key]}")
    return out


def _rule(pattern: str, value: Any, source: str) -> TestRule:
    where = f"{source}: [tests].{pattern!r}"
    if not isinstance(value, dict) or set(value) - {"points", "visibility"} or "points" not in value:
        raise ValueError(f"{where} must be a table {{ points = N, visibility = \"...\" }}, got {value!r}")
    points = value["points"]
    if isinstance(points, bool) or not isinstance(points, (int, float)) or points < 0:
        raise ValueError(f"{where}: points must be a number >= 0, got {points!r}")
    return TestRule(pattern, float(points), _visibility(value.get("visibility", "visible"), f"{where}.visibility"))


def _visibility(value: Any, where: str) -> str:
    if value not in VISIBILITIES:
        raise ValueError(f"{where} must be one of {', '.join(VISIBILITIES)}, got {value!r}")
    return str(value)
