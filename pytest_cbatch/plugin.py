"""The pytest plugin: ``pytest --cbatch-impl=SPEC`` runs the conformance suite.

Inert unless an implementation is selected (``--cbatch-impl`` or the ini key
``cbatch_impl``): it then loads the kit's hypothesis profile explicitly,
collects the shipped suite when no paths were given, prints the
implementation in the header and a clause summary at the end.  Importing this
module imports only pytest and the standard library.

This module holds the hooks and fixtures; ``pytest_options`` the options and
settings, ``run_state`` what the run resolved and tallied, ``run_summary`` the
reporter and end-of-run summary, ``failure_report`` a failing test's report.
"""

from __future__ import annotations

import fnmatch
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import pytest

from .failure_report import RunawayFailure, fail_clause, picture_line
from .pytest_options import (
    LIMIT_DEFAULTS, PROFILES, _breaker, _config_overrides, _configure_last_resort, _engine_native,
    _faulthandler_timeout, _load_hypothesis_profile, _refuse_unknown_ini, _setting, add_options, opted_clauses,
)
from .run_state import OUTCOMES, SUITE_PACKAGE, CbatchState, is_suite_item, suite_dir
from .run_summary import Reporter

__all__ = ["LIMIT_DEFAULTS", "OUTCOMES", "PROFILES", "SUITE_PACKAGE", "CbatchState", "RunawayFailure",
           "cbatch_impl", "cbatch_run", "cbatch_schemas", "cbatch_state", "fail_clause", "opted_clauses",
           "picture_line", "suite_dir"]

_STATE = pytest.StashKey["CbatchState"]()


def pytest_addoption(parser: pytest.Parser) -> None:
    add_options(parser)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "cbatch_clause(id): the contract clause a conformance test checks")
    config.addinivalue_line("markers", "cbatch_generated(workload): a pytest-cbatch generated-trace test and the "
                                       "workload name its failures give")
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
    redirected, collected = False, ""
    if _setting(config, "suite") == "auto" and config.args_source in (
        pytest.Config.ArgsSource.INVOCATION_DIR, pytest.Config.ArgsSource.TESTPATHS
    ):
        own = [] if config.getoption("cbatch_impl") else list(config.args)
        config.args = [str(suite_dir()), *own]
        redirected = not own
        collected = (f"the conformance suite and this project's own tests ({', '.join(own)}), since cbatch_impl "
                     f"comes from the ini" if own else "the conformance suite only (no paths given)")
    artifacts = Path(config.invocation_params.dir, _setting(config, "artifacts"))
    state = CbatchState(spec, impl, artifacts, hypothesis_profile, redirected, overrides={**native, **chosen},
                        native=native, opt_in=opted_clauses(config), collected=collected)
    config.stash[_STATE] = state
    _configure_last_resort(config, enabled=timeout > 0 and not _faulthandler_timeout(config))
    config.pluginmanager.register(Reporter(state), "cbatch-reporter")
    from .expect import configure as configure_expectations

    configure_expectations(config)  # --cbatch-expect: expected failures (pytest_cbatch/expect.py)


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


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    if _active(config) is None and any(is_suite_item(item) for item in items):
        raise pytest.UsageError("the pytest-cbatch conformance suite needs an implementation: "
                                "pass --cbatch-impl=SPEC (try --cbatch-impl=reference)")


def pytest_collection_finish(session: pytest.Session) -> None:
    state = _active(session.config)
    if state is None or not state.collected:
        return
    chose = session.config.option.keyword or session.config.option.markexpr
    if not any(is_suite_item(item) for item in session.items) and (state.redirected or not chose):
        raise pytest.UsageError(
            "pytest-cbatch: --cbatch-impl is set but no conformance test was selected. Check -k/-m, and the "
            "python_functions ini setting (the suite's tests are named test_*)."
        )


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
