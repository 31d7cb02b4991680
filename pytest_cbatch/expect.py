"""Expected-failure files: an engine's known deviations from the contract, kept in its repo.

``pytest --cbatch-impl=SPEC --cbatch-expect=cbatch-expect.toml`` (ini
``cbatch_expect``) reads a TOML file like::

    strict = true                       # optional; also --cbatch-expect-strict

    [[expect]]
    clause = "row_shape"                # glob over clause ids
    workload = "preempt_*"              # glob over workload names
    action = "xfail"                    # or "skip"
    reason = "long_prefill_token_threshold is lifted for a lone request"
    issue = "https://github.com/org/engine/issues/42"   # optional
    expires = 2027-03-01                # optional TOML date

An entry matches a test when every selector it gives matches: ``test`` is a
glob over the test's name (``test_contract[row_shape-demo]``; ``*`` and ``?``
are the only wildcards, brackets are literal), ``clause`` and ``workload``
globs over the clause and workload ids; a list of globs matches when one of
them does.  Those of ``test_contract`` are known
at collection; for any other test (the generated-trace tests) they are the
ones its failure names (``[clause] failed on workload 'generated-reserve'``),
so such an entry turns only that failure into an xfail.  The first matching
entry applies.  ``skip`` entries skip at collection (test ids, or clause and
workload of ``test_contract``).

Strict mode fails the run when an expected failure passes (XPASS), when an
entry matches no test and no failure, or when an entry has expired; without
it those are warnings, and an expired entry no longer applies.  Malformed
files are one usage error that names the file (and the line, for TOML
syntax).  ``cbatch expect --from-junit results.xml`` writes a file from a
run's failures.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import sys
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

import pytest

__all__ = ["Entry", "Expectations", "ExpectError", "load_expectations", "entries_from_junit", "render_toml",
           "add_options", "configure"]

ACTIONS = ("xfail", "skip")
SELECTORS = ("test", "clause", "workload")
ENTRY_KEYS = {*SELECTORS, "action", "reason", "issue", "expires"}
FAILURE_HEADER = re.compile(r"\[([\w.]+)\] failed on workload '([^']*)'")


class ExpectError(ValueError):
    """The expectations file is unreadable or malformed (the message names the file)."""


def _glob(pattern: str) -> re.Pattern[str]:
    parts = (".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
    return re.compile("".join(parts) + r"\Z")


@dataclass
class Entry:
    """One expectation: selectors, what to do, why, and until when."""

    number: int                      # 1-based position in the file, for messages
    action: str
    reason: str
    selectors: dict[str, str | list[str]]
    issue: str | None = None
    expires: dt.date | None = None
    _patterns: dict[str, list[re.Pattern[str]]] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self._patterns = {key: [_glob(v) for v in ([value] if isinstance(value, str) else value)]
                          for key, value in self.selectors.items()}

    def matches(self, test: str, clause: str | None, workload: str | None) -> bool:
        """Whether every selector of the entry matches (one of its globs, for a list; a selector
        needs a value to match)."""
        given = {"test": test, "clause": clause, "workload": workload}
        return all(given[k] is not None and any(p.match(given[k]) for p in globs)
                   for k, globs in self._patterns.items())

    def describe(self) -> str:
        where = ", ".join(f"{k} = {v!r}" for k, v in self.selectors.items())
        return f"entry #{self.number} ({where})"

    def expired(self, today: dt.date) -> bool:
        return self.expires is not None and self.expires < today


@dataclass
class Expectations:
    """A parsed expectations file."""

    path: str
    strict: bool
    entries: list[Entry]

    def first_match(self, test: str, clause: str | None, workload: str | None,
                    usable: Iterable[Entry] | None = None) -> Entry | None:
        for entry in self.entries if usable is None else usable:
            if entry.matches(test, clause, workload):
                return entry
        return None


def load_expectations(path: str | Path) -> Expectations:
    """Parse and validate an expectations file; ExpectError says what is wrong and where."""
    name = str(path)
    try:
        with open(path, "rb") as fh:
            data = tomllib.load(fh)
    except OSError as exc:
        raise ExpectError(f"{name}: cannot read the expectations file: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ExpectError(f"{name}: invalid TOML: {exc}") from None
    except UnicodeDecodeError as exc:
        raise ExpectError(f"{name}: not UTF-8 text (byte {exc.start + 1})") from None
    except RecursionError:
        raise ExpectError(f"{name}: invalid TOML: nested too deeply") from None
    unknown = sorted(set(data) - {"strict", "expect"})
    if unknown:
        raise ExpectError(f"{name}: unknown top-level key {unknown[0]!r} (known: strict, expect)")
    strict = data.get("strict", False)
    if not isinstance(strict, bool):
        raise ExpectError(f"{name}: strict must be true or false, got {strict!r}")
    raw = data.get("expect", [])
    if not isinstance(raw, list) or not all(isinstance(e, dict) for e in raw):
        raise ExpectError(f"{name}: expect must be an array of tables ([[expect]] sections)")
    return Expectations(name, strict, [_entry(name, i, e) for i, e in enumerate(raw, start=1)])


def _entry(name: str, number: int, raw: dict[str, Any]) -> Entry:
    where = f"{name}: [[expect]] entry #{number}"
    unknown = sorted(set(raw) - ENTRY_KEYS)
    if unknown:
        raise ExpectError(f"{where}: unknown key {unknown[0]!r} (known: {', '.join(sorted(ENTRY_KEYS))})")
    selectors = {k: raw[k] for k in SELECTORS if k in raw}
    if not selectors:
        raise ExpectError(f"{where}: needs at least one of test, clause, workload")
    for key, value in selectors.items():
        values = value if isinstance(value, list) else [value]
        if not values or not all(isinstance(v, str) and v for v in values):
            raise ExpectError(f"{where}: {key} must be a non-empty string or list of them, got {value!r}")
    action = raw.get("action")
    if action not in ACTIONS:
        raise ExpectError(f"{where}: action must be one of {', '.join(ACTIONS)}, got {action!r}")
    reason = raw.get("reason")
    if not isinstance(reason, str) or not reason.strip():
        raise ExpectError(f"{where}: reason must be a non-empty string (say why this is expected)")
    issue = raw.get("issue")
    if issue is not None and not isinstance(issue, str):
        raise ExpectError(f"{where}: issue must be a string, got {issue!r}")
    expires = raw.get("expires")
    if isinstance(expires, str):
        try:
            expires = dt.date.fromisoformat(expires)
        except ValueError:
            raise ExpectError(f"{where}: expires must be a date like 2027-03-01, got {expires!r}") from None
    elif isinstance(expires, dt.datetime) or (expires is not None and not isinstance(expires, dt.date)):
        raise ExpectError(f"{where}: expires must be a date like 2027-03-01, got {expires!r}")
    return Entry(number, action, reason.strip(), selectors, issue, expires)


# -- writing a file from a JUnit run ----------------------------------------------

def entries_from_junit(path: str | Path) -> list[dict[str, str]]:
    """One xfail entry per failed, errored or xfailed test case of a JUnit XML file.

    Suite tests with ``cbatch_clause``/``cbatch_workload`` properties get
    clause and workload selectors; other tests get the clause and workload
    their failure message names, or else their test name.
    """
    try:
        root = ET.parse(path).getroot()
    except OSError as exc:
        raise ExpectError(f"{path}: cannot read the JUnit file: {exc.strerror or exc}") from None
    except ET.ParseError as exc:
        raise ExpectError(f"{path}: not JUnit XML: {exc}") from None
    out: list[dict[str, str]] = []
    seen: set[tuple[tuple[str, str], ...]] = set()
    for case in root.iter("testcase"):
        problem = next((case.find(tag) for tag in ("failure", "error") if case.find(tag) is not None), None)
        skipped = case.find("skipped")
        if problem is None and not (skipped is not None and skipped.get("type") == "pytest.xfail"):
            continue
        node = problem if problem is not None else skipped
        message = (node.get("message") or node.text or "").strip()
        props = {p.get("name"): p.get("value") for p in case.iter("property")}
        selectors = _selectors(case.get("name", ""), props, message)
        key = tuple(sorted(selectors.items()))
        if key in seen:
            continue
        seen.add(key)
        out.append({**selectors, "action": "xfail", "reason": _first_line(message) or "failed in the recorded run"})
    return out


def _selectors(name: str, props: dict[str | None, str | None], message: str) -> dict[str, str]:
    clause, workload = props.get("cbatch_clause"), props.get("cbatch_workload")
    if clause and workload:
        return {"clause": clause, "workload": workload}
    found = FAILURE_HEADER.search(message)
    if found:
        return {"test": name.split("[")[0], "clause": found.group(1), "workload": found.group(2)}
    return {"test": name}


def _first_line(message: str) -> str:
    """The first violation line of a kit failure (``- [clause] (request ...) ...``), else the first line."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    line = next((x[2:] for x in lines if x.startswith("- [")), lines[0] if lines else "")
    for prefix in ("Failed: ", "XFAIL ", "reason: "):
        line = line[len(prefix):] if line.startswith(prefix) else line
    return line if len(line) <= 200 else line[:197] + "..."


def render_toml(entries: list[dict[str, str]], *, source: str, strict: bool) -> str:
    """The expectations file for ``entries``, with a header saying where they came from."""
    lines = [f"# pytest-cbatch expectations, written by `cbatch expect --from-junit {source}`.",
             "# Review every reason; add issue = \"...\" and expires = YYYY-MM-DD where they help.",
             f"strict = {'true' if strict else 'false'}"]
    for entry in entries:
        lines.append("")
        lines.append("[[expect]]")
        for key in (*SELECTORS, "action", "reason"):
            if key in entry:
                lines.append(f"{key} = {json.dumps(entry[key], ensure_ascii=False)}")
    return "\n".join(lines) + "\n"


# -- the pytest side --------------------------------------------------------------

_KEY = pytest.StashKey["_ExpectPlugin"]()


def add_options(group: Any, parser: pytest.Parser) -> None:
    """Register --cbatch-expect, --cbatch-expect-strict and the ini key (called by the plugin)."""
    group.addoption("--cbatch-expect", metavar="FILE", default=None,
                    help="TOML file of expected failures (xfail/skip by test, clause or workload id) "
                         "(ini: cbatch_expect)")
    group.addoption("--cbatch-expect-strict", action="store_true", default=False,
                    help="fail the run when an expected failure passes, an entry matches nothing, or an entry "
                         "has expired")
    parser.addini("cbatch_expect", "TOML file of expected failures (see --cbatch-expect)", default=None)


def configure(config: pytest.Config) -> None:
    """Load the file named by --cbatch-expect/cbatch_expect, if any, and register its hooks."""
    path = config.getoption("cbatch_expect") or config.getini("cbatch_expect")
    if not path:
        if config.getoption("cbatch_expect_strict"):
            raise pytest.UsageError("--cbatch-expect-strict needs an expectations file (--cbatch-expect=FILE)")
        return
    full = Path(config.invocation_params.dir, path) if not Path(path).is_absolute() else Path(path)
    try:
        expectations = load_expectations(full)
    except ExpectError as exc:
        raise pytest.UsageError(str(exc).replace(str(full), str(path), 1)) from None
    expectations.path = str(path)
    plugin = _ExpectPlugin(expectations, strict=expectations.strict or config.getoption("cbatch_expect_strict"))
    config.stash[_KEY] = plugin
    config.pluginmanager.register(plugin, "cbatch-expect")


def _ids(item: pytest.Item) -> tuple[str | None, str | None]:
    params = getattr(getattr(item, "callspec", None), "params", {})
    clause, workload = params.get("clause"), params.get("workload")
    return (clause if isinstance(clause, str) else None, workload if isinstance(workload, str) else None)


class _ExpectPlugin:
    """Applies an Expectations file to one run and reports what it did."""

    def __init__(self, expectations: Expectations, *, strict: bool, today: dt.date | None = None) -> None:
        self.exp = expectations
        self.strict = strict
        today = today or dt.date.today()
        self.expired = [e for e in expectations.entries if e.expired(today)]
        self.usable = [e for e in expectations.entries if not e.expired(today)]
        self.used: set[int] = set()
        self.xpassed: list[str] = []
        self.assigned: dict[str, Entry] = {}  # nodeid -> the xfail entry known at collection

    @pytest.hookimpl(tryfirst=True)
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        # tryfirst: before -k/-m deselection, so an entry for a deselected test is not stale
        for item in items:
            clause, workload = _ids(item)
            entry = self.exp.first_match(item.name, clause, workload, self.usable)
            if entry is None:
                continue
            self.used.add(entry.number)
            if entry.action == "skip":
                item.add_marker(pytest.mark.skip(reason=f"{self._label(entry)}: {entry.reason}"))
            else:
                self.assigned[item.nodeid] = entry

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
        outcome = yield
        rep = outcome.get_result()
        if rep.when != "call" or hasattr(rep, "wasxfail"):
            return
        entry = self.assigned.get(item.nodeid)
        if rep.failed and entry is None:
            found = FAILURE_HEADER.search(rep.longreprtext)
            if found:
                entry = self.exp.first_match(item.name.split("[")[0], found.group(1), found.group(2), self.usable)
                entry = entry if entry is not None and entry.action == "xfail" else None
        if entry is None:
            return
        self.used.add(entry.number)
        label = f"{self._label(entry)}: {entry.reason}"
        if rep.failed:
            rep.outcome = "skipped"
            rep.wasxfail = label
        elif rep.passed:
            self.xpassed.append(item.nodeid)
            if self.strict:
                rep.outcome = "failed"
                rep.longrepr = (f"[XPASS(strict)] {item.name} passed, but {label} expects it to fail: the "
                                f"deviation is fixed, so remove the entry (or drop strict)")
            else:
                rep.wasxfail = label

    def _label(self, entry: Entry) -> str:
        issue = f", {entry.issue}" if entry.issue else ""
        return f"expected by {self.exp.path} {entry.describe()}{issue}"

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any, error: Any) -> None:
        """xdist controller: collect which entries the worker used."""
        self.used.update(getattr(node, "workeroutput", {}).get("cbatch_expect_used", ()))

    def problems(self) -> list[str]:
        """Stale and expired entries, and expected failures that passed, as messages."""
        out = [f"{self.exp.path} {e.describe()} expired on {e.expires}: re-check the deviation, then extend "
               f"or remove it" for e in self.expired]
        out += [f"{self.exp.path} {e.describe()} matches no test and no failure in this run: remove it"
                for e in self.usable if e.number not in self.used]
        out += [f"expected failure passed (XPASS): {nodeid}" for nodeid in self.xpassed]
        return out

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        workeroutput = getattr(session.config, "workeroutput", None)
        if workeroutput is not None:  # an xdist worker: the controller judges
            workeroutput["cbatch_expect_used"] = sorted(self.used)
            return
        if self.strict and self.problems() and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if getattr(terminalreporter.config, "workeroutput", None) is not None:
            return
        tr = terminalreporter
        tr.section("pytest-cbatch expectations")
        mode = "strict" if self.strict else "not strict"
        tr.write_line(f"{self.exp.path}: {len(self.exp.entries)} entries ({mode}), "
                      f"{len(self.used)} applied in this run")
        for message in self.problems():
            tr.write_line(("FAIL: " if self.strict else "warning: ") + message, red=self.strict, yellow=not self.strict)
