"""The run's reporter: the header, whole-module skips, each suite test's tally, and the end-of-run summary
(what was judged, failed, never ran or was not judged, and why)."""

from __future__ import annotations

import os
from typing import Any, Mapping, Sequence

import pytest

from .failure_report import RunawayFailure
from .run_state import OUTCOMES, CbatchState, is_suite_item, suite_dir


class Reporter:
    """Header, whole-module skips and end-of-run clause summary; registered only when an implementation is set."""

    def __init__(self, state: CbatchState) -> None:
        self.state = state

    @pytest.hookimpl(trylast=True)  # after -k/-m deselection: only modules with a selected test are asked
    def pytest_collection_modifyitems(self, config: pytest.Config, items: list[pytest.Item]) -> None:
        """A suite module may define ``cbatch_module_skip() -> str | None`` to put off a costly check
        (numerics: importing torch) until one of its tests is selected; a reason skips the whole module,
        reported exactly as a skip at collection."""
        modules = {item.getparent(pytest.Module): None for item in items if is_suite_item(item)}
        skipped = set()
        for module in filter(None, modules):
            ask = getattr(module.obj, "cbatch_module_skip", None)
            reason = ask() if callable(ask) else None
            if reason:
                skipped.add(module)
                where = (str(module.path), ask.__code__.co_firstlineno, f"Skipped: {reason}")
                config.hook.pytest_collectreport(report=pytest.CollectReport(module.nodeid, "skipped", where, []))
        if skipped:
            items[:] = [item for item in items if item.getparent(pytest.Module) not in skipped]

    def pytest_report_header(self, config: pytest.Config) -> list[str]:
        from .schemas import validator_backend

        state = self.state
        return [
            f"cbatch: impl {state.impl.describe()}",
            f"cbatch: hypothesis profile {state.profile}; schema validator {validator_backend()}; "
            f"failing traces -> {state.artifacts}",
            *([f"cbatch: collecting {state.collected}"] if state.collected else []),
        ]

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        if is_suite_item(item):  # travels with every report, so xdist workers' results count too
            module = item.function.__module__  # type: ignore[attr-defined]
            item.user_properties.append(("cbatch_part", module.rpartition(".test_")[2]))

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
        """A test that ended because the implementation was stopped for a limit fails with the explanation,
        not with a traceback through the kit."""
        outcome = yield
        if call.excinfo is None:
            return
        from .bounded import CallStopped

        report = outcome.get_result()
        if call.excinfo.errisinstance(RunawayFailure):
            report.longrepr = str(call.excinfo.value)
        elif call.excinfo.errisinstance(CallStopped):
            report.longrepr = _stopped_text(item, self.state, call.excinfo.value)  # type: ignore[arg-type]

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        """A suite module skipped as a whole (numerics without torch) still shows in the summary, with why."""
        path = report.nodeid.replace(os.sep, "/")
        name = path.rpartition("/")[2]
        suite_module = (self.state.redirected or path.endswith(f"pytest_cbatch/suite/{name}"))
        if report.skipped and "::" not in path and name.startswith("test_") and suite_module and \
                (suite_dir() / name).is_file():
            part = name[len("test_"):].removesuffix(".py")
            self.state.count(part, None, "skipped")
            longrepr = report.longrepr
            reason = str(longrepr[2] if isinstance(longrepr, tuple) else longrepr)
            self.state.part_skips[part] = reason.removeprefix("Skipped: ")

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        props = dict(report.user_properties)
        part = props.get("cbatch_part")
        if part is None:
            return
        if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
            outcome = "error" if report.when == "setup" and report.failed else report.outcome
            if hasattr(report, "wasxfail"):  # pytest counts expected failures apart (--cbatch-expect)
                outcome = "xfailed" if report.skipped else "xpassed"
        elif report.when == "teardown" and report.failed:
            outcome = "error"
        else:
            return
        from .runner import NO_REPORT, SCHEMA_BLOCKED

        why = str(report.longrepr) if report.skipped else ""
        self.state.count(part, props.get("cbatch_clause"), outcome, unobservable="not observable" in why,
                         blocked=NO_REPORT in why or SCHEMA_BLOCKED in why)
        for clause in filter(None, str(props.get("cbatch_unjudged", "")).split(",")):
            self.state.unjudged.setdefault(clause, []).append(str(props.get("cbatch_workload", part)))

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        """A run whose suite tests judged no clause of the implementation is no pass: it ends non-zero."""
        worker = hasattr(session.config, "workerinput")  # under xdist the controller, which sees every test, decides
        if self.state.judged_nothing() and exitstatus == pytest.ExitCode.OK and not worker:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        tr = terminalreporter
        parts = self.state.parts
        if not parts:
            return
        tr.section("pytest-cbatch")
        outcomes = self.state.outcomes
        ran = self.state.judged()
        failed = sorted(c for c, n in outcomes.items() if n["failed"] + n["error"])
        never = sorted(c for c, n in outcomes.items() if c not in ran and not n["error"])
        total = {k: sum(n[k] for n in parts.values()) for k in OUTCOMES}
        errors = "".join(f", {total[k]} {k}" for k in ("xfailed", "xpassed", "error") if total[k])
        tr.write_line(f"impl {self.state.spec}: judged {_judged_text(outcomes, ran)}; {total['passed']} checks "
                      f"passed, {total['failed']} failed, {total['skipped']} skipped{errors}")
        tr.write_line("by part: " + "; ".join(
            f"{part} {_counts_text(counts)}" + (f" (the whole module: {self.state.part_skips[part]})"
                                                if part in self.state.part_skips else "")
            for part, counts in parts.items()))
        if self.state.native:
            settings = ", ".join(f"{k}={v}" for k, v in self.state.native.items())
            tr.write_line(f"engine-native settings: {settings}, declared by {self.state.spec}, used by every workload "
                          f"that does not test them (override with --cbatch-config)")
        if failed:
            tr.write_line("failed clauses: " + ", ".join(failed), red=True)
        if never:
            tr.write_line("never ran (skipped on every workload): " + ", ".join(never), yellow=True)
        blocked = {c: n for c, n in self.state.blocked.items() if c not in failed}
        if blocked:
            tr.write_line(f"NOT JUDGED where the implementation failed: {sum(blocked.values())} checks of "
                          f"{len(blocked)} clauses ({_few(sorted(blocked))}) were skipped because completes or "
                          f"schema_valid failed on their workload; those clauses are not passed there (see the "
                          f"failures of completes and schema_valid).", red=True, bold=True)
        unjudged = self.state.unjudged
        if unjudged:
            where = [f"{clause} in {'/'.join(unjudged[clause])}" for clause in sorted(unjudged)]
            tr.write_line(f"NOT JUDGED in the lifecycle parts: {len(unjudged)} clauses ({_few(where)}) were reached by "
                          f"no run, most often because an earlier clause failed on every run; those clauses are not "
                          f"passed (see the failures of test_lifecycle, or why with -rs).", red=True, bold=True)
        if self.state.judged_nothing():
            tr.write_line(f"NOTHING JUDGED: no clause was judged for {self.state.spec}, so this run proves nothing "
                          f"and ends non-zero; see why with -rs.", red=True, bold=True)
        hidden = self.state.unobservable
        if hidden:
            tr.write_line(f"NOT OBSERVABLE: {hidden} checks skipped because this implementation's reports cannot "
                          f"show what their clause needs (client-side reports carry no snapshots or dispatches); "
                          f"those clauses were not judged.", yellow=True, bold=True)
        if total["skipped"] > total["passed"] + total["failed"] + total["error"]:
            tr.write_line(f"WARNING: most conformance checks were SKIPPED ({total['skipped']} of "
                          f"{sum(total.values())}); a green run proves little here. See why with -rs.",
                          red=True, bold=True)


def _stopped_text(item: pytest.Item, state: CbatchState, stopped: Any) -> str:
    """The failure text of a test the watchdog stopped outside the contract runner (a lifecycle example)."""
    from .bounded import last_stop
    from .explain import stack_lines

    stopped = stopped if stopped.message else (last_stop() or stopped)
    props = dict(item.user_properties)
    what = props.get("cbatch_clause") or item.name
    part = props.get("cbatch_workload")
    scope = f"one example of the {part} state machine" if str(what).startswith("lifecycle.") else "the call"
    lines = [f"[{what}] stopped with --cbatch-impl={state.spec}: {scope} {stopped}"]
    lines += stack_lines(stopped.stack, True)
    if getattr(stopped, "script", ""):
        lines.append("the example's operations so far (runnable Python; the next call into the implementation "
                     "did not return):")
        lines += ["  " + line for line in stopped.script.splitlines()]
    if part and str(what).startswith("lifecycle."):
        lines.append(f"rerun: pytest --cbatch-impl={state.spec} -k 'test_lifecycle and {part}'")
    return "\n".join(lines)


def _judged_text(outcomes: Mapping[str, Any], judged: Sequence[str]) -> str:
    """How many of the selected contract clauses, lifecycle parts and numeric checks were judged, each
    counted apart and the contract's against its whole clause count (``runner.ALL_CLAUSES``)."""
    from .runner import ALL_CLAUSES

    groups: dict[str, list[str]] = {"contract": [], "lifecycle": [], "numerics": []}
    for name in outcomes:
        groups[name.partition(".")[0] if name.startswith(("lifecycle.", "numerics.")) else "contract"].append(name)
    words = {"contract": "contract clauses", "lifecycle": "lifecycle parts", "numerics": "numeric checks"}
    out = []
    for group, names in groups.items():
        if names or group == "contract":
            out.append(f"{sum(n in judged for n in names)} of {len(names)} {words[group]} selected"
                       + (f" (the contract has {len(ALL_CLAUSES)})" if group == "contract" else ""))
    return ", ".join(out)


def _few(names: Sequence[str], n: int = 4) -> str:
    return ", ".join(names[:n]) + (f" and {len(names) - n} more" if len(names) > n else "")


def _counts_text(counts: Mapping[str, int]) -> str:
    shown = [f"{counts[k]} {k}" for k in OUTCOMES if counts[k]]
    return ", ".join(shown) or "nothing ran"
