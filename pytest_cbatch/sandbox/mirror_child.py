"""The sandbox child's side of a mirrored lifecycle step (see ``mirror``).

The child runs the kit's own lifecycle machine for the part being judged,
driven by the steps the parent sends, against the submission in this process.
Every request the machine makes of the submission's objects is answered here
at once and written to the parent, one line each: the parent then runs the
same step and reads its answers from those lines instead of waiting for each.
Lines are written in batches (one ``{"batch": [...]}`` line each), but always
before a request that runs code of the submission's, so a call that hangs
leaves the parent every line before it and times out at that call.  Nothing here judges: the machine's own
verdicts in this process are thrown away, and the parent's run of the step
decides.
"""

from __future__ import annotations

from typing import Any, Callable

from .child import Server, _plain_read, encode, raised
from .remote import RecordChannel, RemoteNamespace

__all__ = ["MirrorSession"]

SendAll = Callable[[list[dict[str, Any]]], None]


class RecordingChannel(RecordChannel):
    """Answers each request from the submission in this process and queues it for the parent."""

    def __init__(self, server: Server, send_all: SendAll) -> None:
        super().__init__()
        self.server, self.send_all = server, send_all
        self.example = 0
        self.lines: list[dict[str, Any]] = []

    @property
    def generation(self) -> int:
        return self.example

    def write(self, line: dict[str, Any]) -> None:
        self.lines.append(line)

    def flush(self) -> None:
        """Send the queued lines as one ``{"batch": [...]}`` line (the parent's reader unpacks it)."""
        if self.lines:
            lines, self.lines = self.lines, []
            self.send_all([{"batch": lines}])

    def exchange(self, message: dict[str, Any], generation: int | None) -> dict[str, Any]:
        if not self._reads_only(message):
            self.flush()
        try:
            reply = self.server.dispatch(message, snapshots=False)
        except SystemExit as exc:
            reply = {"exited": exc.code if isinstance(exc.code, int) or exc.code is None else str(exc.code)}
        except BaseException as exc:  # noqa: BLE001 - the submission's errors are data for the parent
            reply = raised(exc)
        self.remember(message, reply)
        self.write({"rec": [message, reply]})
        return reply

    def _reads_only(self, message: dict[str, Any]) -> bool:
        """Whether answering ``message`` runs none of the submission's code (a plain attribute or a method's
        lookup), so its line may wait in the batch."""
        if message["op"] != "getattr":
            return False
        target = self.server.objects.get(message["target"]["$handle"])
        return target is not None and _plain_read(target, message["name"])


class MirrorSession:
    """The current example's machine in this child; ``run`` answers one ``mirror`` request."""

    def __init__(self, server: Server, send_all: SendAll) -> None:
        self.server = server
        self.channel = RecordingChannel(server, send_all)
        self.machine: Any = None

    def run(self, request: dict[str, Any]) -> dict[str, Any]:
        """Run ``request["steps"]`` (``[name, kwargs]`` each, ``teardown`` included) in order, stopping at
        the first that raises; ``start`` first begins a new example of ``start["part"]``."""
        if "start" in request:
            self.begin(request["start"])
        machine = self.machine
        machine.shortest.lines = request.get("shortest")
        done = 0
        try:
            for name, kwargs in request["steps"]:
                if name == "teardown":
                    self.channel.write({"seg": [name, []]})
                    machine.teardown()
                else:
                    getattr(machine, name)(**self.server.into({"$dict": kwargs}))
                done += 1
        except BaseException as exc:  # noqa: BLE001 - the step failed here; the parent sees it fail too
            return {"ok": done, "stopped": type(exc).__name__}
        finally:
            self.channel.flush()
        return {"ok": done}

    def begin(self, start: dict[str, Any]) -> None:
        """A fresh machine for a new example: the objects of the last one are dropped."""
        from ..lifecycle import MACHINES

        self.server.drop(list(self.server.objects))
        channel = self.channel
        channel.example = start["example"]
        channel.methods.clear()
        channel.reads.clear()
        namespace = RemoteNamespace(channel, [p for p in start["parts"] if p in self.server.names], start["label"])
        cls = MACHINES[start["part"]](namespace, frozenset(start["disabled"]))

        class Recorded(cls):  # type: ignore[valid-type, misc]
            def before_step(self, name: str, kwargs: dict[str, Any]) -> None:
                channel.write({"seg": [name, [[k, encode(v, _no_handles)] for k, v in kwargs.items()]]})

        self.machine = Recorded()


def _no_handles(obj: Any) -> dict[str, Any]:
    raise TypeError(f"a lifecycle step's arguments are plain data, not {type(obj).__name__}")
