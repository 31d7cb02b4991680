"""Resolving ``--cbatch-impl SPEC`` to an implementation the kit can run.

SPEC forms, tried in this order:

* ``http://HOST:PORT[/v1]`` — a live OpenAI-compatible server (the ``live`` extra).
* ``exec:COMMAND`` — any language: the kit writes ``{"trace": [...], "config":
  {...}}`` as JSON on the command's stdin and reads the report JSON from its
  stdout.  Exit 0 means a report; exit 3 means "setting not supported" (stderr
  is the reason; the test is skipped); any other non-zero exit means the input
  was refused (stderr is the message).  Runs in a new process session under
  the time limit; on a timeout the whole session (the command and every
  process it started) is killed, and so is anything it leaves behind.
* ``path/to/file.py`` — that file as a module, loaded without installing it;
  ``path/to/file.py:attr`` — an object in it.  The file's folder is first on
  sys.path while it is imported, so ``from scheduler_sim import PagedKV``
  beside it finds the sibling file.
* ``package.module:attr`` — an importable object.
* ``path/to/folder`` — a submission in the course's layout: its
  ``scheduler_sim.py`` and/or ``scheduler_faults.py``, merged.
* ``NAME`` — an entry point in the group ``pytest_cbatch.impls`` (engines
  register themselves); ``reference`` is the built-in one.  A bare name that
  is no entry point may still be a folder, then a module.
* ``package.module`` — that module.

A Python implementation is a callable ``simulate(trace, **config) -> report``,
or a module or object with a ``simulate`` attribute.  Its capabilities come
from its signature: a config key it does not accept (and no ``**kwargs``)
makes workloads that need it skip with the reason.  Raising
``NotImplementedError`` also means "not supported".  Every call runs under
``bounded.call`` (a time and a memory limit, ``Bounds``); a call stopped
there, or an ``exec:`` command past its time limit, is a ``Stopped`` outcome.
A module may declare its own limits for those the user left at their default,
``CBATCH_LIMITS = {"seconds": 900, "memory_mib": 0}`` (an engine that starts
on its first call, say).
"""

from __future__ import annotations

import copy
import importlib
import importlib.util
import inspect
import json
import os
import shlex
import signal
import subprocess
import sys
import time
import types
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from . import bounded
from .bounded import Bounds
from .breaker import Breaker
from .plain import NotPlain, describe, exception_text, loads, plain

__all__ = [
    "ENTRY_POINT_GROUP", "Implementation", "ImplementationError", "Refused", "Unsupported",
    "BrokenOutput", "RunOutcome", "Stopped", "available_impls", "resolve_impl",
]

ENTRY_POINT_GROUP = "pytest_cbatch.impls"
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
    """The implementation does not support a setting the workload needs."""


class BrokenOutput(Exception):
    """The implementation claimed success but its output is not a report at all."""


@dataclass
class RunOutcome:
    """What one run produced: a report, or why there is none."""

    report: dict[str, Any] | None
    refused: str | None = None
    unsupported: str | None = None
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
    breaker: Breaker | None = None  # when set, calls fail at once after a run of calls stopped at the time limit

    def replay(self) -> str:
        """The SPEC a replay command should name, valid from any directory."""
        return self.replay_spec or self.spec

    def unsupported_reason(self, config: Mapping[str, Any]) -> str | None:
        """Why ``config`` cannot run here (a missing capability), or None."""
        return None

    def run(self, trace: Sequence[Mapping[str, Any]], config: Mapping[str, Any]) -> RunOutcome:
        """Run on deep copies of ``trace`` and ``config`` and report any mutation."""
        reason = self.unsupported_reason(config)
        if reason:
            return RunOutcome(None, unsupported=reason)
        if self.breaker is not None and self.breaker.tripped:
            return RunOutcome(None, stopped=self.breaker.tripped)
        given_trace, given_config = copy.deepcopy(list(trace)), copy.deepcopy(dict(config))
        start = time.perf_counter()
        try:
            report = self._call(given_trace, given_config)
        except Unsupported as exc:
            return RunOutcome(None, unsupported=str(exc))
        except Refused as exc:
            self._note(timed_out=False)
            return RunOutcome(None, refused=str(exc), seconds=time.perf_counter() - start, stack=exc.stack)
        except Stopped as exc:
            self._note(timed_out=exc.reason == "time")
            return RunOutcome(None, stopped=str(exc), seconds=time.perf_counter() - start, stack=exc.stack)
        except BrokenOutput as exc:
            self._note(timed_out=False)
            return RunOutcome(None, broken=str(exc), seconds=time.perf_counter() - start)
        self._note(timed_out=False)
        seconds = time.perf_counter() - start
        if report is None:
            return RunOutcome(None, broken="it returned None, not a report", seconds=seconds)
        try:
            report = plain(report)  # the trust boundary: no clause sees anything but plain, bounded data
        except NotPlain as exc:
            return RunOutcome(None, broken=f"what it returned is not plain JSON data: {exc}", seconds=seconds)
        return RunOutcome(report, mutated=_mutation(given_trace, trace, given_config, config), seconds=seconds)

    def _note(self, timed_out: bool) -> None:
        if self.breaker is not None:
            self.breaker.note(timed_out)

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

    def unsupported_reason(self, config: Mapping[str, Any]) -> str | None:
        if self.fn is None:
            return f"{self.spec} has no simulate(): it offers lifecycle parts only"
        if self.open_kwargs:
            return None
        missing = sorted(set(config) - self.accepted)
        if missing:
            return f"{self.spec} does not accept the setting(s) {', '.join(missing)} (capability missing)"
        return None

    def _call(self, trace: list[dict[str, Any]], config: dict[str, Any]) -> dict[str, Any]:
        assert self.fn is not None  # run() checks unsupported_reason first
        try:
            report = bounded.call(self.fn, trace, bounds=self.bounds, **config)
        except bounded.CallStopped as exc:
            raise Stopped(str(exc), exc.stack, exc.reason) from None
        except NotImplementedError as exc:
            raise Unsupported(f"{self.spec} raised {_crash(exc, self.bounds)[0]}") from None
        except Exception as exc:
            raise Refused(*_crash(exc, self.bounds)) from None
        return report

    def describe(self) -> str:
        return f"{self.spec} ({self.source}; {self.bounds.describe() if self.bounds else 'unbounded'})"


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


class ExecImplementation(Implementation):
    """A subprocess speaking JSON on stdin and stdout (any language)."""

    UNSUPPORTED_EXIT = 3

    def __init__(self, spec: str, command: str, limits: Bounds) -> None:
        self.spec = spec
        self.argv = shlex.split(command)
        if not self.argv:
            raise ImplementationError("exec: needs a command, e.g. exec:'./my-scheduler --json'")
        self.limits = limits
        self.source = f"subprocess {command!r}, " + (f"timeout {limits.seconds:g} s" if limits.seconds > 0
                                                      else "no timeout")
        self.namespace = None

    def _call(self, trace: list[dict[str, Any]], config: dict[str, Any]) -> dict[str, Any]:
        payload = json.dumps({"trace": trace, "config": config}).encode("utf-8")
        seconds = self.limits.seconds
        try:
            proc = subprocess.Popen(self.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    start_new_session=True)
        except OSError as exc:
            raise Refused(f"could not start {self.argv[0]!r}: {exc}") from None
        try:
            stdout, stderr = proc.communicate(payload, timeout=seconds if seconds > 0 else None)
        except subprocess.TimeoutExpired:
            _kill_session(proc)
            raise Stopped(f"did not finish within {seconds:g} s ({self.limits.time_option}={seconds:g} changes "
                          f"the limit; 0 disables it); its process session was killed") from None
        finally:
            _kill_session(proc)  # whatever it left running in its session
        return exec_report(self.spec, proc.returncode, stdout, stderr)


STDERR_LINES = 15
"""How many of an ``exec:`` program's last stderr lines a failure shows (a crash's traceback, not only the
last line, which for Node is its version banner)."""


def stderr_tail(stderr: bytes, lines: int = STDERR_LINES, width: int = 300) -> str:
    """The last ``lines`` non-blank lines of a program's stderr, each cut to ``width`` characters, bytes
    that are not UTF-8 replaced; "(no message on stderr)" when there is none."""
    text = stderr[-64 * 1024:].decode("utf-8", "replace")
    tail = [line if len(line) <= width else line[:width - 3] + "..." for line in text.splitlines() if line.strip()]
    return "\n".join(tail[-lines:]) if tail else "(no message on stderr)"


def exec_report(spec: str, returncode: int, stdout: bytes, stderr: bytes) -> Any:
    """The report an ``exec:`` program's exit status and output amount to, or the exception that says why
    there is none (Unsupported for exit 3, Refused for another non-zero exit, BrokenOutput for stdout
    that is not JSON); the document is plain data (``plain.loads``)."""
    if returncode == ExecImplementation.UNSUPPORTED_EXIT:
        raise Unsupported(f"{spec} exited 3 (unsupported): {stderr_tail(stderr, 1)}")
    if returncode != 0:
        raise Refused(f"exit status {returncode}: {stderr_tail(stderr, 1)}", stderr_tail(stderr))
    try:
        return loads(stdout)
    except NotPlain as exc:
        what = f"holds at {exc.path} {exc.problem}" if exc.path else f"is {exc.problem}"
        raise BrokenOutput(f"stdout {what}: {stdout[:200]!r}") from None


def _kill_session(proc: subprocess.Popen[str]) -> None:
    """SIGKILL the process session ``proc`` leads (it started one), then reap ``proc`` and close its pipes."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    if proc.returncode is None:
        try:
            proc.communicate(timeout=5)
        except (subprocess.TimeoutExpired, ValueError):
            proc.kill()
            proc.wait()


def available_impls() -> dict[str, str]:
    """Entry-point names in ``pytest_cbatch.impls`` mapped to their targets."""
    from importlib.metadata import entry_points

    return {ep.name: ep.value for ep in entry_points(group=ENTRY_POINT_GROUP)}


def resolve_impl(spec: str, *, timeout: float = bounded.DEFAULT_SECONDS, rootdir: str | None = None,
                 tick_seconds: float = 0.05, bounds: Bounds | None = None,
                 option: str = "--cbatch-impl") -> Implementation:
    """Turn a SPEC string into an Implementation; ImplementationError says why not.

    ``bounds`` limits every call (default: ``Bounds(seconds=timeout)``): in process for Python
    SPECs, as the process's time limit for ``exec:``.  ``http://`` and ``https://`` SPECs are
    live servers (``pytest_cbatch.live.replay``, needs the ``live`` extra); ``tick_seconds`` is how
    long one trace tick lasts there and the time limit bounds each request.  Error messages name
    the SPEC as ``option`` (the front end's flag: ``--cbatch-impl`` under pytest, ``--impl`` for
    ``cbatch check``).
    """
    spec = spec.strip()
    if not spec:
        raise ImplementationError(f"{option} is empty")
    limits = Bounds(seconds=timeout) if bounds is None else bounds
    try:
        return _resolve(spec, limits, rootdir, tick_seconds)
    except ImplementationError as exc:
        raise ImplementationError(f"{option} {spec!r}: {exc}") from exc.__cause__


def _resolve(spec: str, limits: Bounds, rootdir: str | None, tick_seconds: float) -> Implementation:
    if spec.startswith(("http://", "https://")):
        from .live.replay import HttpImplementation

        return HttpImplementation(spec, tick_seconds=tick_seconds, timeout=limits.seconds or 86400.0)
    if spec.startswith("exec:"):
        return ExecImplementation(spec, spec[len("exec:"):], limits)
    def python(target: Any, source: str) -> PythonImplementation:
        return PythonImplementation(spec, target, source, limits)

    if spec.endswith(".py"):
        return _with_replay(python(_load_file(spec, spec, rootdir), f"file {spec}"), spec, rootdir)
    if ":" in spec:
        where, _, attr = spec.rpartition(":")
        if where.endswith(".py"):
            impl = python(_load_file_attr(spec, where, attr, rootdir), f"file {where}")
            return _with_replay(impl, where, rootdir, ":" + attr)
        return python(_import_attr(spec, where, attr), f"module {where}")
    looks_like_path = "/" in spec or os.sep in spec
    if looks_like_path:  # no module or entry-point name holds a slash
        full = _resolve_path(spec, spec, rootdir)
        if os.path.isfile(full):
            raise ImplementationError(f"{spec!r} is a file but not a .py file; give a Python file, a submission "
                                      f"folder, or exec:COMMAND to run a program")
        if not os.path.isdir(full):
            raise ImplementationError(f"no such folder {spec!r}" + (
                f" (looked in {rootdir})" if rootdir and not os.path.isabs(spec) else ""))
        return _with_replay(python(_load_folder(spec, spec, rootdir), f"folder {spec}"), spec, rootdir)
    impls = available_impls()
    if spec in impls:
        target = impls[spec]
        module, _, attr = target.partition(":")
        obj = _import_attr(spec, module, attr) if attr else _import_module(spec, module)
        return python(obj, f"entry point {spec} = {target}")
    if os.path.isdir(_resolve_path(spec, spec, rootdir)):
        return _with_replay(python(_load_folder(spec, spec, rootdir), f"folder {spec}"), spec, rootdir)
    if all(part.isidentifier() for part in spec.split(".")) and importlib.util.find_spec(spec.split(".")[0]):
        return python(_import_module(spec, spec), f"module {spec}")
    raise ImplementationError(_unknown_spec_message(impls))


def _with_replay(impl: Implementation, path: str, rootdir: str | None, suffix: str = "") -> Implementation:
    impl.replay_spec = os.path.abspath(_resolve_path(impl.spec, path, rootdir)) + suffix
    return impl


def _unknown_spec_message(impls: Mapping[str, str]) -> str:
    names = ", ".join(sorted(impls)) or "(none installed)"
    return (
        f"not an installed implementation, a file, a folder or an importable module.\n"
        f"  installed ({ENTRY_POINT_GROUP} entry points): {names}\n"
        f"  or give one of: package.module[:attr] | path/to/file.py[:attr] | path/to/folder/ | "
        f"http://HOST:PORT | exec:COMMAND"
    )


def _import_module(spec: str, name: str) -> Any:
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        raise ImplementationError(f"cannot import {name!r}: {exc}") from exc
    except Exception as exc:  # the module itself is broken: still one clear usage error
        raise ImplementationError(f"importing {name!r} failed: "
                                  f"{type(exc).__name__}: {exc}") from exc


def _import_attr(spec: str, module: str, attr: str) -> Any:
    obj = _import_module(spec, module)
    return _get_attr(spec, obj, attr, f"module {module!r}")


def _get_attr(spec: str, obj: Any, attr: str, where: str) -> Any:
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ImplementationError(f"{where} has no attribute {part!r}")
        obj = getattr(obj, part)
    return obj


STUDENT_FILES = ("scheduler_sim", "scheduler_faults")
_LOADED: dict[tuple[str, tuple[str, ...]], list[Any]] = {}


def _load_from_folder(spec: str, folder: str, stems: Sequence[str]) -> list[Any]:
    """Import ``folder/<stem>.py`` for each stem, under its own name, with the folder first on sys.path.

    So ``from scheduler_sim import PagedKV`` in a sibling file finds the file beside
    it (the very module loaded here), whatever else this process has imported under
    that name.  Afterwards sys.modules is as it was: two submissions loaded into one
    process never see each other's modules.
    """
    key = (os.path.abspath(folder), tuple(stems))
    if key in _LOADED:
        return _LOADED[key]
    folder = key[0]
    before = dict(sys.modules)
    for stem in stems:
        sys.modules.pop(stem, None)
    sys.path.insert(0, folder)
    modules = []
    try:
        for stem in stems:
            module = sys.modules.get(stem)  # a sibling may already have imported it
            if module is None:
                loader_spec = importlib.util.spec_from_file_location(stem, os.path.join(folder, stem + ".py"))
                if loader_spec is None or loader_spec.loader is None:
                    raise ImplementationError(f"cannot load {stem}.py as Python")
                module = importlib.util.module_from_spec(loader_spec)
                sys.modules[stem] = module
                loader_spec.loader.exec_module(module)
            modules.append(module)
    except ImplementationError:
        raise
    except (Exception, SystemExit) as exc:  # a broken or exiting file: still one clear usage error
        raise ImplementationError(f"importing {os.path.join(folder, stem + '.py')!r} "
                                  f"failed: {type(exc).__name__}: {exc}") from exc
    finally:
        sys.path.remove(folder)
        for name in [n for n in sys.modules if n not in before or sys.modules[n] is not before[n]]:
            origin = getattr(sys.modules[name], "__file__", None)
            if name in stems or (origin and os.path.abspath(origin).startswith(folder + os.sep)):
                del sys.modules[name]
        sys.modules.update({name: mod for name, mod in before.items() if name in stems})
    _LOADED[key] = modules
    return modules


def _resolve_path(spec: str, path: str, rootdir: str | None) -> str:
    return path if os.path.isabs(path) or rootdir is None else os.path.join(rootdir, path)


def _load_file(spec: str, path: str, rootdir: str | None) -> Any:
    full = _resolve_path(spec, path, rootdir)
    if not os.path.isfile(full):
        raise ImplementationError(f"no such file {path!r}")
    stem = os.path.splitext(os.path.basename(full))[0]
    return _load_from_folder(spec, os.path.dirname(os.path.abspath(full)), [stem])[0]


def _load_file_attr(spec: str, path: str, attr: str, rootdir: str | None) -> Any:
    return _get_attr(spec, _load_file(spec, path, rootdir), attr, f"file {path!r}")


def _load_folder(spec: str, path: str, rootdir: str | None) -> Any:
    """A submission folder in the course's layout: scheduler_sim.py and/or scheduler_faults.py."""
    folder = _resolve_path(spec, path, rootdir)
    stems = [stem for stem in STUDENT_FILES if os.path.isfile(os.path.join(folder, stem + ".py"))]
    if not stems:
        raise ImplementationError(f"the folder holds neither "
                                  f"{' nor '.join(s + '.py' for s in STUDENT_FILES)}")
    merged = types.SimpleNamespace()
    for module in _load_from_folder(spec, folder, stems):  # scheduler_faults last: its names win
        merged.__dict__.update({k: v for k, v in vars(module).items() if not k.startswith("__")})
    merged.__name__ = f"folder {path}"
    return merged
