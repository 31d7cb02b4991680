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

import os
import weakref
from typing import Any, TypeVar

from .. import untrusted
from ..impls import (
    BrokenOutput, Implementation, ImplementationError, NotRun, PythonImplementation, Refused, Stopped, Unsupported,
)
from ..support import parse_settings
from .limits import Deadline, Limits
from .guard import KitGuard
from .process import LoadSpec, Sandbox, SandboxFailure
from .protocol import decode
from .remote import Channel, RemoteNamespace, RemoteObject, exit_value, raised_text

__all__ = ["IsolatedImplementation", "LiveChannel", "RemoteObject", "SandboxFailure", "load_spec_for"]

_C = TypeVar("_C")
_PRIORITY = ("scheduler_sim.py", "scheduler_faults.py")
_NOT_SUBMISSION = ("test_", "conftest.py", "setup.py")


class LiveChannel(Channel):
    """Requests sent to the sandbox child one by one: encoding, handle release, attribute snapshots."""

    def __init__(self, sandbox: Sandbox) -> None:
        super().__init__()
        self.sandbox = sandbox
        self.label = sandbox.label
        # (generation, handle) of the objects whose last proxy is gone, for the next request to release: a
        # proxy is collected whenever the garbage collector gets to it, maybe after its child was restarted,
        # and the next child numbers its objects afresh.
        self.dropped: list[tuple[int, int]] = []
        # Attribute snapshots from the child (see child.Server.snapshot), valid until the next request that
        # may change something: any call, and any request that releases handles.
        self.snaps: dict[int, dict[str, Any]] = {}
        self.snap_generation = 0

    @property
    def generation(self) -> int:
        return self.sandbox.generation

    def released(self, handle: int, generation: int) -> None:
        self.dropped.append((generation, handle))

    def cached(self, handle: int, generation: int, name: str) -> tuple[bool, Any]:
        attrs = self.snaps.get(handle) if generation == self.snap_generation == self.sandbox.generation else None
        if attrs is None or name not in attrs:
            return False, None
        return True, decode(attrs[name], self.proxy)

    def _forget_snapshots(self) -> None:
        """Drop the snapshots, and release the child's handles that only they referred to."""
        generation = self.snap_generation
        for handle in self.snaps if generation == self.sandbox.generation else ():
            if (generation, handle) not in self.live and (generation, handle) not in self.dropped:
                self.dropped.append((generation, handle))
        self.snaps = {}

    def exchange(self, message: dict[str, Any], generation: int | None) -> dict[str, Any]:
        if message["op"] != "getattr" or self.dropped:
            self._forget_snapshots()
        running = self.sandbox.generation if self.sandbox.alive() else None  # else the request starts a new one
        message["drop"] = [handle for generation, handle in self.dropped if generation == running]
        self.dropped = []
        reply = self.sandbox.request(message, "lifecycle", generation)
        if "snap" in reply:
            if self.snap_generation != self.sandbox.generation:
                self.snaps, self.snap_generation = {}, self.sandbox.generation
            self.snaps.update({int(k): v for k, v in reply["snap"].items()})
        return reply

    def proxy(self, tag: dict[str, Any]) -> RemoteObject:
        key = (self.generation, tag["$handle"])
        if key not in self.live and key in self.dropped:
            self.dropped.remove(key)  # its old proxy died after this reply was sent
        return super().proxy(tag)


def _what_it_did(message: str, label: str) -> str:
    """A sandbox failure's message as what the run did ("did not answer within ..."), the form of every
    ``Stopped`` message (a failure reads "the run was stopped: it did not answer ...")."""
    subject = f"the {label} "
    return message[len(subject):] if message.startswith(subject) else f"was stopped ({message})"


class _RemoteSimulate:
    """``simulate`` in the child; marks the capability for ``unsupported_reason``."""

    def __init__(self, sandbox: Sandbox) -> None:
        self.sandbox = sandbox

    def __call__(self, trace: list[dict[str, Any]], config: dict[str, Any]) -> dict[str, Any]:
        try:
            reply = self.sandbox.request({"op": "simulate", "trace": trace, "config": config}, "simulate")
        except SandboxFailure as exc:
            if exc.kind == "timeout":  # a hang is a stop, as in process: never "output that is not JSON"
                raise Stopped(_what_it_did(str(exc), self.sandbox.label), exc.stack) from None
            if exc.kind == "breaker":  # never run: a workload not run is never one it ran on
                raise NotRun(str(exc)) from None
            raise BrokenOutput(str(exc)) from None
        # Every word of the reply is the child's, which the submission may have written: bounded text only.
        if "unsupported" in reply:
            raise Unsupported(f"{self.sandbox.label} raised {untrusted.text(reply['unsupported'])}")
        if "memory" in reply:
            raise BrokenOutput(f"{self.sandbox.label} ran out of memory ({untrusted.text(reply['memory'])}; limit "
                               f"memory_mb {self.sandbox.limits.memory_mb} MiB)")
        if "exited" in reply:
            raise BrokenOutput(f"{self.sandbox.label} called sys.exit({exit_value(reply['exited'])}) instead of "
                               f"returning")
        if "broken" in reply:
            raise BrokenOutput(f"{self.sandbox.label}: {untrusted.text(reply['broken'])}")
        if "raised" in reply:
            raise Refused(*raised_text(reply["raised"]))
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
    declined_settings = PythonImplementation.declined_settings

    def __init__(self, spec: str, load: LoadSpec, limits: Limits, *, label: str = "submission",
                 mode: str = "auto", runtimes: tuple[str, ...] = (), guard: KitGuard | None = None,
                 deadline: Deadline | None = None) -> None:
        """``mode``: the sandbox mode (``auto``, ``bwrap``, ``process``; see ``pytest_cbatch.sandbox.bwrap``);
        ``runtimes``: language runtimes' folders the child may use besides ``/usr`` (see ``Sandbox``);
        ``guard``: watch (and by default refuse) the submission's uses of the kit's code (see ``guard``);
        ``deadline``: the submission's shared clock (see ``Sandbox``)."""
        self.spec = spec
        self.limits = limits
        try:
            self.sandbox = Sandbox(load, limits, label, mode, runtimes, guard, deadline)
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
        try:  # declared in cbatch.toml (read by the kit) or as CBATCH_UNSUPPORTED (the child's word: validated)
            self.unsupported = load.unsupported + parse_settings(info.get("unsupported", []),
                                                                 f"{label}: CBATCH_UNSUPPORTED")
        except ValueError as exc:
            self.sandbox.close()
            raise ImplementationError(f"--cbatch-impl {spec}: {exc}") from None
        self.parts: tuple[str, ...] = tuple(info.get("parts", []))
        self.namespace = RemoteNamespace(LiveChannel(self.sandbox), list(self.parts), label)
        if self.fn is None and not info.get("parts"):
            self.sandbox.close()
            raise ImplementationError(f"--cbatch-impl {spec}: found neither a callable 'simulate' nor any of "
                                      f"PagedKV, RecomputeRequest, TransferManager")

    def lifecycle_channel(self, kind: type[_C]) -> _C:
        """A fresh channel of ``kind`` (``search.SearchChannel``) that judges lifecycle searches the child
        runs first; its ``namespace`` stands for the submission's lifecycle classes, as ``self.namespace``
        does."""
        return kind(self.sandbox, list(self.parts))

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
    """The module files of a submission folder, in the order their names are looked up: regular files only,
    never a link (see ``files``)."""
    names = sorted(n for n in os.listdir(folder) if n.endswith(".py") and _regular(os.path.join(folder, n)))
    preferred = [n for n in _PRIORITY if n in names]
    if preferred:
        return tuple(preferred)
    return tuple(n for n in names if not n.startswith(_NOT_SUBMISSION))


def _regular(path: str) -> bool:
    return os.path.isfile(path) and not os.path.islink(path)
