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
them does.  Every ``clause`` glob must match a clause of the contract (a
misspelt one is a usage error at once).  Those of ``test_contract`` are known
at collection; a generated-trace test judges one clause on one generated
workload (``test_generated_traces[row_shape]``: clause ``row_shape``, workload
``generated-reserve``; ``test`` also matches its bare name,
``test_generated_traces``), and an xfail entry that matches it covers that
clause's violations there: they are set aside before Hypothesis sees them, the
test never shrinks them, and it is an expected failure when some example
deviated.  For any other test the clause and workload are the ones its failure
names (``[clause] failed on workload 'cbatch_run'``).  The first matching entry
applies.  ``skip`` entries skip at collection.

Strictness is decided per entry, over the whole run (every test, every xdist
worker): strict mode fails the run when an entry matched no failure (every test
it expects to fail passed, or it matches no test at all) or has expired; an
expected failure that passes (XPASS) while its entry still matches failures
elsewhere is reported, not failed.  Without strict mode those are warnings,
and an expired entry no longer applies.  Malformed files are one usage error
that names the file (and the line).  ``cbatch expect --from-junit results.xml``
writes a file from a run's failures.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import sys
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, NoReturn, Sequence

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

import pytest

from .spelling import unknown_name

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

    def matches(self, test: str | Sequence[str], clause: str | None, workload: str | None) -> bool:
        """Whether every selector of the entry matches (one of its globs, for a list; a selector
        needs a value to match).  ``test`` may be several names of one test: one of them must match."""
        given = {"test": [test] if isinstance(test, str) else list(test),
                 "clause": [clause] if clause is not None else [],
                 "workload": [workload] if workload is not None else []}
        return all(any(p.match(value) for p in globs for value in given[k]) for k, globs in self._patterns.items())

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

    def first_match(self, test: str | Sequence[str], clause: str | None, workload: str | None,
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
            text = fh.read().decode("utf-8")
        data = tomllib.loads(text)
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
    lines = _entry_lines(text)
    return Expectations(name, strict, [_entry(name, i, e, lines.get(i, {})) for i, e in enumerate(raw, start=1)])


_HEADER = re.compile(r"\s*\[\[\s*expect\s*\]\]")
_KEY_LINE = re.compile(r"\s*([A-Za-z_]+)\s*=")


def _entry_lines(text: str) -> dict[int, dict[str, int]]:
    """Where each ``[[expect]]`` entry starts, and its keys, by 1-based entry number: ``{"": header line,
    key: line}`` (entries written as inline tables have none)."""
    out: dict[int, dict[str, int]] = {}
    for lineno, line in enumerate(text.splitlines(), start=1):
        if _HEADER.match(line):
            out[len(out) + 1] = {"": lineno}
        elif out and (key := _KEY_LINE.match(line)):
            out[len(out)].setdefault(key.group(1), lineno)
    return out


def _known_clauses() -> list[str]:
    from .runner import ALL_CLAUSES, OPT_IN_CLAUSES

    return [*ALL_CLAUSES, *OPT_IN_CLAUSES]


def _entry(name: str, number: int, raw: dict[str, Any], lines: dict[str, int]) -> Entry:
    def where(key: str = "") -> str:
        line = lines.get(key) or lines.get("")
        return f"{name}: [[expect]] entry #{number}" + (f" (line {line})" if line else "")

    unknown = sorted(set(raw) - ENTRY_KEYS)
    if unknown:
        raise ExpectError(f"{where(unknown[0])}: unknown key {unknown[0]!r} (known: {', '.join(sorted(ENTRY_KEYS))})")
    selectors = {k: raw[k] for k in SELECTORS if k in raw}
    if not selectors:
        raise ExpectError(f"{where()}: needs at least one of test, clause, workload")
    for key, value in selectors.items():
        values = value if isinstance(value, list) else [value]
        if not values or not all(isinstance(v, str) and v for v in values):
            raise ExpectError(f"{where(key)}: {key} must be a non-empty string or list of them, got {value!r}")
        if key == "clause":
            known = _known_clauses()
            for glob in values:
                if not any(_glob(glob).match(cid) for cid in known):
                    raise ExpectError(f"{where(key)}: {unknown_name('clause', glob, known)}")
    action = raw.get("action")
    if action not in ACTIONS:
        raise ExpectError(f"{where('action')}: action must be one of {', '.join(ACTIONS)}, got {action!r}")
    reason = raw.get("reason")
    if not isinstance(reason, str) or not reason.strip():
        raise ExpectError(f"{where('reason')}: reason must be a non-empty string (say why this is expected)")
    issue = raw.get("issue")
    if issue is not None and not isinstance(issue, str):
        raise ExpectError(f"{where('issue')}: issue must be a string, got {issue!r}")
    expires = raw.get("expires")
    if isinstance(expires, str):
        try:
            expires = dt.date.fromisoformat(expires)
        except ValueError:
            raise ExpectError(f"{where('expires')}: expires must be a date like 2027-03-01, got {expires!r}") from None
    elif isinstance(expires, dt.datetime) or (expires is not None and not isinstance(expires, dt.date)):
        raise ExpectError(f"{where('expires')}: expires must be a date like 2027-03-01, got {expires!r}")
    return Entry(number, action, reason.strip(), selectors, issue, expires)


# -- writing a file from a JUnit run ----------------------------------------------

def entries_from_junit(path: str | Path) -> list[dict[str, str]]:
    """One xfail entry per failed, errored or xfailed test case of a JUnit XML file, sorted by their
    selectors (the same file for the same failures, whatever order xdist workers finished in).

    Suite tests with ``cbatch_clause``/``cbatch_workload`` properties get
    clause and workload selectors; other tests get the clause and workload
    their failure message names, or else their test name.  Each reason is the
    failure's first violation.
    """
    try:
        root = ET.parse(path).getroot()
    except OSError as exc:
        raise ExpectError(f"{path}: cannot read the JUnit file: {exc.strerror or exc}") from None
    except ET.ParseError as exc:
        raise ExpectError(f"{path}: not JUnit XML: {exc}") from None
    found: dict[tuple[tuple[str, str], ...], dict[str, str]] = {}
    cases = sorted(root.iter("testcase"), key=lambda c: (c.get("classname", ""), c.get("name", "")))
    for case in cases:
        problem = next((case.find(tag) for tag in ("failure", "error") if case.find(tag) is not None), None)
        skipped = case.find("skipped")
        if problem is None and not (skipped is not None and skipped.get("type") == "pytest.xfail"):
            continue
        node = problem if problem is not None else skipped
        texts = [(node.get("message") or "").strip(), (node.text or "").strip()]
        props = {p.get("name"): p.get("value") for p in case.iter("property")}
        selectors = _selectors(case.get("name", ""), props, "\n".join(texts))
        key = tuple(sorted(selectors.items()))
        if key not in found:
            found[key] = {**selectors, "action": "xfail",
                          "reason": _reason(texts) or "failed in the recorded run"}
    return [found[key] for key in sorted(found)]


def _selectors(name: str, props: dict[str | None, str | None], message: str) -> dict[str, str]:
    clause, workload = props.get("cbatch_clause"), props.get("cbatch_workload")
    if clause and workload:
        return {"clause": clause, "workload": workload}
    found = FAILURE_HEADER.search(message)
    if found:
        return {"test": name.split("[")[0], "clause": found.group(1), "workload": found.group(2)}
    return {"test": name}


def _reason(texts: Sequence[str]) -> str:
    """The first violation line of a kit failure (``- [clause] (request ...) ...``) in the failure's message
    or, where the message lacks one, its text (pytest's ``E`` margin aside); else the message's first line."""
    lines = [[_unprefixed(line) for line in text.splitlines() if _unprefixed(line)] for text in texts]
    line = next((x[2:] for group in lines for x in group if x.startswith("- [")),
                next((group[0] for group in lines if group), ""))
    return line if len(line) <= 200 else line[:197] + "..."


def _unprefixed(line: str) -> str:
    line = line.strip()
    line = line[1:].strip() if line.startswith("E ") else line
    for prefix in ("Failed: ", "XFAIL ", "reason: "):
        line = line[len(prefix):] if line.startswith(prefix) else line
    return line


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
                    help="fail the run when an entry matched no failure in the whole run (its expected failures "
                         "all passed, or it matches no test) or has expired")
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
    inside = os.path.relpath(full, config.rootpath)
    plugin.where = str(full) if inside.startswith("..") else inside  # as pytest writes node ids: from the rootdir
    config.stash[_KEY] = plugin
    config.pluginmanager.register(plugin, "cbatch-expect")


def _ids(item: pytest.Item) -> tuple[tuple[str, ...], str | None, str | None]:
    """The names, clause and workload an entry is matched against at collection: ``test_contract``'s
    parameters; a generated-trace test's clause parameter and its ``cbatch_generated`` workload."""
    params = getattr(getattr(item, "callspec", None), "params", {})
    clause, workload = params.get("clause"), params.get("workload")
    generated = item.get_closest_marker("cbatch_generated")
    if generated is not None:
        return (item.name, getattr(item, "originalname", item.name)), clause, generated.args[0]
    return (item.name,), (clause if isinstance(clause, str) else None), \
        (workload if isinstance(workload, str) else None)


_COVERED, _XPASSED = "cbatch_expect_covered", "cbatch_expect_xpassed"  # report properties: entry numbers


def covering_entry(item: pytest.Item) -> Entry | None:
    """The xfail entry that covers the violations of generated-trace test ``item`` (its clause on its
    workload), or None: then every violation it finds fails it."""
    plugin = item.config.stash.get(_KEY, None)
    return None if plugin is None else plugin.assigned.get(item.nodeid)


def xfail_covered(item: pytest.Item, entry: Entry, covered: int, judged: int) -> NoReturn:
    """End generated-trace test ``item`` as an expected failure: ``covered`` of the ``judged`` examples
    violated its clause, and ``entry`` covers each of those violations."""
    plugin: _ExpectPlugin = item.config.stash[_KEY]
    item.user_properties.append((_COVERED, str(entry.number)))
    pytest.xfail(f"{plugin.label(entry)}: {entry.reason} ({covered} of {judged} generated examples deviated so, "
                 f"set aside)")


class _ExpectPlugin:
    """Applies an Expectations file to one run and judges each entry over the whole run.

    Each test's report carries the entries that turned its failure into an expected failure
    (``cbatch_expect_covered``) or expected a failure that did not come (``cbatch_expect_xpassed``);
    the process that sees every report (the xdist controller, or the only process) tallies them, and
    decides at the end which entries are stale.
    """

    def __init__(self, expectations: Expectations, *, strict: bool, today: dt.date | None = None) -> None:
        self.exp = expectations
        self.strict = strict
        today = today or dt.date.today()
        self.expired = [e for e in expectations.entries if e.expired(today)]
        self.usable = [e for e in expectations.entries if not e.expired(today)]
        self.collected: set[int] = set()          # entries that matched a collected test (even a deselected one)
        self.covered: dict[int, int] = {}         # entry -> tests whose failure it turned into an expected one
        self.xpassed: dict[int, list[str]] = {}   # entry -> tests it expected to fail that passed
        self.assigned: dict[str, Entry] = {}      # nodeid -> the xfail entry known at collection
        self.where = expectations.path            # the file, as the id of a stale entry's failure names it

    @pytest.hookimpl(tryfirst=True)
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        # tryfirst: before -k/-m deselection, so an entry for a deselected test is not stale
        for item in items:
            entry = self.exp.first_match(*_ids(item), self.usable)
            if entry is None:
                continue
            self.collected.add(entry.number)
            if entry.action == "skip":
                item.add_marker(pytest.mark.skip(reason=f"{self.label(entry)}: {entry.reason}"))
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
        label = f"{self.label(entry)}: {entry.reason}"
        if rep.failed:
            rep.outcome = "skipped"
            rep.wasxfail = label
            rep.user_properties.append((_COVERED, str(entry.number)))
        elif rep.passed:
            rep.wasxfail = label
            rep.user_properties.append((_XPASSED, str(entry.number)))

    def label(self, entry: Entry) -> str:
        """``expected by FILE entry #N (selectors)[, issue]``: how a test's outcome names its entry."""
        issue = f", {entry.issue}" if entry.issue else ""
        return f"expected by {self.exp.path} {entry.describe()}{issue}"

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """Tally the entries each test's report names (an xdist worker's tally goes unused: the controller
        sees every report)."""
        if report.when != "call":
            return
        for key, value in report.user_properties:
            if key == _COVERED:
                self.covered[int(value)] = self.covered.get(int(value), 0) + 1
            elif key == _XPASSED:
                self.xpassed.setdefault(int(value), []).append(report.nodeid)

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any, error: Any) -> None:
        """xdist controller: collect which entries matched a test the worker collected."""
        self.collected.update(getattr(node, "workeroutput", {}).get("cbatch_expect_collected", ()))

    def problems(self) -> list[tuple[Entry, str]]:
        """The entries a strict run fails on, each with what happened: expired ones, those that matched
        no failure in the whole run."""
        out = [(e, f"{self.exp.path} {e.describe()} expired on {e.expires}: re-check the deviation, then extend "
                   f"or remove it") for e in self.expired]
        for e in self.usable:
            if self.covered.get(e.number):
                continue
            passed = self.xpassed.get(e.number, [])
            if passed:
                out.append((e, f"{self.exp.path} {e.describe()} matched no failure in this run: every test it "
                               f"expects to fail passed ({_few(passed)}), so the deviation is fixed: remove the "
                               f"entry"))
            elif e.number not in self.collected:
                out.append((e, f"{self.exp.path} {e.describe()} matches no test and no failure in this run: "
                               f"remove it"))
        return out

    def notes(self) -> list[str]:
        """Expected failures that passed while their entry still matched failures elsewhere: what happened."""
        return [f"{self.exp.path} {e.describe()} still matched {self.covered[e.number]} failing test(s); "
                f"{len(passed)} test(s) it expects to fail passed ({_few(passed)}): not a failure while the "
                f"entry matches elsewhere; narrow its selectors if that deviation is gone there"
                for e in self.usable if self.covered.get(e.number) and (passed := self.xpassed.get(e.number))]

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        workeroutput = getattr(session.config, "workeroutput", None)
        if workeroutput is not None:  # an xdist worker: the controller judges
            workeroutput["cbatch_expect_collected"] = sorted(self.collected)
            return
        if self.strict and self.problems() and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if getattr(terminalreporter.config, "workeroutput", None) is not None:
            return
        tr = terminalreporter
        tr.section("pytest-cbatch expectations")
        mode = "strict" if self.strict else "not strict"
        applied = len({*self.covered, *self.collected})
        tr.write_line(f"{self.exp.path}: {len(self.exp.entries)} entries ({mode}), {applied} applied in this run")
        for note in self.notes():
            tr.write_line("note: " + note, yellow=True)
        for entry, message in self.problems():
            tr.write_line(("FAIL: " if self.strict else "warning: ") + message, red=self.strict, yellow=not self.strict)
            if self.strict:  # counted in the run's last line, which so says why the run failed
                tr.stats.setdefault("failed", []).append(pytest.TestReport(
                    f"{self.where}::entry #{entry.number}", (self.where, 0, f"entry #{entry.number}"), {},
                    "failed", message, "call"))


def _few(nodeids: Sequence[str], n: int = 3) -> str:
    names = [nodeid.rpartition("::")[2] for nodeid in nodeids]
    return ", ".join(names[:n]) + (f" and {len(names) - n} more" if len(names) > n else "")
