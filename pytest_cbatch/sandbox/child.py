"""The sandbox child: loads one submission and answers the grader's requests on two pipe fds.

Run as ``python -I -m pytest_cbatch.sandbox.child CONFIG_JSON`` by
``pytest_cbatch.sandbox.process``.  Before the submission it imports only the
standard library and ``protocol``; the kit's lifecycle machines come in only
for a search (``child_search``, through ``_kit_module``).  Whatever a
submission patches, it patches in this process alone, since every verdict is
computed in the grader.

CONFIG_JSON holds ``rpc_in``/``rpc_out`` (fd numbers), ``limits``
(``resource`` names to ``[soft, hard]``), ``home`` (made if missing),
``copy_from`` (inside bubblewrap: the read-only submission, copied into the
load folder, which becomes the working directory) and ``load``: ``folder`` (put first
on sys.path), ``files`` (module files to import, in priority order),
``modules`` (importable names), ``attr`` (an attribute path on the first
module, or null), or ``command`` (a program's argv: see ``program``);
``guard`` (optional): the kit guard's settings (see ``guard``), whose reports
are lines ``{"kit": {...}}`` written as they happen; ``stack_after``
(optional): seconds after which a request still running sends the
submission's stack as a line ``{"stack": text}`` (see ``StopWatch``).  The
first reply describes what was found.

Requests (see ``protocol`` for the replies and values): ``simulate``
(``trace``, ``config``), ``new`` (``name``: a lifecycle class), ``call``
(``target``, ``method`` or null), ``getattr`` (``target``, ``name``),
``dunder`` (``target``, ``name``: ``__len__``, ``__iter__``, ...), and
``search`` (``spec``: a lifecycle search the child runs ahead, writing its
lines as it goes; see ``child_search``).
"""

from __future__ import annotations

import functools
import importlib.util
import inspect
import json
import os
import resource
import shlex
import shutil
import sys
import traceback
import types
from typing import Any, Callable

from .protocol import decode, encode, encode_line, exited, json_default, native_copy, raised

PARTS = ("PagedKV", "RecomputeRequest", "TransferManager")
SNAPSHOT_OBJECTS = 512  # objects whose attributes one getattr reply may carry

SendAll = Callable[[list[dict[str, Any]]], None]


class Server:
    """Holds the submission's namespace and the objects handed out by handle."""

    def __init__(self, names: dict[str, Any], send: SendAll | None = None, folder: str | None = None) -> None:
        self.names = names
        self.objects: dict[int, Any] = {}
        self.by_id: dict[int, int] = {}
        self.next_handle = 1
        self.send, self.folder = send, folder

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

    def dispatch(self, request: dict[str, Any], recorded: bool = False) -> dict[str, Any]:
        """The reply to one request.  ``recorded``: the request is one of a search run here (``child_search``):
        a read's reply says whether reading it again runs no code (``plain``), and no reply brings a
        snapshot; else a ``getattr`` reply may bring one (``snapshot``)."""
        self.drop(request.get("drop", []))
        op = request["op"]
        if op == "simulate":
            return self.simulate(request["trace"], request["config"])
        if op == "search":
            return self.search(request["spec"])
        if op == "new":
            target = self.names[request["name"]]
        else:
            target = self.obj(request["target"])
        if op == "getattr":  # the most requests by far: no arguments to decode
            return self.read(target, request["name"], request["target"]["$handle"], recorded)
        args = self.into(request.get("args", []))
        kwargs = self.into({"$dict": request.get("kwargs", [])})
        if op in ("new", "call"):
            fn = target if op == "new" or request.get("method") is None else getattr(target, request["method"])
            value = fn(*args, **kwargs)
        elif op == "dunder":
            name = request["name"]
            value = list(target) if name == "__iter__" else getattr(target, name)(*args)
        else:
            raise ValueError(f"unknown op {op!r}")
        return self.value_reply({}, value) if recorded else {"ok": self.out(value)}

    def read(self, target: Any, name: str, handle: int, recorded: bool) -> dict[str, Any]:
        """The reply to a ``getattr`` of ``name`` on ``target`` (object ``handle``; see ``dispatch``)."""
        if _is_method(type(target), name) and name not in getattr(target, "__dict__", {}):
            return {"ok": None, "method": True}
        if recorded:
            return self.value_reply({"plain": _plain_read(target, name)}, getattr(target, name))
        snap = self.snapshot(target)
        if snap is not None and name in snap[handle]:
            return {"ok": snap[handle][name], "snap": snap}
        return {"ok": self.out(getattr(target, name))}

    def value_reply(self, reply: dict[str, Any], value: Any) -> dict[str, Any]:
        """``reply`` with ``value`` under ``ok``: a copy marked ``raw`` when it is JSON as it stands
        (``native_copy``: it needs no decoding, and names no objects), else encoded."""
        plain, copy = native_copy(value)
        if plain:
            reply["ok"], reply["raw"] = copy, True
        else:
            reply["ok"] = self.out(value)
        return reply

    def search(self, spec: dict[str, Any]) -> dict[str, Any]:
        """Run a lifecycle search as the grader will (``child_search``), writing its lines as it goes.

        The kit and Hypothesis come from ``_kit_module``, on the first such request.
        """
        assert self.send is not None
        return _kit_module(self.folder).SearchSession(self, self.send).search(spec)

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

    def attributes(self, roots: list[Any], limit: int) -> dict[int, dict[str, Any]]:
        """``{handle: {name: encoded value}}`` of the plain attributes of ``roots`` and of the objects they
        reach (breadth first, at most ``limit`` objects)."""
        found: list[Any] = []

        def handle(obj: Any) -> dict[str, Any]:
            found.append(obj)
            return self.handle(obj)

        out: dict[int, dict[str, Any]] = {}
        queue = list(roots)
        while queue and len(out) < limit:
            obj = queue.pop(0)
            number = self.handle(obj)["$handle"]
            if number in out:
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
        reply: dict[str, Any] = {"ok": json.loads(json.dumps(report, default=json_default))}
        if json.dumps([trace, config], sort_keys=True, default=json_default) != before:
            reply["trace"] = json.loads(json.dumps(trace, default=json_default))
            reply["config"] = json.loads(json.dumps(config, default=json_default))
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
    owner: Any = None   # the module or object simulate came from: it may declare CBATCH_UNSUPPORTED
    for label, target in modules:
        fn = target if callable(target) and not inspect.ismodule(target) and not inspect.isclass(target) else None
        candidates = {"simulate": fn or getattr(target, "simulate", None)}
        candidates.update({part: getattr(target, part, None) for part in PARTS})
        for name, value in candidates.items():
            if name not in names and callable(value):
                names[name], sources[name] = value, label
                owner = target if name == "simulate" else owner
    described: dict[str, Any] = {"parts": [p for p in PARTS if p in names], "sources": sources, "simulate": None}
    if "simulate" in names:
        described["unsupported"] = _declared(names["simulate"], owner)
    if "simulate" in names:
        try:
            params = inspect.signature(names["simulate"]).parameters.values()
            accepted = [p.name for p in params if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)]
            described["simulate"] = {"accepted": accepted, "open": any(p.kind is p.VAR_KEYWORD for p in params)}
        except (TypeError, ValueError):
            described["simulate"] = {"accepted": [], "open": True}
    return names, described


def _declared(fn: Any, owner: Any) -> Any:
    """``CBATCH_UNSUPPORTED`` of ``fn``, else of ``owner``, as JSON the parent validates (``support``):
    a list's strings as they are, anything else named by its type so the parent's message shows it."""
    for where in (fn, owner):
        value = getattr(where, "CBATCH_UNSUPPORTED", None)
        if value is not None:
            if isinstance(value, (list, tuple)):
                return [item if isinstance(item, str) else f"<{type(item).__name__}>" for item in value[:1000]]
            return f"<{type(value).__name__}>"
    return []


def _kit_module(folder: str | None) -> Any:
    """The kit's ``child_search`` (and its lifecycle machines), imported from the environment only: the
    submission's folder is off ``sys.path`` meanwhile, so none of its files can stand in for them."""
    saved = list(sys.path)
    sys.path[:] = [p for p in sys.path if p not in (folder, "", ".")]
    try:
        from pytest_cbatch.sandbox import child_search
        import pytest_cbatch.lifecycle  # noqa: F401
    finally:
        sys.path[:] = saved
    return child_search


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
        writer.write(b"".join(encode_line(reply, json_default) for reply in replies))
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
            if watch is not None and request.get("op") != "search":  # a search's lines say where it is
                watch.arm()
            reply = server.dispatch(request)
        except SystemExit as exc:
            reply = exited(exc)
        except BaseException as exc:  # noqa: BLE001 - the submission's errors are data for the parent
            stack = getattr(exc, "cbatch_stack", None)   # a program's refusal: its stderr (sandbox.program)
            reply = raised(exc, stack if isinstance(stack, str) else own_stack(exc, server.folder))
        if watch is not None:
            watch.disarm()
        send(reply)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
