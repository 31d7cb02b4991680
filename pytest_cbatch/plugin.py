"""The pytest plugin: ``pytest --cbatch-impl=SPEC`` runs the conformance suite.

Inert unless an implementation is selected (``--cbatch-impl`` or the ini key
``cbatch_impl``): it then loads the kit's hypothesis profile explicitly,
collects the shipped suite when no paths were given, prints the
implementation in the header and a clause summary at the end.  Importing this
module imports only pytest and the standard library.
"""

from __future__ import annotations

import fnmatch
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import pytest

SUITE_PACKAGE = "pytest_cbatch.suite"
PROFILES = ("ci", "dev", "thorough")
OUTCOMES = ("passed", "failed", "skipped", "xfailed", "xpassed", "error")

_STATE = pytest.StashKey["CbatchState"]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("cbatch", "pytest-cbatch: scheduler conformance")
    group.addoption("--cbatch-impl", metavar="SPEC", default=None,
                    help="implementation under test: reference | ENTRY_POINT | package.module:attr | "
                         "path/to/file.py:attr | exec:COMMAND (ini: cbatch_impl)")
    group.addoption("--cbatch-profile", choices=PROFILES, default=None,
                    help="hypothesis profile: ci (derandomized, the default; same examples for everyone), "
                         "dev (random, remembers failures), thorough (10x examples) (ini: cbatch_profile)")
    group.addoption("--cbatch-timeout", type=float, default=None, metavar="SECONDS",
                    help="time limit of every call into the implementation (in process, exec:, http://, "
                         "--cbatch-isolate; one lifecycle example), default 60; 0 disables it (ini: cbatch_timeout)")
    group.addoption("--cbatch-memory", type=float, default=None, metavar="MIB",
                    help="how much one in-process call may grow this process's resident memory, default 1024 MiB; "
                         "0 disables it (ini: cbatch_memory)")
    group.addoption("--cbatch-max-timeouts", type=int, default=None, metavar="N",
                    help="after N calls of the implementation in a row did not finish within the time limit, the "
                         "rest fail at once, default 3; 0 never stops calling (ini: cbatch_max_timeouts)")
    group.addoption("--cbatch-tick-seconds", type=float, default=None, metavar="SECONDS",
                    help="how long one trace tick lasts against an http:// live server, default 0.05 "
                         "(ini: cbatch_tick_seconds)")
    group.addoption("--cbatch-model", metavar="NAME", default=None,
                    help="the model an http:// live server is asked for, as it knows it (a model id, or the path "
                         "it was started with); default: the one /v1/models lists, needed when it lists none or "
                         "several (ini: cbatch_model)")
    group.addoption("--cbatch-artifacts", metavar="DIR", default=None,
                    help="where failing traces are written for replay, default .cbatch-failures "
                         "(ini: cbatch_artifacts)")
    group.addoption("--cbatch-isolate", action="store_true", default=False,
                    help="run the implementation only in a sandbox child process (limits, scrubbed environment; "
                         "--cbatch-timeout is the limit per call)")
    group.addoption("--cbatch-sandbox", choices=("auto", "bwrap", "process"), default=None,
                    help="with --cbatch-isolate: auto (bubblewrap when it works here, else a notice; the default), "
                         "bwrap (required) or process (ini: cbatch_sandbox)")
    group.addoption("--cbatch-config", action="append", default=None, metavar="KEY=VALUE",
                    help="override a base setting of every workload that does not set it itself, e.g. "
                         "release_delay=0 for an engine that frees pages at once; repeatable (ini: cbatch_config, "
                         "one KEY=VALUE per line)")
    group.addoption("--cbatch-course", action="store_true", default=False,
                    help="also judge clause course_results: the exact results the course states and its published "
                         "simulator gives, on reserve-admission workloads (for a course assignment; an engine's "
                         "policy differs by design) (ini: cbatch_course)")
    group.addoption("--cbatch-suite", choices=("auto", "off"), default=None,
                    help="auto: with no paths given, run the shipped suite (default); off: never redirect "
                         "collection (ini: cbatch_suite)")
    parser.addini("cbatch_impl", "implementation under test (see --cbatch-impl)", default=None)
    parser.addini("cbatch_profile", "hypothesis profile: ci, dev or thorough", default="ci")
    # No ini default for the limits: unset, the implementation's declared CBATCH_LIMITS may replace LIMIT_DEFAULTS.
    parser.addini("cbatch_timeout", "seconds per call into the implementation, 0: no limit (see --cbatch-timeout)",
                  default=None)
    parser.addini("cbatch_memory", "MiB of memory growth per in-process call, 0: no limit (see --cbatch-memory)",
                  default=None)
    parser.addini("cbatch_max_timeouts", "calls in a row stopped at the time limit before the rest fail at once, "
                  "0: never (see --cbatch-max-timeouts)", default=None)
    parser.addini("cbatch_tick_seconds", "seconds per trace tick against an http:// live server", default="0.05")
    parser.addini("cbatch_model", "the model an http:// live server is asked for (see --cbatch-model)", default=None)
    parser.addini("cbatch_artifacts", "directory for failing traces", default=".cbatch-failures")
    parser.addini("cbatch_suite", "auto or off (see --cbatch-suite)", default="auto")
    parser.addini("cbatch_course", "true: also judge clause course_results (see --cbatch-course)", type="bool",
                  default=False)
    parser.addini("cbatch_sandbox", "auto, bwrap or process (see --cbatch-sandbox)", default="auto")
    parser.addini("cbatch_config", "base-setting overrides, one KEY=VALUE per line (see --cbatch-config)",
                  type="linelist", default=[])
    from .expect import add_options as add_expect_options

    add_expect_options(group, parser)


LIMIT_DEFAULTS = {"timeout": 60.0, "memory": 1024.0}
"""Seconds per call and MiB of memory growth when neither an option, the ini file nor the implementation says."""


def _setting(config: pytest.Config, name: str) -> Any:
    value = config.getoption(f"cbatch_{name}")
    return value if value is not None else config.getini(f"cbatch_{name}")


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
    opt_in: tuple[str, ...] = ()                                        # opt-in clauses asked for (--cbatch-course)
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
        empty = dict.fromkeys(OUTCOMES, 0)
        self.parts.setdefault(part, dict(empty))[outcome] += 1
        if clause is not None:
            self.outcomes.setdefault(clause, dict(empty))[outcome] += 1
            if blocked:
                self.blocked[clause] = self.blocked.get(clause, 0) + 1
        self.unobservable += unobservable

    def judged(self) -> list[str]:
        """The clauses (and lifecycle parts, numeric checks) that passed or failed on some test."""
        return sorted(c for c, n in self.outcomes.items() if _verdicts(n))

    def judged_nothing(self) -> bool:
        """Whether no suite test (of any part, generated traces included) passed or failed."""
        return bool(self.parts) and not any(_verdicts(n) for n in self.parts.values())

    @property
    def judge(self) -> Any:
        if self._judge is None:
            from .runner import Judge

            self._judge = Judge(self.impl)
        return self._judge


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "cbatch_clause(id): the contract clause a conformance test checks")
    config.addinivalue_line("markers", "gpu: a pytest-cbatch numeric check that needs a CUDA device")
    spec = _setting(config, "impl")
    if not spec:
        return
    _refuse_unknown_ini(config)
    from .impls import ImplementationError, resolve_impl

    from .bounded import Bounds

    from .bounded import parse_limit

    limits = {}
    for name, unit in (("timeout", "seconds"), ("memory", "MiB")):
        chosen = _setting(config, name)
        try:
            limits[name] = parse_limit(LIMIT_DEFAULTS[name] if chosen is None else chosen,
                                       f"--cbatch-{name} (ini cbatch_{name})", unit)
        except ValueError as exc:
            raise pytest.UsageError(str(exc)) from None
    timeout = limits["timeout"]
    left = frozenset(field for name, field in (("timeout", "seconds"), ("memory", "memory_mib"))
                     if _setting(config, name) is None)
    bounds = Bounds(seconds=timeout, memory_mib=limits["memory"], defaults=left)
    profile = _setting(config, "profile")
    if profile not in PROFILES:
        raise pytest.UsageError(f"cbatch_profile must be one of {', '.join(PROFILES)}, got {profile!r}")
    try:
        tick_seconds = parse_limit(_setting(config, "tick_seconds"), "--cbatch-tick-seconds (ini cbatch_tick_seconds)",
                                   "seconds")
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None
    try:
        if config.getoption("cbatch_isolate"):
            from .sandbox import IsolatedImplementation, Limits, load_spec_for

            rootdir = str(config.invocation_params.dir)
            limits = Limits(call_seconds=timeout or 86400.0, names=(("call_seconds", "--cbatch-timeout"),))
            impl = IsolatedImplementation(spec, load_spec_for(spec, rootdir=rootdir), limits,
                                          mode=_setting(config, "sandbox"))
        else:
            impl = resolve_impl(spec, bounds=bounds, rootdir=str(config.invocation_params.dir),
                                tick_seconds=tick_seconds, model=_setting(config, "model") or None)
    except ImplementationError as exc:
        raise pytest.UsageError(str(exc)) from None
    impl.breaker = _breaker(config)
    chosen = _config_overrides(config.getoption("cbatch_config") or config.getini("cbatch_config"))
    native = _engine_native(impl, chosen)
    hypothesis_profile = _load_hypothesis_profile(config, profile)  # global state: only once every setting is valid
    redirected = False
    if _setting(config, "suite") == "auto" and config.args_source in (
        pytest.Config.ArgsSource.INVOCATION_DIR, pytest.Config.ArgsSource.TESTPATHS
    ):
        config.args = [str(suite_dir())]
        redirected = True
    artifacts = Path(config.invocation_params.dir, _setting(config, "artifacts"))
    state = CbatchState(spec, impl, artifacts, hypothesis_profile, redirected, overrides={**native, **chosen},
                        native=native, opt_in=opted_clauses(config))
    config.stash[_STATE] = state
    _configure_last_resort(config, enabled=timeout > 0 and not _faulthandler_timeout(config))
    config.pluginmanager.register(_Reporter(state), "cbatch-reporter")
    from .expect import configure as configure_expectations

    configure_expectations(config)  # --cbatch-expect: expected failures (pytest_cbatch/expect.py)


def _refuse_unknown_ini(config: pytest.Config) -> None:
    """A ``cbatch_*`` ini key pytest does not know (``cbatch_timout``) is a usage error naming the nearest one:
    left a warning, the limit or setting the user meant would silently not apply."""
    from .spelling import unknown_name

    def registered(name: str) -> bool:
        try:
            config.getini(name)
        except ValueError as exc:  # a registered key with a value of the wrong type is not an unknown one
            return not str(exc).startswith("unknown configuration value")
        return True

    known = [name for name in vars(config.option) if name.startswith("cbatch_") and registered(name)]
    for key in getattr(config, "inicfg", {}):
        if key.startswith("cbatch") and not registered(key):
            raise pytest.UsageError(f"{config.inipath or 'the ini file'}: {unknown_name('ini key', key, known)}")


def _faulthandler_timeout(config: pytest.Config) -> bool:
    """Whether pytest's faulthandler_timeout is set (it then ends a stuck process, and owns faulthandler's timer)."""
    try:
        return float(config.getini("faulthandler_timeout") or 0) > 0
    except (ValueError, KeyError):
        return False


def _configure_last_resort(config: pytest.Config, enabled: bool) -> None:
    """Point the last resort of ``bounded`` at a copy of the terminal's stderr (fd 2 is captured during tests)."""
    from .bounded import configure_last_resort

    try:
        fd = os.dup(2)
    except OSError:
        configure_last_resort(enabled=enabled)
        return
    previous = configure_last_resort(enabled=enabled, fd=fd)

    def restore() -> None:
        configure_last_resort(**previous)
        os.close(fd)

    config.add_cleanup(restore)


def opted_clauses(config: pytest.Config) -> tuple[str, ...]:
    """The opt-in clauses this run asked for: ``course_results`` with --cbatch-course or ini cbatch_course."""
    return ("course_results",) if config.getoption("cbatch_course") or config.getini("cbatch_course") else ()


def _breaker(config: pytest.Config) -> Any:
    """The breaker of --cbatch-max-timeouts (ini cbatch_max_timeouts); a bad value is a usage error."""
    from .breaker import DEFAULT_MAX_TIMEOUTS, Breaker

    chosen = _setting(config, "max_timeouts")
    text = str(DEFAULT_MAX_TIMEOUTS if chosen is None else chosen).strip()
    if not re.fullmatch(r"[0-9]{1,9}", text):
        raise pytest.UsageError(f"--cbatch-max-timeouts (ini cbatch_max_timeouts) must be a whole number of calls, "
                                f"0 to never stop calling; got {chosen!r}")
    return Breaker(int(text))


def _config_overrides(items: Sequence[str]) -> dict[str, Any]:
    """Parse --cbatch-config KEY=VALUE items; a bad one is a usage error naming it."""
    from .reference.scheduler_sim import CONFIG_CHOICES, validate_config
    from .spelling import unknown_name

    out: dict[str, Any] = {}
    for item in items:
        key, sep, text = item.partition("=")
        key, text = key.strip(), text.strip()
        if not sep:
            raise pytest.UsageError(f"--cbatch-config {item!r} (ini cbatch_config): expected KEY=VALUE with KEY one "
                                    f"of {', '.join(CONFIG_CHOICES)}")
        if key not in CONFIG_CHOICES:
            raise pytest.UsageError(f"--cbatch-config {item!r} (ini cbatch_config): "
                                    f"{unknown_name('setting', key, CONFIG_CHOICES)}")
        number = not isinstance(CONFIG_CHOICES[key], tuple) and re.fullmatch(r"-?[0-9]{1,30}", text)
        value: Any = int(text) if number else text  # else validate_config names the value it refuses
        try:
            validate_config({key: value})
        except ValueError as exc:
            raise pytest.UsageError(f"--cbatch-config {item!r}: {exc}") from None
        out[key] = value
    return out


def _engine_native(impl: Any, chosen: Mapping[str, Any]) -> dict[str, Any]:
    """Apply what an engine adapter declares about itself (optional attributes of the object the SPEC
    names): ``CBATCH_NATIVE_CONFIG``, the base settings it runs natively (e.g. ``{"release_delay": 0}``),
    used like --cbatch-config for every workload that does not set them itself (an explicit
    --cbatch-config wins); and ``CBATCH_ENGINE_LOGGERS``, logger names whose records below ERROR are
    engine noise, kept out of failure reports.  Returns the native settings in effect."""
    import logging

    namespace = getattr(impl, "namespace", None)
    for name in getattr(namespace, "CBATCH_ENGINE_LOGGERS", ()):
        logging.getLogger(name).setLevel(logging.ERROR)
    try:
        from .plain import plain
        from .reference.scheduler_sim import validate_config

        declared = plain(getattr(namespace, "CBATCH_NATIVE_CONFIG", None))
        if not isinstance(declared, (dict, type(None))):
            raise ValueError(f"a dict of settings is expected, got {declared!r}")
        declared = validate_config(declared or {})
    except ValueError as exc:  # NotPlain too: what the implementation declares is data, checked as any
        raise pytest.UsageError(f"{impl.spec}: its CBATCH_NATIVE_CONFIG is invalid: {exc}") from None
    return {k: v for k, v in declared.items() if k not in chosen}


def _load_hypothesis_profile(config: pytest.Config, profile: str) -> str:
    """Register the kit's profiles and load one, unless the user chose a hypothesis profile;
    return a description of the profile in effect.

    Loading explicitly matters: with CI set, hypothesis silently switches to its
    own ``ci`` profile otherwise.
    """
    from hypothesis import HealthCheck, settings

    slow = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much]
    settings.register_profile("cbatch-ci", max_examples=100, derandomize=True, database=None, deadline=None,
                              print_blob=True, suppress_health_check=slow, stateful_step_count=50)
    settings.register_profile("cbatch-dev", max_examples=50, deadline=None, print_blob=True,
                              suppress_health_check=slow, stateful_step_count=50)
    settings.register_profile("cbatch-thorough", max_examples=1000, deadline=None, print_blob=True,
                              suppress_health_check=slow, stateful_step_count=50)
    chosen = config.getoption("hypothesis_profile", default=None)
    if chosen:
        return f"{chosen} (from --hypothesis-profile)"
    settings.load_profile(f"cbatch-{profile}")
    return f"cbatch-{profile}"


def suite_dir() -> Path:
    """The folder of the shipped conformance suite."""
    import pytest_cbatch.suite as suite

    return Path(suite.__file__).parent


def _active(config: pytest.Config) -> CbatchState | None:
    return config.stash.get(_STATE, None)


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> pytest.Module | None:
    """Collect the suite's modules even when the user's python_files would not."""
    state = _active(parent.config)
    if state is None or file_path.suffix != ".py" or not file_path.name.startswith("test_"):
        return None
    if file_path.parent != suite_dir():
        return None
    patterns = parent.config.getini("python_files")
    if any(fnmatch.fnmatch(file_path.name, p) for p in patterns):
        return None  # pytest's own collector takes it
    return pytest.Module.from_parent(parent, path=file_path)


def _is_suite_item(item: pytest.Item) -> bool:
    fn = getattr(item, "function", None)
    return fn is not None and getattr(fn, "__module__", "").startswith(SUITE_PACKAGE)


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    if _active(config) is None and any(_is_suite_item(item) for item in items):
        raise pytest.UsageError("the pytest-cbatch conformance suite needs an implementation: "
                                "pass --cbatch-impl=SPEC (try --cbatch-impl=reference)")


def pytest_collection_finish(session: pytest.Session) -> None:
    state = _active(session.config)
    if state is None or not state.redirected:
        return
    if not any(_is_suite_item(item) for item in session.items):
        raise pytest.UsageError(
            "pytest-cbatch: --cbatch-impl is set but no conformance test was selected. Check -k/-m, and the "
            "python_functions ini setting (the suite's tests are named test_*)."
        )


class _Reporter:
    """Header, whole-module skips and end-of-run clause summary; registered only when an implementation is set."""

    def __init__(self, state: CbatchState) -> None:
        self.state = state

    @pytest.hookimpl(trylast=True)  # after -k/-m deselection: only modules with a selected test are asked
    def pytest_collection_modifyitems(self, config: pytest.Config, items: list[pytest.Item]) -> None:
        """A suite module may define ``cbatch_module_skip() -> str | None`` to put off a costly check
        (numerics: importing torch) until one of its tests is selected; a reason skips the whole module,
        reported exactly as a skip at collection."""
        modules = {item.getparent(pytest.Module): None for item in items if _is_suite_item(item)}
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
        ]

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        if _is_suite_item(item):  # travels with every report, so xdist workers' results count too
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


def _verdicts(counts: Mapping[str, int]) -> int:
    """How many of the tests counted in ``counts`` reached a verdict (not skipped, not an error)."""
    return counts["passed"] + counts["failed"] + counts["xfailed"] + counts["xpassed"]


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


# -- fixtures ------------------------------------------------------------------

def _require(request: pytest.FixtureRequest) -> CbatchState:
    state = _active(request.config)
    if state is None:
        pytest.fail("this test needs an implementation: pass --cbatch-impl=SPEC", pytrace=False)
    return state


@pytest.fixture(scope="session")
def cbatch_impl(request: pytest.FixtureRequest) -> Any:
    """The implementation under test (``--cbatch-impl``): ``.run(trace, config)``,
    ``.unsupported_reason(config)``, ``.namespace`` (what the SPEC points at), ``.spec``."""
    return _require(request).impl


@pytest.fixture(scope="session")
def cbatch_state(request: pytest.FixtureRequest) -> CbatchState:
    """The plugin's resolved state (implementation, judge, artifacts folder)."""
    return _require(request)


@pytest.fixture(scope="session")
def cbatch_run(request: pytest.FixtureRequest) -> Callable[..., dict[str, Any]]:
    """``cbatch_run(trace, config) -> report``: runs the implementation and fails the
    test, with the full explanation, if any report clause is violated."""
    state = _require(request)

    def run(trace: Sequence[Mapping[str, Any]], config: Mapping[str, Any] | None = None) -> dict[str, Any]:
        from .workloads import BASE_CONFIG

        cfg = {**BASE_CONFIG, **(config or {})}
        report = None
        for cid in state.clauses:
            if cid in ("invalid_input_refused", "deterministic"):
                continue
            result = state.judge.judge(cid, list(trace), cfg)
            if result.status == "skip" and cid == "completes":
                pytest.skip(result.reason)
            if result.status == "fail":
                fail_clause(state, cid, "cbatch_run", list(trace), cfg, result, shrink=False)
            report = result.report or report
        return report  # type: ignore[return-value]

    return run


@pytest.fixture(scope="session")
def cbatch_schemas() -> Any:
    """The schema module: ``load_schema(name)``, ``schema_issues(instance, name)``, ``SCHEMA_NAMES``."""
    from . import schemas

    return schemas


def fail_clause(
    state: CbatchState,
    clause: str,
    workload: str,
    trace: list[dict[str, Any]],
    config: dict[str, Any],
    result: Any,
    *,
    shrink: bool = True,
) -> None:
    """Fail the current test with the explained, replayable violation of ``clause``."""
    from .explain import explain_failure, trace_jsonl
    from .runner import shrink_trace

    original = len(trace)
    if shrink and not result.stopped:
        smaller = shrink_trace(state.judge, clause, trace, config)
        if len(smaller) < len(trace):
            retry = state.judge.judge(clause, smaller, config)
            if retry.status == "fail":
                trace, result = smaller, retry
    path = _write_artifact(state.artifacts, f"{clause}-{workload}.jsonl", trace_jsonl(trace))
    text = explain_failure(spec=state.spec, replay_spec=state.impl.replay(), clause=clause, workload=workload,
                           violations=result.violations, trace=trace, config=config, report=result.report,
                           trace_path=path, shrunk_from=original, stack=result.stack, stopped=result.stopped)
    text += "\n" + _write_picture(state, clause, workload, trace, config, result, path, text)
    if result.stopped:
        raise RunawayFailure(text)
    pytest.fail(text, pytrace=False)


def _write_picture(state: CbatchState, clause: str, workload: str, trace: list[dict[str, Any]],
                   config: dict[str, Any], result: Any, trace_path: str, text: str) -> str:
    """Write the failure's page (``pytest_cbatch.picture``) beside its replay file; the line naming it."""
    from .explain import replay_command

    def page() -> str:
        from .picture import failure_page

        return failure_page(spec=state.spec, clause=clause, workload=workload, violations=result.violations,
                            trace=trace, report=result.report, text=text,
                            replay=replay_command(state.impl.replay(), trace_path, config, clause))

    return picture_line(state, f"{clause}-{workload}.html", page)


def picture_line(state: CbatchState, name: str, page: Callable[[], str]) -> str:
    """Write the page ``page()`` draws as ``name`` in the artifacts folder; the failure text's line naming it."""
    try:
        html = page()
    except Exception as exc:  # a picture never hides the verdict it illustrates
        return f"picture: not drawn ({type(exc).__name__}: {exc})"
    return f"picture: {_write_artifact(state.artifacts, name, html)} (open it in a browser)"


class RunawayFailure(BaseException):
    """A test's failure because the implementation was stopped for a limit.

    A BaseException, so Hypothesis does not shrink on it (each shrink step would
    wait out the limit again): the test ends at once with the trace that was
    stopped, and the plugin reports the text as an ordinary failure.
    """


def _write_artifact(folder: Path, name: str, text: str) -> str:
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / safe
        tmp = folder / (safe + ".tmp")
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    except OSError as exc:
        return f"<could not write {folder / safe}: {exc}>"
    return str(path.resolve())  # absolute: the replay command works from any directory
