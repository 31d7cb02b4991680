"""The sandbox child: loads one submission and serves JSON-lines RPC on two pipe fds.

Run as ``python -I child.py CONFIG_JSON`` by ``pytest_cbatch.sandbox.process``;
standard library only: the kit is imported only for a mirrored lifecycle step
(``mirror_child``), and whatever a submission patches, it patches in this
process alone, since every verdict is computed in the parent.  The same
module gives the parent the value codec.

CONFIG_JSON holds ``rpc_in``/``rpc_out`` (fd numbers), ``limits``
(``resource`` names to ``[soft, hard]``), ``home`` (made if missing),
``copy_from`` (inside bubblewrap: the read-only submission, copied into the
load folder, which becomes the working directory) and ``load``: ``folder`` (put first
on sys.path), ``files`` (module files to import, in priority order),
``modules`` (importable names), ``attr`` (an attribute path on the first
module, or null); ``guard`` (optional): the kit guard's settings (see
``guard``), whose reports are lines ``{"kit": {...}}`` written as they happen;
``stack_after`` (optional): seconds after which a request still running sends
the submission's stack as a line ``{"stack": text}`` (see ``StopWatch``).
The first reply describes what was found.

Each request is one JSON line ``{"op": ..., "drop": [handles], ...}`` and gets
one reply line (a ``mirror`` request first writes a line per step it starts,
``{"seg": [name, kwargs]}``, and per request its machine makes,
``{"rec": [request, reply]}``): ``{"ok": value}`` (a ``getattr`` reply may add ``"snap"``: see
``Server.snapshot``), ``{"raised": {type, builtin, message}}``,
``{"unsupported": message}`` (simulate raised NotImplementedError),
``{"exited": code}`` (SystemExit) or ``{"memory": message}`` (MemoryError out
of simulate).  Values are JSON with tags: ``{"$tuple": [...]}``,
``{"$set": [...]}``, ``{"$dict": [[key, value], ...]}``, and ``{"$handle": n,
"$type": name}`` for any other object, which stays in the child.
"""

from __future__ import annotations

import builtins
import collections.abc
import functools
import importlib.util
import inspect
import json
import numbers
import os
import resource
import shlex
import shutil
import sys
import traceback
import types
from typing import Any, Callable

PARTS = ("PagedKV", "RecomputeRequest", "TransferManager")
SNAPSHOT_OBJECTS = 512  # objects whose attributes one getattr reply may carry
MIRROR_PRELOAD = 64  # objects whose attributes one reply of a mirrored step may carry


_PLAIN = (type(None), bool, int, float, str)


def encode(value: Any, handle: Callable[[Any], dict[str, Any]]) -> Any:
    """Tagged JSON for ``value``; ``handle(obj)`` encodes an object that is not plain data."""
    kind = type(value)
    if kind in _PLAIN:  # the common cases first: the ABC checks below are slow
        return value
    if kind is list:
        return [encode(v, handle) for v in value]
    if kind is dict:
        return {"$dict": [[encode(k, handle), encode(v, handle)] for k, v in value.items()]}
    if kind is tuple:
        return {"$tuple": [encode(v, handle) for v in value]}
    if kind is set or kind is frozenset:
        return {"$set": [encode(v, handle) for v in value]}
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    if isinstance(value, tuple):
        return {"$tuple": [encode(v, handle) for v in value]}
    if isinstance(value, (list, collections.deque, range)):
        return [encode(v, handle) for v in value]
    if isinstance(value, collections.abc.Set):
        return {"$set": [encode(v, handle) for v in value]}
    if isinstance(value, collections.abc.Mapping):
        return {"$dict": [[encode(k, handle), encode(v, handle)] for k, v in value.items()]}
    return handle(value)


class _NotNative(Exception):
    pass


def native_copy(value: Any) -> tuple[bool, Any]:
    """``(True, a copy of value)`` when ``value`` is JSON as it stands and comes back from it unchanged:
    None, bools, ints, floats, strings, and lists and string-keyed dicts of them; else ``(False, None)``."""
    try:
        return True, _copy(value)
    except _NotNative:
        return False, None


def _copy(value: Any) -> Any:
    kind = type(value)
    if kind in _PLAIN:
        return value
    if kind is list:
        return [item if type(item) in _PLAIN else _copy(item) for item in value]
    if kind is dict:
        out = {}
        for key, item in value.items():
            if type(key) is not str:
                raise _NotNative
            out[key] = item if type(item) in _PLAIN else _copy(item)
        return out
    raise _NotNative


def decode(value: Any, handle: Callable[[dict[str, Any]], Any]) -> Any:
    """The inverse of ``encode``; ``handle(tag)`` turns a ``$handle`` tag into an object."""
    kind = type(value)
    if kind is list:
        return [v if type(v) in _PLAIN else decode(v, handle) for v in value]
    if kind is not dict:
        return value
    if "$tuple" in value:
        return tuple(decode(v, handle) for v in value["$tuple"])
    if "$set" in value:
        return {decode(v, handle) for v in value["$set"]}
    if "$dict" in value:
        return {decode(k, handle): decode(v, handle) for k, v in value["$dict"]}
    if "$handle" in value:
        return handle(value)
    raise ValueError(f"untagged object in RPC value: {sorted(value)[:5]}")


def _json_default(obj: Any) -> Any:
    """json.dumps fallback for a report: numbers as numbers, anything else as a visible marker."""
    if isinstance(obj, numbers.Integral):
        return int(obj)
    if isinstance(obj, numbers.Real):
        return float(obj)
    if isinstance(obj, (tuple, set, frozenset)):
        return list(obj)
    return f"<not JSON: {type(obj).__name__}>"


class Server:
    """Holds the submission's namespace and the objects handed out by handle."""

    def __init__(self, names: dict[str, Any], send: Callable[[list[dict[str, Any]]], None] | None = None,
                 folder: str | None = None) -> None:
        self.names = names
        self.objects: dict[int, Any] = {}
        self.by_id: dict[int, int] = {}
        self.next_handle = 1
        self.send, self.folder = send, folder
        self.session: Any = None  # the mirror session, made on the first ``mirror`` request

    def handle(self, obj: Any) -> dict[str, Any]:
        number = self.by_id.get(id(obj))
        if number is None or self.objects.get(number) is not obj:
            number = self.next_handle
            self.next_handle += 1
            self.objects[number] = obj
            self.by_id[id(obj)] = number
        kind = "class" if inspect.isclass(obj) else ("callable" if callable(obj) else "object")
        return {"$handle": number, "$type": type(obj).__name__, "$kind": kind}

    def obj(self, tag: dict[str, Any]) -> Any:
        number = tag["$handle"]
        if number not in self.objects:
            raise LookupError(f"no remote object #{number} (released, or from before a restart)")
        return self.objects[number]

    def drop(self, numbers_: list[int]) -> None:
        for number in numbers_:
            obj = self.objects.pop(number, None)
            if obj is not None and self.by_id.get(id(obj)) == number:
                del self.by_id[id(obj)]

    def out(self, value: Any) -> Any:
        return encode(value, self.handle)

    def into(self, value: Any) -> Any:
        return decode(value, self.obj)

    def dispatch(self, request: dict[str, Any], preload: int | None = None) -> dict[str, Any]:
        """The reply to one request.  ``preload``: None for a live request (a ``getattr`` may bring a
        snapshot), else a mirrored one, whose reply carries the plain attributes of up to that many objects
        (``preloaded``) and says whether a read runs no code."""
        self.drop(request.get("drop", []))
        op = request["op"]
        if op == "simulate":
            return self.simulate(request["trace"], request["config"])
        if op == "mirror":
            return self.mirror(request)
        if op == "new":
            target = self.names[request["name"]]
        else:
            target = self.obj(request["target"])
        if op == "getattr":  # the most requests by far: no arguments to decode
            return self.read(target, request["name"], request["target"]["$handle"], preload)
        args = self.into(request.get("args", []))
        kwargs = self.into({"$dict": request.get("kwargs", [])})
        if op in ("new", "call"):
            fn = target if op == "new" or request.get("method") is None else getattr(target, request["method"])
            if preload is not None:
                return self.preloaded({"ok": fn(*args, **kwargs)}, [] if op == "new" else [target], preload)
            return {"ok": self.out(fn(*args, **kwargs))}
        if op == "dunder":
            name = request["name"]
            value = list(target) if name == "__iter__" else getattr(target, name)(*args)
            return {"ok": self.out(value)} if preload is None else self.preloaded({"ok": value}, [target], preload)
        raise ValueError(f"unknown op {op!r}")

    def read(self, target: Any, name: str, handle: int, preload: int | None) -> dict[str, Any]:
        """The reply to a ``getattr`` of ``name`` on ``target`` (object ``handle``; see ``dispatch``)."""
        if _is_method(type(target), name) and name not in getattr(target, "__dict__", {}):
            return {"ok": None, "method": True}
        if preload is not None:  # a mirrored step: say whether reading it again runs no code
            return self.preloaded({"ok": getattr(target, name), "plain": _plain_read(target, name)}, [], preload)
        snap = self.snapshot(target)
        if snap is not None and name in snap[handle]:
            return {"ok": snap[handle][name], "snap": snap}
        return {"ok": self.out(getattr(target, name))}

    def preloaded(self, reply: dict[str, Any], roots: list[Any], limit: int) -> dict[str, Any]:
        """``reply`` with its value encoded and, under ``attrs``, the plain attributes of ``roots`` (a
        call's target) and of the objects the value names, up to ``limit`` objects (a mirrored step's
        reply: see ``mirror``).  A value that is JSON as it stands goes as a copy (``native_copy``),
        marked ``raw``: it needs no decoding, and names no objects."""
        named: list[Any] = []
        plain, copy = native_copy(reply["ok"])
        if plain:
            reply["ok"], reply["raw"] = copy, True
        elif not limit:
            reply["ok"] = self.out(reply["ok"])
        else:
            def handle(obj: Any) -> dict[str, Any]:
                named.append(obj)
                return self.handle(obj)

            reply["ok"] = encode(reply["ok"], handle)
        attrs = self.attributes([*roots, *named], limit, depth=0) if limit and (roots or named) else {}
        if attrs:
            reply["attrs"] = attrs
        return reply

    def mirror(self, request: dict[str, Any]) -> dict[str, Any]:
        """Run a lifecycle step as the parent will (``mirror_child``), writing its requests as it goes.

        The kit and Hypothesis come from ``_mirror_module``, on the first such request.
        """
        if self.session is None:
            assert self.send is not None
            self.session = _mirror_module(self.folder).MirrorSession(self, self.send)
        return self.session.run(request)

    def snapshot(self, root: Any) -> dict[int, dict[str, Any]] | None:
        """The plain instance attributes of ``root``, of every object the parent holds, and of the objects
        they reach (up to SNAPSHOT_OBJECTS).

        ``{handle: {name: encoded value}}``: what ``getattr`` would return for
        each name, sent in one reply so the parent reads them without a round
        trip each until its next call (a call may change them).  Only
        ``__dict__`` entries no data descriptor shadows and set ``__slots__``,
        of objects whose class keeps the default ``__getattribute__``; None
        when there are none.
        """
        return self.attributes([root, *self.objects.values()], SNAPSHOT_OBJECTS) or None

    def attributes(self, roots: list[Any], limit: int, depth: int | None = None) -> dict[int, dict[str, Any]]:
        """``{handle: {name: encoded value}}`` of the plain attributes of ``roots`` and of the objects they
        reach (breadth first, at most ``limit`` objects, at most ``depth`` levels below the roots)."""
        found: list[tuple[Any, int]] = []
        level = 0

        def handle(obj: Any) -> dict[str, Any]:
            found.append((obj, level + 1))
            return self.handle(obj)

        out: dict[int, dict[str, Any]] = {}
        queue = [(obj, 0) for obj in roots]
        while queue and len(out) < limit:
            obj, level = queue.pop(0)
            number = self.handle(obj)["$handle"]
            if number in out or (depth is not None and level > depth):
                continue
            attrs = _plain_attributes(obj)
            if attrs is None:
                continue
            out[number] = {name: encode(value, handle) for name, value in attrs.items()}
            queue += found
            found.clear()
        return out

    def simulate(self, trace: list[Any], config: dict[str, Any]) -> dict[str, Any]:
        before = json.dumps([trace, config], sort_keys=True)
        try:
            report = self.names["simulate"](trace, **config)
        except NotImplementedError as exc:
            return {"unsupported": f"NotImplementedError: {exc}"}
        except MemoryError as exc:
            return {"memory": f"MemoryError: {exc}"}
        except Exception as exc:
            if getattr(exc, "cbatch_broken", False):   # a program's output that is no report (sandbox.program)
                return {"broken": str(exc)[:2000]}
            raise
        reply: dict[str, Any] = {"ok": json.loads(json.dumps(report, default=_json_default))}
        if json.dumps([trace, config], sort_keys=True, default=_json_default) != before:
            reply["trace"] = json.loads(json.dumps(trace, default=_json_default))
            reply["config"] = json.loads(json.dumps(config, default=_json_default))
        return reply


def _plain_attributes(obj: Any) -> dict[str, Any] | None:
    """``obj``'s instance attributes that plain ``getattr`` reads straight from ``__dict__``, or None."""
    cls = type(obj)
    if inspect.isclass(obj) or callable(obj) or cls.__getattribute__ is not object.__getattribute__:
        return None
    out = {}
    for name, member in _slot_members(cls):  # read through their member descriptors, which run no code
        try:
            out[name] = member.__get__(obj, cls)
        except AttributeError:  # an unset slot: getattr raises, so leave it to a real getattr
            pass
    attrs = getattr(obj, "__dict__", None)
    for name, value in (attrs.items() if isinstance(attrs, dict) else ()):
        if not _shadowed(cls, name):
            out[name] = value
    return out if out or isinstance(attrs, dict) else None


def _plain_read(obj: Any, name: str) -> bool:
    """Whether ``getattr(obj, name)`` reads an instance attribute straight from ``__dict__`` or a slot."""
    cls = type(obj)
    if inspect.isclass(obj) or callable(obj) or cls.__getattribute__ is not object.__getattribute__:
        return False
    attrs = getattr(obj, "__dict__", None)
    if isinstance(attrs, dict) and name in attrs:
        return not _shadowed(cls, name)
    return any(slot == name for slot, _ in _slot_members(cls))


@functools.lru_cache(maxsize=4096)
def _slot_members(cls: type) -> tuple[tuple[str, Any], ...]:
    found: dict[str, Any] = {}
    for klass in cls.__mro__:
        for name in klass.__dict__.get("__slots__", ()):
            member = klass.__dict__.get(name)
            if isinstance(member, types.MemberDescriptorType) and inspect.getattr_static(cls, name, None) is member:
                found.setdefault(name, member)
    return tuple(found.items())


@functools.lru_cache(maxsize=65536)
def _is_method(cls: type, name: str) -> bool:
    """Whether ``name`` on ``cls`` is a plain function (so, on an instance without that attribute, a method)."""
    return inspect.isfunction(inspect.getattr_static(cls, name, None))


@functools.lru_cache(maxsize=65536)
def _shadowed(cls: type, name: str) -> bool:
    """Whether a data descriptor of ``cls`` (a property, say) wins over an instance attribute ``name``."""
    on_class = inspect.getattr_static(cls, name, None)
    return hasattr(type(on_class), "__set__") or hasattr(type(on_class), "__delete__")


def exited(exc: SystemExit) -> dict[str, Any]:
    """The reply that says the submission raised SystemExit."""
    return {"exited": exc.code if isinstance(exc.code, int) or exc.code is None else str(exc.code)}


def raised(exc: BaseException, stack: str = "") -> dict[str, Any]:
    """The reply that says the submission raised ``exc``; ``stack``: its traceback (``own_stack``), if any."""
    base = next((c for c in type(exc).__mro__ if getattr(builtins, c.__name__, None) is c), Exception)
    message = str(exc)
    out = {"type": type(exc).__name__, "builtin": base.__name__, "message": message[:2000]}
    return {"raised": {**out, "stack": stack} if stack else out}


def own_stack(exc: BaseException, folder: str | None) -> str:
    """``exc``'s traceback as the student reads it (see ``_students``)."""
    try:
        frames = _students(traceback.extract_tb(exc.__traceback__), folder)
        return "".join(traceback.format_list(frames) + traceback.format_exception_only(type(exc), exc))[-4000:]
    except Exception:  # noqa: BLE001 - an exception whose text cannot be made: its type says enough
        return ""


def _students(frames: traceback.StackSummary, folder: str | None) -> list[traceback.FrameSummary]:
    """With a submission ``folder``, only the frames of its files, named relative to it (no path of the
    grader's); else every frame but the sandbox's own.  The last 30."""
    kit = os.path.dirname(os.path.abspath(__file__)) + os.sep
    kept = [f for f in frames if not os.path.abspath(f.filename).startswith(kit)]
    if folder:
        root = os.path.abspath(folder) + os.sep
        kept = [f for f in kept if os.path.isabs(f.filename) and os.path.abspath(f.filename).startswith(root)]
        for frame in kept:
            frame.filename = os.path.abspath(frame.filename)[len(root):]
    return kept[-30:]


class StopWatch:
    """Sends the main thread's stack (``{"stack": text}``) once a request has run ``seconds``, so the parent,
    should it then stop the call at its limit, can show the line the submission was at (a loop's, say).

    A thread of the child's: it runs whenever the main thread lets go of the GIL, which plain Python code
    does every few milliseconds (a C extension holding it gives no stack).
    """

    def __init__(self, send: Callable[[dict[str, Any]], None], seconds: float, folder: str | None) -> None:
        import threading

        self.send, self.seconds, self.folder = send, seconds, folder
        self.main = threading.main_thread().ident
        self.armed = threading.Condition()
        self.since: float | None = None
        threading.Thread(target=self._watch, name="cbatch-stopwatch", daemon=True).start()

    def arm(self) -> None:
        import time

        with self.armed:
            self.since = time.monotonic()
            self.armed.notify()

    def disarm(self) -> None:
        with self.armed:
            self.since = None

    def _watch(self) -> None:
        import time

        while True:
            with self.armed:
                while self.since is None:
                    self.armed.wait()
                since = self.since
                left = since + self.seconds - time.monotonic()
                if left > 0:
                    self.armed.wait(left)
                    continue
                self.since = None  # once per request
            frame = sys._current_frames().get(self.main)  # type: ignore[arg-type]
            if frame is not None:
                frames = _students(traceback.extract_stack(frame), self.folder)
                self.send({"stack": "".join(traceback.format_list(frames))[-4000:]})


def _load_file(path: str) -> Any:
    name = os.path.splitext(os.path.basename(path))[0]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {os.path.basename(path)} as Python")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # so `from scheduler_sim import PagedKV` in a sibling finds this one
    spec.loader.exec_module(module)
    return module


def load(spec: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Import the submission; return its namespace (name -> object) and the description for the parent.

    A submission that is a program (``command``: its argv) offers ``simulate`` only, as runs of it.
    """
    if spec.get("command"):
        program = _program_module().Program(spec["command"], spec["folder"], spec["output_bytes"])
        label = "exec:" + shlex.join(spec["command"])   # the SPEC that replays it: cbatch check --impl LABEL
        return {"simulate": program}, {"parts": [], "sources": {"simulate": label},
                                       "simulate": {"accepted": [], "open": True}}
    if spec.get("folder"):
        sys.path.insert(0, spec["folder"])
    modules = [(os.path.basename(p), _load_file(p)) for p in spec.get("files", [])]
    modules += [(m, importlib.import_module(m)) for m in spec.get("modules", [])]
    if spec.get("attr"):
        target = modules[0][1]
        for part in spec["attr"].split("."):
            target = getattr(target, part)
        modules = [(f"{modules[0][0]}:{spec['attr']}", target)]
    names: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for label, target in modules:
        fn = target if callable(target) and not inspect.ismodule(target) and not inspect.isclass(target) else None
        candidates = {"simulate": fn or getattr(target, "simulate", None)}
        candidates.update({part: getattr(target, part, None) for part in PARTS})
        for name, value in candidates.items():
            if name not in names and callable(value):
                names[name], sources[name] = value, label
    described: dict[str, Any] = {"parts": [p for p in PARTS if p in names], "sources": sources, "simulate": None}
    if "simulate" in names:
        try:
            params = inspect.signature(names["simulate"]).parameters.values()
            accepted = [p.name for p in params if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)]
            described["simulate"] = {"accepted": accepted, "open": any(p.kind is p.VAR_KEYWORD for p in params)}
        except (TypeError, ValueError):
            described["simulate"] = {"accepted": [], "open": True}
    return names, described


def _mirror_module(folder: str | None) -> Any:
    """The kit's ``mirror_child`` (and its lifecycle machines), imported from the environment only: the
    submission's folder is off ``sys.path`` meanwhile, so none of its files can stand in for them."""
    saved = list(sys.path)
    sys.path[:] = [p for p in sys.path if p not in (folder, "", ".")]
    try:
        from pytest_cbatch.sandbox import mirror_child
        import pytest_cbatch.lifecycle  # noqa: F401
    finally:
        sys.path[:] = saved
    return mirror_child


def _program_module() -> Any:
    """The kit's ``program`` module (standard library only), loaded from this file's folder by its path:
    nothing of the submission's can stand in for it, and the kit's package is not imported."""
    spec = importlib.util.spec_from_file_location("_cbatch_program", os.path.join(os.path.dirname(
        os.path.abspath(__file__)), "program.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _guard_module() -> Any:
    """``guard`` (standard library only), loaded by path: nothing of the kit is imported for it."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "guard.py")
    spec = importlib.util.spec_from_file_location("_cbatch_guard", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _apply_limits(limits: dict[str, list[int]]) -> None:
    for name, (soft, hard) in limits.items():
        resource.setrlimit(getattr(resource, name), (soft, hard))


def _prepare(config: dict[str, Any]) -> None:
    """The working directory: the submission copied in when it arrives read-only, then made current."""
    os.makedirs(config["home"], exist_ok=True)
    folder = config["load"].get("folder")
    if config.get("copy_from"):
        shutil.copytree(config["copy_from"], folder, symlinks=True)
    elif folder:
        os.makedirs(folder, exist_ok=True)
    if folder:
        os.chdir(folder)


def main(argv: list[str]) -> int:
    config = json.loads(argv[1])
    _apply_limits(config["limits"])
    reader = os.fdopen(config["rpc_in"], "rb")
    writer = os.fdopen(config["rpc_out"], "wb")

    def send_all(replies: list[dict[str, Any]]) -> None:
        writer.write(b"".join(json.dumps(reply, default=_json_default).encode() + b"\n" for reply in replies))
        writer.flush()

    def send(reply: dict[str, Any]) -> None:
        send_all([reply])

    try:
        _prepare(config)
        if config.get("guard"):
            _guard_module().install(config["guard"], [p for p in (config["load"].get("folder"), config.get("copy_from"))
                                                      if p], lambda record: send({"kit": record}))
        names, described = load(config["load"])
    except BaseException as exc:  # noqa: BLE001 - everything the import does is the submission's
        send({"load_failed": f"{type(exc).__name__}: {exc}", "traceback": own_stack(exc, config["load"].get("folder"))})
        return 0
    send({"ok": described})
    server = Server(names, send_all, config["load"].get("folder"))
    seconds = config.get("stack_after")
    watch = StopWatch(send, seconds, server.folder) if seconds else None
    for line in reader:
        try:
            request = json.loads(line)
            if watch is not None and request.get("op") != "mirror":  # a search's lines say where it is
                watch.arm()
            reply = server.dispatch(request)
        except SystemExit as exc:
            reply = exited(exc)
        except BaseException as exc:  # noqa: BLE001 - the submission's errors are data for the parent
            reply = raised(exc, own_stack(exc, server.folder))
        if watch is not None:
            watch.disarm()
        send(reply)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
