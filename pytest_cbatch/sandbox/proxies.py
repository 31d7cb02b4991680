"""Parent-side proxies: a sandboxed submission seen as an ``Implementation`` and a lifecycle namespace.

``IsolatedImplementation`` runs ``simulate`` in the sandbox child and is
judged by the ordinary ``runner.Judge`` in this process.  Its ``namespace``
offers the submission's ``PagedKV``/``RecomputeRequest``/``TransferManager``
as remote classes: constructing one, calling a method or reading an attribute
is one RPC; plain data comes back as copies, other objects as ``RemoteObject``
handles, and an exception raised in the child is re-raised here as a subclass
of the nearest built-in exception with the same name (so ``except
ValueError`` works).  A failed call (timeout, crash, flood, ...) raises
``SandboxFailure``; objects from before a restart raise it too.
"""

from __future__ import annotations

import builtins
import os
import weakref
from typing import Any, Mapping

from ..impls import BrokenOutput, Implementation, ImplementationError, PythonImplementation, Refused, Stopped, Unsupported
from .child import decode, encode
from .limits import Limits
from .process import LoadSpec, Sandbox, SandboxFailure

__all__ = ["IsolatedImplementation", "RemoteObject", "SandboxFailure", "load_spec_for"]

_REMOTE_ERRORS: dict[tuple[str, str], type[Exception]] = {}
_PRIORITY = ("scheduler_sim.py", "scheduler_faults.py")
_NOT_SUBMISSION = ("test_", "conftest.py", "setup.py")


def remote_error(info: Mapping[str, Any]) -> Exception:
    """An exception of the child's type name, deriving from the built-in it derives from there."""
    base = getattr(builtins, str(info.get("builtin")), Exception)
    if not (isinstance(base, type) and issubclass(base, Exception)):
        base = Exception
    name = str(info.get("type", "Exception"))
    cls = _REMOTE_ERRORS.get((name, base.__name__))
    if cls is None:
        cls = base if base.__name__ == name else type(name, (base,), {"__module__": "sandboxed"})
        _REMOTE_ERRORS[(name, base.__name__)] = cls
    return cls(info.get("message", ""))


class _Channel:
    """The RPC conversation for remote objects: encoding, handle release, failures as exceptions."""

    def __init__(self, sandbox: Sandbox) -> None:
        self.sandbox = sandbox
        self.dropped: list[int] = []
        self.methods: set[tuple[str, str]] = set()  # (type, name) known to be plain methods
        self.live: weakref.WeakValueDictionary[tuple[int, int], RemoteObject] = weakref.WeakValueDictionary()
        # Attribute snapshots from the child (see child.Server.snapshot), valid until the next request that
        # may change something: any call, and any request that releases handles.
        self.snaps: dict[int, dict[str, Any]] = {}
        self.snap_generation = 0

    def cached(self, handle: int, generation: int, name: str) -> tuple[bool, Any]:
        """``(True, value)`` when a current snapshot holds ``name`` of object ``handle``."""
        attrs = self.snaps.get(handle) if generation == self.snap_generation == self.sandbox.generation else None
        if attrs is None or name not in attrs:
            return False, None
        return True, decode(attrs[name], self.proxy)

    def _forget_snapshots(self) -> None:
        """Drop the snapshots, and release the child's handles that only they referred to."""
        generation = self.snap_generation
        for handle in self.snaps if generation == self.sandbox.generation else ():
            if (generation, handle) not in self.live and handle not in self.dropped:
                self.dropped.append(handle)
        self.snaps = {}

    def ask(self, message: dict[str, Any], generation: int | None = None) -> dict[str, Any]:
        if message["op"] != "getattr" or self.dropped:
            self._forget_snapshots()
        message["drop"], self.dropped = self.dropped, []
        reply = self.sandbox.request(message, "lifecycle", generation)
        if "snap" in reply:
            if self.snap_generation != self.sandbox.generation:
                self.snaps, self.snap_generation = {}, self.sandbox.generation
            self.snaps.update({int(k): v for k, v in reply["snap"].items()})
        if "raised" in reply:
            raise remote_error(reply["raised"])
        if "exited" in reply:
            raise SandboxFailure("died", f"the {self.sandbox.label} called sys.exit({reply['exited']!r})")
        if "ok" not in reply:
            raise SandboxFailure("garbage", f"unexpected reply from the {self.sandbox.label}: {reply!r:.200}")
        return reply

    def value(self, reply: dict[str, Any]) -> Any:
        return decode(reply["ok"], self.proxy)

    def proxy(self, tag: dict[str, Any]) -> RemoteObject:
        """One proxy per live remote object, so the child frees it only when the last proxy goes."""
        key = (self.sandbox.generation, tag["$handle"])
        found = self.live.get(key)
        if found is None:
            if tag["$handle"] in self.dropped:  # its old proxy died after this reply was sent
                self.dropped.remove(tag["$handle"])
            found = self.live[key] = RemoteObject(self, tag, self.sandbox.generation)
        return found

    def args(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> dict[str, Any]:
        return {"args": encode(list(args), _handle_of),
                "kwargs": [[k, encode(v, _handle_of)] for k, v in kwargs.items()]}


def _handle_of(obj: Any) -> dict[str, Any]:
    if isinstance(obj, RemoteObject):
        obj._check()
        return {"$handle": object.__getattribute__(obj, "_handle")}
    raise TypeError(f"cannot pass {type(obj).__name__} to the sandbox: only plain data and its own objects")


class RemoteObject:
    """A handle to an object living in the sandbox child."""

    __slots__ = ("_channel", "_handle", "_type", "_kind", "_generation", "__weakref__")

    def __init__(self, channel: _Channel, tag: Mapping[str, Any], generation: int) -> None:
        object.__setattr__(self, "_channel", channel)
        object.__setattr__(self, "_handle", tag["$handle"])
        object.__setattr__(self, "_type", tag.get("$type", "?"))
        object.__setattr__(self, "_kind", tag.get("$kind", "object"))
        object.__setattr__(self, "_generation", generation)
        weakref.finalize(self, channel.dropped.append, tag["$handle"])

    def _check(self) -> None:
        if self._generation != self._channel.sandbox.generation:
            raise SandboxFailure("died", f"remote {self._type} object is gone: the sandbox restarted after an "
                                         f"earlier failure")

    def _ask(self, op: str, **fields: Any) -> Any:
        message = {"op": op, "target": {"$handle": self._handle}, **fields}
        return self._channel.value(self._channel.ask(message, self._generation))

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        channel = self._channel
        if (self._type, name) in channel.methods:
            return _RemoteMethod(self, name)
        hit, value = channel.cached(self._handle, self._generation, name)
        if hit:
            return value
        reply = channel.ask({"op": "getattr", "target": {"$handle": self._handle}, "name": name}, self._generation)
        if reply.get("method"):
            channel.methods.add((self._type, name))
            return _RemoteMethod(self, name)
        return channel.value(reply)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"remote {self._type} objects are read-only from the grader's side")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._ask("call", method=None, **self._channel.args(args, kwargs))

    def _dunder(self, name: str, *args: Any) -> Any:
        return self._ask("dunder", name=name, **self._channel.args(args, {}))

    def __len__(self) -> int:
        return int(self._dunder("__len__"))

    def __iter__(self) -> Any:
        return iter(self._dunder("__iter__"))

    def __getitem__(self, key: Any) -> Any:
        return self._dunder("__getitem__", key)

    def __contains__(self, key: Any) -> bool:
        return bool(self._dunder("__contains__", key))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RemoteObject) and (self._handle, self._generation) == (other._handle,
                                                                                          other._generation)

    def __hash__(self) -> int:
        return hash((self._handle, self._generation))

    def __repr__(self) -> str:
        return f"<sandboxed {self._type} #{self._handle}>"


class _RemoteMethod:
    """A bound method of a remote object; calling it is one RPC."""

    def __init__(self, target: RemoteObject, name: str) -> None:
        self.target, self.name = target, name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.target._ask("call", method=self.name, **self.target._channel.args(args, kwargs))

    def __repr__(self) -> str:
        return f"<sandboxed method {self.name} of {self.target!r}>"


class _RemoteClass:
    """A lifecycle class of the submission; calling it constructs an object in the child."""

    def __init__(self, channel: _Channel, name: str) -> None:
        self.channel, self.__name__ = channel, name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.channel.value(self.channel.ask({"op": "new", "name": self.__name__,
                                                    **self.channel.args(args, kwargs)}))

    def __repr__(self) -> str:
        return f"<sandboxed class {self.__name__}>"


class _Namespace:
    """What the lifecycle suites see: an attribute per lifecycle part the submission offers."""

    def __init__(self, channel: _Channel, parts: list[str], label: str) -> None:
        for part in parts:
            setattr(self, part, _RemoteClass(channel, part))
        self._label = label

    def __repr__(self) -> str:
        return f"<sandboxed {self._label}>"


class _RemoteSimulate:
    """``simulate`` in the child; marks the capability for ``unsupported_reason``."""

    def __init__(self, sandbox: Sandbox) -> None:
        self.sandbox = sandbox

    def __call__(self, trace: list[dict[str, Any]], config: dict[str, Any]) -> dict[str, Any]:
        try:
            reply = self.sandbox.request({"op": "simulate", "trace": trace, "config": config}, "simulate")
        except SandboxFailure as exc:
            if exc.kind == "timeout":  # a hang is a stop, as in process: never "output that is not JSON"
                raise Stopped(str(exc)) from None
            raise BrokenOutput(str(exc)) from None
        if "unsupported" in reply:
            raise Unsupported(f"{self.sandbox.label} raised {reply['unsupported']}")
        if "memory" in reply:
            raise BrokenOutput(f"{self.sandbox.label} ran out of memory ({reply['memory']}; limit memory_mb "
                               f"{self.sandbox.limits.memory_mb} MiB)")
        if "exited" in reply:
            raise BrokenOutput(f"{self.sandbox.label} called sys.exit({reply['exited']!r}) instead of returning")
        if "raised" in reply:
            raise Refused(f"{reply['raised']['type']}: {reply['raised']['message']}")
        if "ok" not in reply:
            raise BrokenOutput(f"unexpected reply from the {self.sandbox.label}: {reply!r:.200}")
        if "trace" in reply:  # mirror the child's mutation so Implementation.run reports it
            trace[:] = reply["trace"]
            config.clear()
            config.update(reply["config"])
        return reply["ok"]


class IsolatedImplementation(Implementation):
    """An implementation whose code runs only in a sandbox child process (see the module docstring)."""

    unsupported_reason = PythonImplementation.unsupported_reason

    def __init__(self, spec: str, load: LoadSpec, limits: Limits, *, label: str = "submission",
                 mode: str = "auto") -> None:
        """``mode``: the sandbox mode (``auto``, ``bwrap``, ``process``; see ``pytest_cbatch.sandbox.bwrap``)."""
        self.spec = spec
        self.limits = limits
        try:
            self.sandbox = Sandbox(load, limits, label, mode)
        except ValueError as exc:
            raise ImplementationError(f"--cbatch-impl {spec}: {exc}") from None
        weakref.finalize(self, self.sandbox.close)
        try:
            info = self.sandbox.describe()
        except SandboxFailure as exc:
            self.sandbox.close()
            raise ImplementationError(f"--cbatch-impl {spec}: {exc}") from None
        self.sources: dict[str, str] = dict(info.get("sources", {}))
        contained = "in bubblewrap" if self.sandbox.mode == "bwrap" else "not contained: no bubblewrap"
        self.source = f"isolated child process ({contained}; {limits.describe()})"
        signature = info.get("simulate")
        self.fn = _RemoteSimulate(self.sandbox) if signature else None
        self.accepted = set(signature["accepted"]) if signature else set()
        self.open_kwargs = bool(signature and signature["open"])
        self.namespace = _Namespace(_Channel(self.sandbox), list(info.get("parts", [])), label)
        if self.fn is None and not info.get("parts"):
            self.sandbox.close()
            raise ImplementationError(f"--cbatch-impl {spec}: found neither a callable 'simulate' nor any of "
                                      f"PagedKV, RecomputeRequest, TransferManager")

    def _call(self, trace: list[dict[str, Any]], config: dict[str, Any]) -> dict[str, Any]:
        assert self.fn is not None  # run() checks unsupported_reason first
        return self.fn(trace, config)

    def close(self) -> None:
        """Stop the child and remove its working directory."""
        self.sandbox.close()


def load_spec_for(spec: str, *, rootdir: str | None = None) -> LoadSpec:
    """The LoadSpec of a SPEC: ``path/to/file.py[:attr]``, a submission folder, ``module[:attr]`` or an entry point.

    A file brings its whole folder (so its siblings import); a folder brings
    scheduler_sim.py and scheduler_faults.py when it has them, else every other
    ``.py`` in it (tests, conftest and setup excluded).  ``exec:`` is already a
    separate process and is refused here.
    """
    from ..impls import available_impls

    if spec.startswith("exec:"):
        raise ImplementationError("--cbatch-isolate does not apply to exec: implementations (they already run "
                                  "as their own process; use --cbatch-timeout)")
    where, _, attr = spec.partition(":") if not spec.endswith(".py") else (spec, "", "")
    path = where if os.path.isabs(where) or rootdir is None else os.path.join(rootdir, where)
    if where.endswith(".py"):
        if not os.path.isfile(path):
            raise ImplementationError(f"--cbatch-impl {spec}: no such file {where!r}")
        return LoadSpec(os.path.dirname(os.path.abspath(path)), (os.path.basename(path),), attr=attr or None)
    impls = available_impls()
    if not attr and spec in impls:  # an entry-point name wins over a folder of that name
        where, _, attr = impls[spec].partition(":")
    elif os.path.isdir(path):
        return LoadSpec(os.path.abspath(path), submission_files(path), attr=attr or None)
    return LoadSpec(None, (), (where,), attr=attr or None)


def submission_files(folder: str) -> tuple[str, ...]:
    """The module files of a submission folder, in the order their names are looked up."""
    names = sorted(n for n in os.listdir(folder) if n.endswith(".py") and os.path.isfile(os.path.join(folder, n)))
    preferred = [n for n in _PRIORITY if n in names]
    if preferred:
        return tuple(preferred)
    return tuple(n for n in names if not n.startswith(_NOT_SUBMISSION))
