"""The plugin's options and settings: command-line options and ini keys, and each parsed and checked (a bad
value is a usage error naming it), the Hypothesis profiles, and what an engine adapter declares about itself."""

from __future__ import annotations

import os
import re
from typing import Any, Mapping, Sequence

import pytest

PROFILES = ("ci", "dev", "thorough")


def add_options(parser: pytest.Parser) -> None:
    """Register the --cbatch-* options and cbatch_* ini keys (the plugin's ``pytest_addoption``)."""
    group = parser.getgroup("cbatch", "pytest-cbatch: scheduler conformance")
    group.addoption("--cbatch-impl", metavar="SPEC", default=None,
                    help="implementation under test: reference | NAME (an installed entry point; cbatch impls "
                         "lists them) | http://HOST:PORT[/v1] | exec:COMMAND | path/to/file.py[:attr] | "
                         "package.module[:attr] | path/to/folder/ (the course's layout) (ini: cbatch_impl; "
                         "docs/running.md#spec-forms)")
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
                         "next calls run at a short limit (a tenth of it, 1 to 10 s) until one finishes, default 3; "
                         "0 never shortens it (ini: cbatch_max_timeouts)")
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
    parser.addini("cbatch_max_timeouts", "calls in a row stopped at the time limit before the next run at a short "
                  "limit, 0: never (see --cbatch-max-timeouts)", default=None)
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
    for key in _ini_keys(config):
        if key.startswith("cbatch") and not registered(key):
            raise pytest.UsageError(f"{config.inipath or 'the ini file'}: {unknown_name('ini key', key, known)}")


def _ini_keys(config: pytest.Config) -> list[str]:
    """The keys the ini file sets.  pytest 9.2 deprecated ``Config.inicfg`` (a warning on every run) and has no
    public way to list them; its own unknown-key check reads ``_inicfg``, so this reads it where it exists."""
    keys = getattr(config, "_inicfg", None)
    return list(getattr(config, "inicfg", {}) if keys is None else keys)


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


def register_profiles() -> None:
    """Register the kit's Hypothesis profiles ``cbatch-ci``, ``cbatch-dev`` and ``cbatch-thorough`` (PROFILES)."""
    from hypothesis import HealthCheck, settings

    slow = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much]
    settings.register_profile("cbatch-ci", max_examples=100, derandomize=True, database=None, deadline=None,
                              print_blob=True, suppress_health_check=slow, stateful_step_count=50)
    settings.register_profile("cbatch-dev", max_examples=50, deadline=None, print_blob=True,
                              suppress_health_check=slow, stateful_step_count=50)
    settings.register_profile("cbatch-thorough", max_examples=1000, deadline=None, print_blob=True,
                              suppress_health_check=slow, stateful_step_count=50)


def _load_hypothesis_profile(config: pytest.Config, profile: str) -> str:
    """Register the kit's profiles and load one, unless the user chose a hypothesis profile;
    return a description of the profile in effect.

    Loading explicitly matters: with CI set, hypothesis silently switches to its
    own ``ci`` profile otherwise.
    """
    from hypothesis import settings

    register_profiles()
    chosen = config.getoption("hypothesis_profile", default=None)
    if chosen:
        return f"{chosen} (from --hypothesis-profile)"
    settings.load_profile(f"cbatch-{profile}")
    return f"cbatch-{profile}"
