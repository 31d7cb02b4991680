"""Resolving ``--cbatch-impl SPEC`` to an implementation the kit can run: the core.

This module defines what every implementation is (:class:`Implementation`, the
outcomes of a run, the in-process :class:`PythonImplementation`) and resolves a
SPEC through the *kinds* registered in the entry-point group
``pytest_cbatch.kinds`` (:data:`KIND_GROUP`).  It imports no kind: each is
loaded from its entry point when a SPEC is resolved, and a kind's own module
imports its transport (``live``, a subprocess, the course's file layout) only
when it builds an implementation.  A third party adds a SPEC form by
registering a :class:`Kind` there (``docs/kinds.md``).

The built-in kinds, asked in this order (``Kind.order``; the first that claims
the SPEC builds it):

* ``http://HOST:PORT[/v1]`` — a live OpenAI-compatible server (the ``live`` extra;
  :mod:`pytest_cbatch.kinds.live`).
* ``exec:COMMAND`` — any language over stdin and stdout (:mod:`pytest_cbatch.kinds.command`;
  the protocol is ``docs/exec-protocol.md``).
* ``path/to/file.py[:attr]`` — that file as a module (or an object in it), loaded
  without installing it, its folder first on sys.path while it is imported.
* ``package.module:attr`` — an importable object.
* ``path/to/folder`` — a submission in the course's layout: its
  ``scheduler_sim.py`` and/or ``scheduler_faults.py``, merged.
* ``NAME`` — an entry point in the group ``pytest_cbatch.impls`` (engines
  register themselves); ``reference`` is the built-in one.  A bare name that
  is no entry point may still be a folder, then a module.
* ``package.module`` — that module.

A Python implementation is a callable ``simulate(trace, **config) -> report``,
or a module or object with a ``simulate`` attribute.  Support is a property of
settings, never of a trace (``support``): a config key its signature does not
accept (and no ``**kwargs``), or a setting its ``CBATCH_UNSUPPORTED`` names,
makes the workloads that need it skip with the reason, unrun.  A workload it
declines all the same (``NotImplementedError``; exit 3 over ``exec:``) is
settled by one probe per distinct config (``Implementation.run``): declined
there too, the settings are unsupported; run there, the workload fails
``completes``.  Every call runs under
``bounded.call`` (a time and a memory limit, ``Bounds``); a call stopped
there, or an ``exec:`` command past its time limit, is a ``Stopped`` outcome.
A module may declare its own limits for those the user left at their default,
``CBATCH_LIMITS = {"seconds": 900, "memory_mib": 0}`` (an engine that starts
on its first call, say).
"""

from __future__ import annotations

import copy
import inspect
import time
from dataclasses import dataclass, replace
from importlib.metadata import entry_points
from typing import Any, Callable, Mapping, Sequence

from . import bounded
from .bounded import Bounds
from .breaker import Breaker
from .plain import NotPlain, describe, exception_text, plain
from .support import PROBE_TRACE, distinct_settings, matching, parse_settings, settings_key

__all__ = [
    "ENTRY_POINT_GROUP", "KIND_GROUP", "Implementation", "ImplementationError", "Kind", "PythonImplementation",
    "NotRun", "Refused", "SpecRequest", "Unsupported", "BrokenOutput", "RunOutcome", "Stopped", "available_impls",
    "available_kinds", "declared_unsupported", "resolve_impl",
]

ENTRY_POINT_GROUP = "pytest_cbatch.impls"
KIND_GROUP = "pytest_cbatch.kinds"
LIFECYCLE_PARTS = ("PagedKV", "RecomputeRequest", "TransferManager")


class ImplementationError(Exception):
    """The SPEC cannot be resolved to something the kit can run."""


class Refused(Exception):
    """The implementation refused its input (raised, or exited non-zero); ``stack`` is its traceback."""

    def __init__(self, message: str, stack: str = "") -> None:
        super().__init__(message)
        self.stack = stack


class Stopped(Exception):
    """The call was stopped for a limit (``reason``: ``"time"`` or ``"memory"``); ``stack`` is the
    implementation's stack then."""

    def __init__(self, message: str, stack: str = "", reason: str = "time") -> None:
        super().__init__(message)
        self.stack, self.reason = stack, reason


class Unsupported(Exception):
    """The implementation declined the workload as not supported (NotImplementedError, exit 3); whether the
    settings are unsupported is the kit's to find out (``Implementation.run``)."""


class NotRun(Exception):
    """The call was never made: a limit on all of an implementation's calls was used up (the message says
    which)."""


class BrokenOutput(Exception):
    """The implementation claimed success but its output is not a report at all."""


@dataclass
class RunOutcome:
    """What one run produced: a report, or why there is none."""

    report: dict[str, Any] | None
    refused: str | None = None
    unsupported: str | None = None  # its settings are unsupported: the workload is skipped, saying why
    declined: tuple[str, ...] = ()  # with ``unsupported``: the settings it names ("admission=optimistic")
    dodged: str | None = None      # it declined the workload, yet the kit's probe with the same settings ran
    not_run: str | None = None     # the call was never made (a limit on all the calls was used up)
    broken: str | None = None      # exited 0 / returned, but with no JSON document
    mutated: str | None = None     # what the implementation changed in its input, if anything
    seconds: float = 0.0
    stopped: str | None = None     # stopped for a limit: what happened and the option that sets the limit
    stack: str = ""                # the implementation's traceback (a crash) or its stack when stopped


class Implementation:
    """An implementation under test.  Subclasses define ``_call``."""

    spec: str
    source: str          # where it came from, for the report header
    namespace: Any       # the module or object the user pointed at (lifecycle parts live here)
    replay_spec: str = ""  # the SPEC for replay commands: file and folder paths made absolute
    bounds: Bounds | None = None  # the in-process limits of its calls (None: it bounds itself, e.g. a process)
    # The report claims (contract.CLAIMS) this kind may make: none, unless the kind is a live server or the
    # resolver trusts it (an engine adapter registered as an entry point); the report itself never decides.
    claims: frozenset[str] = frozenset()
    breaker: Breaker | None = None  # when set, calls run at a short limit after a run of calls stopped at the limit
    unsupported: tuple[str, ...] = ()  # settings it declares it does not support (``support``)
    _probes: dict[str, str | None] | None = None  # settings_key -> the probe's decline message (None: it ran)

    def replay(self) -> str:
        """The SPEC a replay command should name, valid from any directory."""
        return self.replay_spec or self.spec

    def unsupported_reason(self, config: Mapping[str, Any]) -> str | None:
        """Why ``config`` cannot run here (a missing capability, a declared setting), or None."""
        declared = matching(config, self.unsupported)
        if declared:
            return f"{self.spec} declares it does not support {', '.join(declared)}"
        return None

    def declined_settings(self, config: Mapping[str, Any]) -> tuple[str, ...]:
        """The settings an unsupported ``config`` is skipped for: the declared ones it asks, else those that set
        it apart from the base settings."""
        return tuple(matching(config, self.unsupported) or _distinct(config) or ["the base settings"])

    def run(self, trace: Sequence[Mapping[str, Any]], config: Mapping[str, Any]) -> RunOutcome:
        """Run on deep copies of ``trace`` and ``config`` and report any mutation.

        A workload the implementation declines (``Unsupported``) without having declared its settings is
        settled by the kit's probe with the same settings (``_probe``, once per distinct config): the outcome
        is ``unsupported`` when the probe is declined too, else ``dodged`` (it fails ``completes``).
        """
        reason = self.unsupported_reason(config)
        if reason:
            return RunOutcome(None, unsupported=reason, declined=self.declined_settings(config))
        given_trace, given_config = copy.deepcopy(list(trace)), copy.deepcopy(dict(config))
        start = time.perf_counter()
        try:
            report = self._timed_call(given_trace, given_config)
        except NotRun as exc:
            return RunOutcome(None, not_run=str(exc))
        except Unsupported as exc:
            return self._declined(str(exc), config, time.perf_counter() - start)
        except Refused as exc:
            return RunOutcome(None, refused=str(exc), seconds=time.perf_counter() - start, stack=exc.stack)
        except Stopped as exc:
            return RunOutcome(None, stopped=str(exc), seconds=time.perf_counter() - start, stack=exc.stack)
        except BrokenOutput as exc:
            return RunOutcome(None, broken=str(exc), seconds=time.perf_counter() - start)
        seconds = time.perf_counter() - start
        if report is None:
            return RunOutcome(None, broken="it returned None, not a report", seconds=seconds)
        try:
            report = plain(report)  # the trust boundary: no clause sees anything but plain, bounded data
        except NotPlain as exc:
            return RunOutcome(None, broken=f"what it returned is not plain JSON data: {exc}", seconds=seconds)
        return RunOutcome(report, mutated=_mutation(given_trace, trace, given_config, config), seconds=seconds)

    def _timed_call(self, trace: list[dict[str, Any]], config: dict[str, Any]) -> Any:
        """``_call``, its outcome noted by the breaker (a stop for time, or not)."""
        try:
            report = self._call(trace, config)
        except Stopped as exc:
            self._note(timed_out=exc.reason == "time")
            raise
        except (Refused, BrokenOutput, Unsupported):
            self._note(timed_out=False)
            raise
        self._note(timed_out=False)
        return report

    def _declined(self, message: str, config: Mapping[str, Any], seconds: float) -> RunOutcome:
        """The outcome of a workload declined as unsupported: settled by the probe with its settings."""
        try:
            probe = self._probe(config)
        except NotRun as exc:
            return RunOutcome(None, not_run=f"{exc} (it declined this workload, and the kit's probe of its "
                                            f"settings could not be run)")
        settings = ", ".join(_distinct(config)) or "the base settings"
        if probe is None:
            return RunOutcome(None, dodged=(
                f"it declined a workload whose settings it supports: {message}; the kit's probe with the same "
                f"settings ({settings}) was not declined, so the decline was of this trace, not of a setting "
                f"(support is declared as settings: CBATCH_UNSUPPORTED, or cbatch.toml's unsupported)"),
                seconds=seconds)
        return RunOutcome(None, unsupported=(f"{message} (settings {settings}: the kit's probe with the same "
                                             f"settings was declined as well)"),
                          declined=self.declined_settings(config), seconds=seconds)

    def _probe(self, config: Mapping[str, Any]) -> str | None:
        """The kit's probe with ``config``: its decline message, or None when it was not declined (whatever
        else it did: a crash or a hang on a valid trace is no decline).  Run once per distinct config; NotRun
        when the call could not be made."""
        if self._probes is None:
            self._probes = {}
        cache, key = self._probes, settings_key(config)
        if key not in cache:
            try:
                self._timed_call([dict(line) for line in PROBE_TRACE], copy.deepcopy(dict(config)))
                cache[key] = None
            except Unsupported as exc:
                cache[key] = str(exc)
            except (Refused, Stopped, BrokenOutput):
                cache[key] = None
        return cache[key]

    def _note(self, timed_out: bool) -> None:
        if self.breaker is not None:
            self.breaker.note(timed_out)

    def _time_limit(self, full: float) -> tuple[float, str]:
        """The next call's time limit (``full``, or the breaker's short one) and why it is short ("")."""
        if self.breaker is None:
            return full, ""
        return self.breaker.seconds(full), self.breaker.why_short(full)

    def _call(self, trace: list[dict[str, Any]], config: dict[str, Any]) -> dict[str, Any]:
        raise NotImplementedError

    def describe(self) -> str:
        return f"{self.spec} ({self.source})"


class PythonImplementation(Implementation):
    """An in-process ``simulate(trace, **config)`` callable."""

    def __init__(self, spec: str, target: Any, source: str, bounds: Bounds | None = None) -> None:
        self.spec = spec
        self.source = source
        self.namespace = target
        self.bounds = (Bounds() if bounds is None else bounds).declared(getattr(target, "CBATCH_LIMITS", None))
        fn = target if callable(target) and not inspect.ismodule(target) else getattr(target, "simulate", None)
        if not callable(fn):
            if not any(hasattr(target, part) for part in LIFECYCLE_PARTS):
                raise ImplementationError(
                    f"{source} is not callable and has neither a callable 'simulate' "
                    f"nor any of {', '.join(LIFECYCLE_PARTS)}"
                )
            fn = None  # lifecycle parts only: the scheduler clauses do not apply
        self.fn: Callable[..., Any] | None = fn
        self.accepted, self.open_kwargs = _accepted_keywords(fn) if fn else (set(), False)
        self.unsupported = declared_unsupported(fn, target, source)

    def unsupported_reason(self, config: Mapping[str, Any]) -> str | None:
        if self.fn is None:
            return f"{self.spec} has no simulate(): it offers lifecycle parts only"
        missing = [] if self.open_kwargs else sorted(set(config) - self.accepted)
        if missing:
            return f"{self.spec} does not accept the setting(s) {', '.join(missing)} (capability missing)"
        return Implementation.unsupported_reason(self, config)

    def declined_settings(self, config: Mapping[str, Any]) -> tuple[str, ...]:
        missing = [] if self.open_kwargs else sorted(set(config) - self.accepted)
        return tuple(missing) or Implementation.declined_settings(self, config)

    def _call(self, trace: list[dict[str, Any]], config: dict[str, Any]) -> dict[str, Any]:
        assert self.fn is not None  # run() checks unsupported_reason first
        seconds, why = self._time_limit(self.bounds.seconds if self.bounds else 0.0)
        bounds = replace(self.bounds, seconds=seconds) if self.bounds is not None and why else self.bounds
        try:
            report = bounded.call(self.fn, trace, bounds=bounds, **config)
        except bounded.CallStopped as exc:
            raise Stopped(str(exc) + (why if exc.reason == "time" else ""), exc.stack, exc.reason) from None
        except NotImplementedError as exc:
            raise Unsupported(f"{self.spec} raised {_crash(exc, self.bounds)[0]}") from None
        except Exception as exc:
            raise Refused(*_crash(exc, self.bounds)) from None
        return report

    def describe(self) -> str:
        return f"{self.spec} ({self.source}; {self.bounds.describe() if self.bounds else 'unbounded'})"


def _distinct(config: Mapping[str, Any]) -> list[str]:
    """The settings of ``config`` beyond the base ones (``support.distinct_settings``)."""
    from .workloads import BASE_CONFIG  # here, not at the top: the sandbox child imports this module, not the reference

    return distinct_settings(config, BASE_CONFIG)


def declared_unsupported(fn: Any, target: Any, source: str) -> tuple[str, ...]:
    """The settings ``CBATCH_UNSUPPORTED`` of ``fn`` (else of ``target``, its module or object) names
    (``support.parse_settings``); ImplementationError, naming ``source``, when it is not such a list."""
    for owner in (fn, target):
        value = getattr(owner, "CBATCH_UNSUPPORTED", None) if owner is not None else None
        if value is not None:
            try:
                return parse_settings(value, f"{source}: CBATCH_UNSUPPORTED")
            except ValueError as exc:
                raise ImplementationError(str(exc)) from None
    return ()


def _crash(exc: BaseException, bounds: Bounds | None) -> tuple[str, str]:
    """The message and traceback of an exception the implementation raised.  Its ``__str__`` is the
    implementation's code, so they are read under the call's bounds; what cannot be read is said so."""
    try:
        return bounded.call(lambda: (exception_text(exc), bounded.crash_traceback(exc)), bounds=bounds)
    except (bounded.CallStopped, Exception) as failure:
        return f"{describe(exc)} (its message could not be read: {exception_text(failure)})", ""


def _mutation(given_trace: Any, trace: Sequence[Mapping[str, Any]], given_config: Any,
              config: Mapping[str, Any]) -> str | None:
    """What the implementation changed in its copies of the input, or None; what it wrote there is
    untrusted too, so it is compared only once it is plain data."""
    try:
        given_trace, given_config = plain(given_trace), plain(given_config)
    except NotPlain as exc:
        return f"it wrote something other than plain data into its input: {exc}"
    if given_trace != list(trace):
        first = next((i for i, (a, b) in enumerate(zip(given_trace, trace)) if a != b), min(len(trace), len(given_trace)))
        return f"trace line {first} changed" if first < len(trace) else "trace length changed"
    if given_config != dict(config):
        return "config changed"
    return None


def _accepted_keywords(fn: Callable[..., Any]) -> tuple[set[str], bool]:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return set(), True
    accepted = {p.name for p in params if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)}
    return accepted, any(p.kind is p.VAR_KEYWORD for p in params)


@dataclass(frozen=True)
class SpecRequest:
    """What a kind is asked to claim and build: the SPEC and the front end's settings for it.

    ``bounds`` limits every call (in process for Python kinds, the process's time limit for
    ``exec:``, each request's for ``http:``); ``rootdir`` is where relative paths start (None:
    the working directory); ``tick_seconds`` is one trace tick on a live server; ``model`` is the
    model a live server is asked for (None: the one it lists); ``option`` names the SPEC in
    messages (``--cbatch-impl`` under pytest, ``--impl`` for ``cbatch check``).
    """

    spec: str
    bounds: Bounds
    rootdir: str | None = None
    tick_seconds: float = 0.05
    model: str | None = None
    option: str = "--cbatch-impl"


@dataclass(frozen=True)
class Kind:
    """One form of SPEC, registered as an entry point in :data:`KIND_GROUP`.

    Kinds are asked in ``order`` (lower first; the built-in ones use 100 to 800, see
    ``docs/kinds.md``), ties by entry-point name; the first whose ``claims`` is true builds the
    implementation with ``build``, which raises :class:`ImplementationError` (one line, for a
    person) when the SPEC is of its form but unusable.  ``claims`` must be cheap and import
    nothing heavy; ``build`` may import the kind's transport.  ``form`` is the SPEC's shape for
    the usage message ("" to list none).
    """

    order: int
    form: str
    claims: Callable[[SpecRequest], bool]
    build: Callable[[SpecRequest], Implementation]


def available_impls() -> dict[str, str]:
    """Entry-point names in ``pytest_cbatch.impls`` mapped to their targets."""
    return {ep.name: ep.value for ep in entry_points(group=ENTRY_POINT_GROUP)}


def available_kinds() -> list[tuple[str, Kind]]:
    """The kinds registered in :data:`KIND_GROUP`, as ``(entry-point name, kind)`` in the order they are asked.

    ImplementationError names an entry point that does not load or is no kind, and says so when
    none is registered (an install older than the registry).
    """
    found = []
    for ep in entry_points(group=KIND_GROUP):
        try:
            kind = ep.load()
        except Exception as exc:  # a third party's broken kind: one usage error naming it
            raise ImplementationError(f"the implementation kind {ep.name!r} ({ep.value}, entry point group "
                                      f"{KIND_GROUP}) does not load: {type(exc).__name__}: {exc}") from exc
        if not (isinstance(getattr(kind, "order", None), int) and callable(getattr(kind, "claims", None))
                and callable(getattr(kind, "build", None)) and isinstance(getattr(kind, "form", None), str)):
            raise ImplementationError(f"the implementation kind {ep.name!r} ({ep.value}) is not a "
                                      f"pytest_cbatch.impls.Kind (order, form, claims, build)")
        found.append((kind.order, ep.name, kind))
    if not found:
        raise ImplementationError(f"no implementation kinds are registered (entry point group {KIND_GROUP}): "
                                  f"this install of pytest-cbatch predates them; reinstall it "
                                  f"(pip install -e . in a checkout)")
    return [(name, kind) for _, name, kind in sorted(found, key=lambda item: item[:2])]


def resolve_impl(spec: str, *, timeout: float = bounded.DEFAULT_SECONDS, rootdir: str | None = None,
                 tick_seconds: float = 0.05, bounds: Bounds | None = None, model: str | None = None,
                 option: str = "--cbatch-impl") -> Implementation:
    """Turn a SPEC string into an Implementation through the first kind that claims it.

    ImplementationError says why not, naming the SPEC as ``option``.  ``bounds`` limits every
    call (default: ``Bounds(seconds=timeout)``); the other arguments are :class:`SpecRequest`'s.
    """
    spec = spec.strip()
    if not spec:
        raise ImplementationError(f"{option} is empty")
    request = SpecRequest(spec, Bounds(seconds=timeout) if bounds is None else bounds, rootdir, tick_seconds,
                          model, option)
    try:
        kinds = available_kinds()
        for name, kind in kinds:
            try:
                claimed = kind.claims(request)
            except Exception as exc:  # a third party's kind that breaks on this SPEC: name it
                raise ImplementationError(f"the implementation kind {name!r} failed to read it: "
                                          f"{type(exc).__name__}: {exc}") from exc
            if claimed:
                return kind.build(request)
        raise ImplementationError(_unknown_spec_message(kinds))
    except ImplementationError as exc:
        raise ImplementationError(f"{option} {spec!r}: {exc}") from exc.__cause__


def _unknown_spec_message(kinds: Sequence[tuple[str, Kind]]) -> str:
    names = ", ".join(sorted(available_impls())) or "(none installed)"
    forms = list(dict.fromkeys(kind.form for _, kind in kinds if kind.form))
    return (
        f"not an installed implementation, a file, a folder or an importable module.\n"
        f"  installed ({ENTRY_POINT_GROUP} entry points): {names}\n"
        f"  or give one of: {' | '.join(forms)}"
    )
