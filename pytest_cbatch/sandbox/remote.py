"""Remote objects: a sandboxed submission's objects as the grader's code sees them, over any channel.

A ``RemoteObject`` stands for one object of the submission; reading an
attribute, calling it, or using ``len``/``iter``/``[]``/``in`` on it is one
request on its ``Channel``.  Plain data comes back as copies, other objects as
further ``RemoteObject`` handles, and an exception raised by the submission is
re-raised as a subclass of the nearest built-in exception with the same name
(so ``except ValueError`` works).  The channel decides how a request is
answered: on the grader's side ``proxies.LiveChannel`` sends it to the
sandbox child and waits, and ``search.SearchChannel`` takes the answer from
the child's record of a search; in the child, ``child_search.RecordingChannel``
answers it in process and records it.  Because they all share this class,
code driven through any of them makes the same requests in the same order.
Both sides import this module; it imports only ``protocol``.
"""

from __future__ import annotations

import builtins
import weakref
from typing import Any, Mapping

from .. import untrusted
from .protocol import SandboxFailure, decode, encode

__all__ = ["Channel", "RecordChannel", "RemoteClass", "RemoteNamespace", "RemoteObject", "remote_error"]

_REMOTE_ERRORS: dict[tuple[str, str], type[Exception]] = {}


def remote_error(info: Mapping[str, Any]) -> Exception:
    """An exception of the child's type name, deriving from the built-in it derives from there; the name and
    message are the child's words, so bounded (a name is an identifier of at most 80 characters)."""
    base = getattr(builtins, str(info.get("builtin")), Exception)
    if not (isinstance(base, type) and issubclass(base, Exception)):
        base = Exception
    name = _type_name(info.get("type"))
    cls = _REMOTE_ERRORS.get((name, base.__name__))
    if cls is None:
        cls = base if base.__name__ == name else type(name, (base,), {"__module__": "sandboxed"})
        _REMOTE_ERRORS[(name, base.__name__)] = cls
    return cls(untrusted.text(info.get("message", "")))


def raised_text(info: Any) -> tuple[str, str]:
    """``("Type: message", traceback)`` of a ``raised`` reply, each bounded (the traceback to its last 4000
    characters, where the submission's own line is)."""
    if not isinstance(info, Mapping):
        return "an exception the child did not describe", ""
    stack = info.get("stack")
    return (f"{_type_name(info.get('type'))}: {untrusted.text(info.get('message', ''))}",
            untrusted.text(stack[-4000:], None) if isinstance(stack, str) else "")


def exit_value(value: Any) -> str:
    """What a submission passed to ``sys.exit``, as its child reported it, for a message: bounded."""
    if value is None or (type(value) is int and abs(value) < 1 << 63):
        return repr(value)
    return repr(untrusted.text(value, 200))


def _type_name(name: Any) -> str:
    return name if isinstance(name, str) and name.isidentifier() and len(name) <= 80 else "Exception"


class Channel:
    """How requests about remote objects are answered; subclasses implement ``exchange``.

    ``generation`` names the current set of remote objects: a proxy of an
    older generation (its process restarted, or its example ended) refuses
    every request.  ``methods`` remembers (type, name) pairs known to be plain
    methods, so looking one up again costs no request.
    """

    label = "submission"

    def __init__(self) -> None:
        self.methods: set[tuple[str, str]] = set()
        self.live: weakref.WeakValueDictionary[tuple[int, int], RemoteObject] = weakref.WeakValueDictionary()

    @property
    def generation(self) -> int:
        raise NotImplementedError

    def exchange(self, message: dict[str, Any], generation: int | None) -> dict[str, Any]:
        """The reply to one request (``generation``: the objects it names are of that generation)."""
        raise NotImplementedError

    def cached(self, handle: int, generation: int, name: str) -> tuple[bool, Any]:
        """``(True, value)`` when attribute ``name`` of object ``handle`` is known without a request."""
        return False, None

    def released(self, handle: int, generation: int) -> None:
        """The last proxy of object ``handle`` of the child of ``generation`` is gone."""

    def read(self, obj: RemoteObject, name: str) -> Any:
        """``obj.name`` for a name that is not a known method: one ``getattr`` request unless the answer is
        known without one.  A channel may answer it faster, as long as it makes the same requests."""
        hit, value = self.cached(obj._handle, obj._generation, name)
        if hit:
            return value
        reply = self.ask({"op": "getattr", "target": {"$handle": obj._handle}, "name": name}, obj._generation)
        if reply.get("method"):
            self.methods.add((obj._type, name))
            return _RemoteMethod(obj, name)
        return self.value(reply)

    def ask(self, message: dict[str, Any], generation: int | None = None) -> dict[str, Any]:
        """Exchange ``message``; raise what the reply says went wrong, else return it."""
        reply = self.exchange(message, generation)
        if "ok" not in reply:
            self.ask_failed(reply)
        return reply

    def ask_failed(self, reply: dict[str, Any]) -> None:
        """Raise what a reply without a value says went wrong."""
        if "raised" in reply:
            raise remote_error(reply["raised"])
        if "exited" in reply:
            raise SandboxFailure("died", f"the {self.label} called sys.exit({exit_value(reply['exited'])})")
        raise SandboxFailure("garbage", f"unexpected reply from the {self.label}: {reply!r:.200}")

    def value(self, reply: dict[str, Any]) -> Any:
        """The reply's value: as it came when marked ``raw`` (plain JSON, see ``protocol.native_copy``), else
        decoded."""
        return reply["ok"] if reply.get("raw") else decode(reply["ok"], self.proxy)

    def proxy(self, tag: dict[str, Any]) -> RemoteObject:
        """One proxy per live remote object, so the child frees it only when the last proxy goes."""
        key = (self.generation, tag["$handle"])
        found = self.live.get(key)
        if found is None:
            found = self.live[key] = RemoteObject(self, tag, self.generation)
        return found

    def args(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> dict[str, Any]:
        return {"args": encode(list(args), _handle_of),
                "kwargs": [[k, encode(v, _handle_of)] for k, v in kwargs.items()]}


class RecordChannel(Channel):
    """A channel of a searched part (either side): plain attribute reads are answered from memory.

    A ``getattr`` reply marked ``plain`` read an instance attribute, which no
    code of the submission's runs to read again; until the next request of
    another kind, reading it again needs no request on either side.  The
    grader's and the child's channels keep the same memory, so they still make
    the same requests.
    """

    def __init__(self) -> None:
        super().__init__()
        self.reads: dict[tuple[int, str], tuple[bool, Any]] = {}  # (handle, name) -> (raw, value)

    def cached(self, handle: int, generation: int, name: str) -> tuple[bool, Any]:
        found = self.reads.get((handle, name)) if generation == self.generation else None
        if found is None:
            return False, None
        return True, found[1] if found[0] else decode(found[1], self.proxy)

    def remember(self, message: dict[str, Any], reply: dict[str, Any]) -> None:
        """Forget every answer once a request of another kind than a plain read is made; keep a plain read's
        answer."""
        if message["op"] == "getattr":
            self._remember_read(message["target"]["$handle"], message["name"], reply)
        else:
            self.reads.clear()

    def _remember_read(self, handle: int, name: str, reply: dict[str, Any]) -> None:
        if reply.get("plain") and "ok" in reply:
            self.reads[(handle, name)] = (bool(reply.get("raw")), reply["ok"])
        elif not reply.get("method"):
            self.reads.clear()

    def read_answer(self, obj: RemoteObject, name: str, reply: dict[str, Any]) -> Any:
        """What ``read`` makes of the reply to ``obj``'s ``getattr`` of ``name``, remembered as ``remember``
        does: for the channels that answer reads without building each request."""
        self._remember_read(obj._handle, name, reply)
        if "ok" not in reply:
            self.ask_failed(reply)
        if reply.get("method"):
            self.methods.add((obj._type, name))
            return _RemoteMethod(obj, name)
        return reply["ok"] if reply.get("raw") else decode(reply["ok"], self.proxy)


def _handle_of(obj: Any) -> dict[str, Any]:
    if isinstance(obj, RemoteObject):
        obj._check()
        return {"$handle": object.__getattribute__(obj, "_handle")}
    raise TypeError(f"cannot pass {type(obj).__name__} to the sandbox: only plain data and its own objects")


class RemoteObject:
    """A handle to an object living in the sandbox child."""

    __slots__ = ("_channel", "_handle", "_type", "_kind", "_generation", "__weakref__")

    def __init__(self, channel: Channel, tag: Mapping[str, Any], generation: int) -> None:
        object.__setattr__(self, "_channel", channel)
        object.__setattr__(self, "_handle", tag["$handle"])
        object.__setattr__(self, "_type", tag.get("$type", "?"))
        object.__setattr__(self, "_kind", tag.get("$kind", "object"))
        object.__setattr__(self, "_generation", generation)
        weakref.finalize(self, channel.released, tag["$handle"], generation)

    def _check(self) -> None:
        if self._generation != self._channel.generation:
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
        return channel.read(self, name)

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
    """A bound method of a remote object; calling it is one request."""

    def __init__(self, target: RemoteObject, name: str) -> None:
        self.target, self.name = target, name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.target._ask("call", method=self.name, **self.target._channel.args(args, kwargs))

    def __repr__(self) -> str:
        return f"<sandboxed method {self.name} of {self.target!r}>"


class RemoteClass:
    """A lifecycle class of the submission; calling it constructs an object in the child."""

    def __init__(self, channel: Channel, name: str) -> None:
        self.channel, self.__name__ = channel, name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.channel.value(self.channel.ask({"op": "new", "name": self.__name__,
                                                    **self.channel.args(args, kwargs)}))

    def __repr__(self) -> str:
        return f"<sandboxed class {self.__name__}>"


class RemoteNamespace:
    """What the lifecycle suites see: an attribute per lifecycle class the submission offers."""

    def __init__(self, channel: Channel, parts: list[str], label: str) -> None:
        for part in parts:
            setattr(self, part, RemoteClass(channel, part))
        self._label = label

    def __repr__(self) -> str:
        return f"<sandboxed {self._label}>"
