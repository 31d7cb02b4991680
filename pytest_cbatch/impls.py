"""Resolving ``--cbatch-impl SPEC`` to an implementation the kit can run.

SPEC forms, tried in this order:

* ``http://HOST:PORT[/v1]`` — a live OpenAI-compatible server (the ``live`` extra).
* ``exec:COMMAND`` — any language: the kit writes ``{"trace": [...], "config":
  {...}}`` as JSON on the command's stdin and reads the report JSON from its
  stdout.  Exit 0 means a report; exit 3 means "setting not supported" (stderr
  is the reason; the test is skipped); any other non-zero exit means the input
  was refused (stderr is the message).  Runs under a timeout.
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
``NotImplementedError`` also means "not supported".
"""

from __future__ import annotations

import copy
import importlib
import importlib.util
import inspect
import json
import os
import shlex
import subprocess
import sys
import time
import types
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

__all__ = [
    "ENTRY_POINT_GROUP", "Implementation", "ImplementationError", "Refused", "Unsupported",
    "BrokenOutput", "RunOutcome", "available_impls", "resolve_impl",
]

ENTRY_POINT_GROUP = "pytest_cbatch.impls"
LIFECYCLE_PARTS = ("PagedKV", "RecomputeRequest", "TransferManager")


class ImplementationError(Exception):
    """The SPEC cannot be resolved to something the kit can run."""


class Refused(Exception):
    """The implementation refused its input (raised, or exited non-zero)."""


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


class Implementation:
    """An implementation under test.  Subclasses define ``_call``."""

    spec: str
    source: str          # where it came from, for the report header
    namespace: Any       # the module or object the user pointed at (lifecycle parts live here)
    replay_spec: str = ""  # the SPEC for replay commands: file and folder paths made absolute

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
        given_trace, given_config = copy.deepcopy(list(trace)), copy.deepcopy(dict(config))
        start = time.perf_counter()
        try:
            report = self._call(given_trace, given_config)
        except Unsupported as exc:
            return RunOutcome(None, unsupported=str(exc))
        except Refused as exc:
            return RunOutcome(None, refused=str(exc), seconds=time.perf_counter() - start)
        except BrokenOutput as exc:
            return RunOutcome(None, broken=str(exc), seconds=time.perf_counter() - start)
        seconds = time.perf_counter() - start
        mutated = None
        if given_trace != list(trace):
            first = next((i for i, (a, b) in enumerate(zip(given_trace, trace)) if a != b), min(len(trace), len(given_trace)))
            mutated = f"trace line {first} changed" if first < len(trace) else "trace length changed"
        elif given_config != dict(config):
            mutated = "config changed"
        return RunOutcome(report, mutated=mutated, seconds=seconds)

    def _call(self, trace: list[dict[str, Any]], config: dict[str, Any]) -> dict[str, Any]:
        raise NotImplementedError

    def describe(self) -> str:
        return f"{self.spec} ({self.source})"


class PythonImplementation(Implementation):
    """An in-process ``simulate(trace, **config)`` callable."""

    def __init__(self, spec: str, target: Any, source: str) -> None:
        self.spec = spec
        self.source = source
        self.namespace = target
        fn = target if callable(target) and not inspect.ismodule(target) else getattr(target, "simulate", None)
        if not callable(fn):
            if not any(hasattr(target, part) for part in LIFECYCLE_PARTS):
                raise ImplementationError(
                    f"--cbatch-impl {spec}: {source} is not callable and has neither a callable 'simulate' "
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
            report = self.fn(trace, **config)
        except NotImplementedError as exc:
            raise Unsupported(f"{self.spec} raised NotImplementedError: {exc}") from exc
        except Exception as exc:
            raise Refused(f"{type(exc).__name__}: {exc}") from exc
        return report


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

    def __init__(self, spec: str, command: str, timeout: float) -> None:
        self.spec = spec
        self.argv = shlex.split(command)
        if not self.argv:
            raise ImplementationError("--cbatch-impl exec: needs a command, e.g. exec:'./my-scheduler --json'")
        self.timeout = timeout
        self.source = f"subprocess {command!r}, timeout {timeout:g}s"
        self.namespace = None

    def _call(self, trace: list[dict[str, Any]], config: dict[str, Any]) -> dict[str, Any]:
        payload = json.dumps({"trace": trace, "config": config})
        try:
            proc = subprocess.run(
                self.argv, input=payload, capture_output=True, text=True, timeout=self.timeout,
            )
        except subprocess.TimeoutExpired:
            raise Refused(f"timed out after {self.timeout:g}s (--cbatch-timeout)") from None
        except OSError as exc:
            raise Refused(f"could not start {self.argv[0]!r}: {exc}") from None
        message = proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else "(no message on stderr)"
        if proc.returncode == self.UNSUPPORTED_EXIT:
            raise Unsupported(f"{self.spec} exited 3 (unsupported): {message}")
        if proc.returncode != 0:
            raise Refused(f"exit status {proc.returncode}: {message}")
        try:
            return json.loads(proc.stdout)
        except json.JSONDecodeError as exc:
            raise BrokenOutput(f"stdout is not JSON ({exc.msg} at line {exc.lineno}): "
                                  f"{proc.stdout[:200]!r}") from None


def available_impls() -> dict[str, str]:
    """Entry-point names in ``pytest_cbatch.impls`` mapped to their targets."""
    from importlib.metadata import entry_points

    return {ep.name: ep.value for ep in entry_points(group=ENTRY_POINT_GROUP)}


def resolve_impl(spec: str, *, timeout: float = 60.0, rootdir: str | None = None,
                 tick_seconds: float = 0.05) -> Implementation:
    """Turn a SPEC string into an Implementation; ImplementationError says why not.

    ``http://`` and ``https://`` SPECs are live servers (``pytest_cbatch.live.replay``, needs the
    ``live`` extra); ``tick_seconds`` is how long one trace tick lasts there and ``timeout``
    bounds each request.
    """
    spec = spec.strip()
    if not spec:
        raise ImplementationError("--cbatch-impl is empty")
    if spec.startswith(("http://", "https://")):
        from .live.replay import HttpImplementation

        return HttpImplementation(spec, tick_seconds=tick_seconds, timeout=timeout)
    if spec.startswith("exec:"):
        return ExecImplementation(spec, spec[len("exec:"):], timeout)
    if spec.endswith(".py"):
        return _with_replay(PythonImplementation(spec, _load_file(spec, spec, rootdir), f"file {spec}"),
                            spec, rootdir)
    if ":" in spec:
        where, _, attr = spec.rpartition(":")
        if where.endswith(".py"):
            impl = PythonImplementation(spec, _load_file_attr(spec, where, attr, rootdir), f"file {where}")
            return _with_replay(impl, where, rootdir, ":" + attr)
        return PythonImplementation(spec, _import_attr(spec, where, attr), f"module {where}")
    looks_like_path = "/" in spec or os.sep in spec
    if looks_like_path and os.path.isdir(_resolve_path(spec, spec, rootdir)):
        return _with_replay(PythonImplementation(spec, _load_folder(spec, spec, rootdir), f"folder {spec}"),
                            spec, rootdir)
    impls = available_impls()
    if spec in impls:
        target = impls[spec]
        module, _, attr = target.partition(":")
        obj = _import_attr(spec, module, attr) if attr else _import_module(spec, module)
        return PythonImplementation(spec, obj, f"entry point {spec} = {target}")
    if os.path.isdir(_resolve_path(spec, spec, rootdir)):
        return _with_replay(PythonImplementation(spec, _load_folder(spec, spec, rootdir), f"folder {spec}"),
                            spec, rootdir)
    if all(part.isidentifier() for part in spec.split(".")) and importlib.util.find_spec(spec.split(".")[0]):
        return PythonImplementation(spec, _import_module(spec, spec), f"module {spec}")
    raise ImplementationError(_unknown_spec_message(spec, impls))


def _with_replay(impl: Implementation, path: str, rootdir: str | None, suffix: str = "") -> Implementation:
    impl.replay_spec = os.path.abspath(_resolve_path(impl.spec, path, rootdir)) + suffix
    return impl


def _unknown_spec_message(spec: str, impls: Mapping[str, str]) -> str:
    names = ", ".join(sorted(impls)) or "(none installed)"
    return (
        f"--cbatch-impl {spec!r} is not an installed implementation.\n"
        f"  installed ({ENTRY_POINT_GROUP} entry points): {names}\n"
        f"  or give one of: package.module[:attr] | path/to/file.py[:attr] | path/to/folder/ | "
        f"http://HOST:PORT | exec:COMMAND"
    )


def _import_module(spec: str, name: str) -> Any:
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        raise ImplementationError(f"--cbatch-impl {spec}: cannot import {name!r}: {exc}") from exc
    except Exception as exc:  # the module itself is broken: still one clear usage error
        raise ImplementationError(f"--cbatch-impl {spec}: importing {name!r} failed: "
                                  f"{type(exc).__name__}: {exc}") from exc


def _import_attr(spec: str, module: str, attr: str) -> Any:
    obj = _import_module(spec, module)
    return _get_attr(spec, obj, attr, f"module {module!r}")


def _get_attr(spec: str, obj: Any, attr: str, where: str) -> Any:
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ImplementationError(f"--cbatch-impl {spec}: {where} has no attribute {part!r}")
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
                    raise ImplementationError(f"--cbatch-impl {spec}: cannot load {stem}.py as Python")
                module = importlib.util.module_from_spec(loader_spec)
                sys.modules[stem] = module
                loader_spec.loader.exec_module(module)
            modules.append(module)
    except ImplementationError:
        raise
    except (Exception, SystemExit) as exc:  # a broken or exiting file: still one clear usage error
        raise ImplementationError(f"--cbatch-impl {spec}: importing {os.path.join(folder, stem + '.py')!r} "
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
        raise ImplementationError(f"--cbatch-impl {spec}: no such file {path!r}")
    stem = os.path.splitext(os.path.basename(full))[0]
    return _load_from_folder(spec, os.path.dirname(os.path.abspath(full)), [stem])[0]


def _load_file_attr(spec: str, path: str, attr: str, rootdir: str | None) -> Any:
    return _get_attr(spec, _load_file(spec, path, rootdir), attr, f"file {path!r}")


def _load_folder(spec: str, path: str, rootdir: str | None) -> Any:
    """A submission folder in the course's layout: scheduler_sim.py and/or scheduler_faults.py."""
    folder = _resolve_path(spec, path, rootdir)
    stems = [stem for stem in STUDENT_FILES if os.path.isfile(os.path.join(folder, stem + ".py"))]
    if not stems:
        raise ImplementationError(f"--cbatch-impl {spec}: the folder holds neither "
                                  f"{' nor '.join(s + '.py' for s in STUDENT_FILES)}")
    merged = types.SimpleNamespace()
    for module in _load_from_folder(spec, folder, stems):  # scheduler_faults last: its names win
        merged.__dict__.update({k: v for k, v in vars(module).items() if not k.startswith("__")})
    merged.__name__ = f"folder {path}"
    return merged
