"""Resolving ``--cbatch-impl SPEC`` to an implementation the kit can run.

SPEC forms, tried in this order:

* ``exec:COMMAND`` — any language: the kit writes ``{"trace": [...], "config":
  {...}}`` as JSON on the command's stdin and reads the report JSON from its
  stdout.  Exit 0 means a report; exit 3 means "setting not supported" (stderr
  is the reason; the test is skipped); any other non-zero exit means the input
  was refused (stderr is the message).  Runs under a timeout.
* ``path/to/file.py:attr`` — a Python file loaded without installing it.
* ``package.module:attr`` — an importable object.
* ``NAME`` — an entry point in the group ``pytest_cbatch.impls`` (engines
  register themselves); ``reference`` is the built-in one.

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
    if ":" in spec:
        where, _, attr = spec.rpartition(":")
        if where.endswith(".py"):
            return PythonImplementation(spec, _load_file_attr(spec, where, attr, rootdir), f"file {where}")
        return PythonImplementation(spec, _import_attr(spec, where, attr), f"module {where}")
    impls = available_impls()
    if spec in impls:
        target = impls[spec]
        module, _, attr = target.partition(":")
        obj = _import_attr(spec, module, attr) if attr else _import_module(spec, module)
        return PythonImplementation(spec, obj, f"entry point {spec} = {target}")
    raise ImplementationError(_unknown_spec_message(spec, impls))


def _unknown_spec_message(spec: str, impls: Mapping[str, str]) -> str:
    names = ", ".join(sorted(impls)) or "(none installed)"
    return (
        f"--cbatch-impl {spec!r} is not an installed implementation.\n"
        f"  installed ({ENTRY_POINT_GROUP} entry points): {names}\n"
        f"  or give one of: package.module:attr | path/to/file.py:attr | exec:COMMAND"
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


def _load_file_attr(spec: str, path: str, attr: str, rootdir: str | None) -> Any:
    full = path if os.path.isabs(path) or rootdir is None else os.path.join(rootdir, path)
    if not os.path.isfile(full):
        raise ImplementationError(f"--cbatch-impl {spec}: no such file {path!r}")
    name = "cbatch_impl_" + "".join(c if c.isalnum() else "_" for c in os.path.abspath(full))
    module = sys.modules.get(name)
    if module is None:
        loader_spec = importlib.util.spec_from_file_location(name, full)
        if loader_spec is None or loader_spec.loader is None:
            raise ImplementationError(f"--cbatch-impl {spec}: cannot load {path!r} as Python")
        module = importlib.util.module_from_spec(loader_spec)
        folder = os.path.dirname(os.path.abspath(full))
        sys.path.insert(0, folder)  # so a submission can import its sibling files
        try:
            sys.modules[name] = module
            loader_spec.loader.exec_module(module)
        except Exception as exc:
            sys.modules.pop(name, None)
            raise ImplementationError(f"--cbatch-impl {spec}: importing {path!r} failed: "
                                      f"{type(exc).__name__}: {exc}") from exc
        finally:
            sys.path.remove(folder)
    return _get_attr(spec, module, attr, f"file {path!r}")
