"""The sandbox child's side of a mirrored lifecycle step (see ``mirror``) or search (see ``search``).

The child runs the kit's own lifecycle machine for the part being judged,
driven by the steps the parent sends (or, for a search, by its own
Hypothesis search), against the submission in this process.  Every request
the machine makes of the submission's objects is answered here at once and
written to the parent, one line each: the parent then runs the same step or
search and reads its answers from those lines instead of waiting for each.
Lines are written in batches (one ``{"batch": [...]}`` line each).  For a
step they go before each request that runs code of the submission's, so a
call that hangs leaves the parent every line before it and times out at that
call; a search streams them by size and age (see ``RecordingChannel.write``).
Nothing here judges: the machine's own verdicts in this process are thrown
away, and the parent's run decides.
"""

from __future__ import annotations

import time
from typing import Any, Callable

from .child import MIRROR_PRELOAD, Server, _plain_read, decode, encode, exited, raised
from .lines import read_line, request_line
from .remote import RecordChannel, RemoteNamespace

__all__ = ["MirrorSession"]

SendAll = Callable[[list[dict[str, Any]]], None]
STREAM_LINES = 256
STREAM_SECONDS = 0.01
"""While a search streams, queued lines are sent once there are STREAM_LINES of them, or once STREAM_SECONDS have
passed since lines were last sent."""


class RecordingChannel(RecordChannel):
    """Answers each request from the submission in this process and queues it for the parent."""

    def __init__(self, server: Server, send_all: SendAll) -> None:
        super().__init__()
        self.server, self.send_all = server, send_all
        self.example = 0
        self.lines: list[dict[str, Any]] = []
        self.preload = MIRROR_PRELOAD
        self.streaming = False  # a search: lines stream ahead in batches by size and age (see ``write``)
        self.since = 0.0  # when the queued lines were last sent

    @property
    def generation(self) -> int:
        return self.example

    def write(self, line: dict[str, Any]) -> None:
        """Queue ``line``; while streaming, send the queue once it is long or old.

        A search streams: its parent reads ahead, so nothing need be sent
        before each of the submission's calls.  A call that hangs then times
        out with lines unsent, and the parent judges the part again with
        mirrored steps, which time out at that call.
        """
        lines = self.lines
        lines.append(line)
        if self.streaming and (len(lines) >= STREAM_LINES or (len(lines) % 16 == 1
                                                              and time.monotonic() - self.since > STREAM_SECONDS)):
            self.flush()  # the clock is read at every 16th line: reading it costs more than a line

    def flush(self) -> None:
        """Send the queued lines as one ``{"batch": [...]}`` line (the parent's reader unpacks it)."""
        if self.lines:
            lines, self.lines = self.lines, []
            self.send_all([{"batch": lines}])
        self.since = time.monotonic()

    def read(self, obj: Any, name: str) -> Any:
        """While streaming, a read as ``exchange`` would answer it, without building the request."""
        if not self.streaming:
            return super().read(obj, name)
        handle = obj._handle
        found = self.reads.get((handle, name))
        if found is not None:
            return found[1] if found[0] else decode(found[1], self.proxy)
        target = self.server.objects.get(handle)
        try:
            if target is None:
                raise LookupError(f"no remote object #{handle} (released, or from before a restart)")
            reply = self.server.read(target, name, handle, self.preload)
        except SystemExit as exc:
            reply = exited(exc)
        except BaseException as exc:  # noqa: BLE001 - the submission's errors are data for the parent
            reply = raised(exc)
        self.write(read_line(handle, name, reply))
        return self.read_answer(obj, name, reply)

    def exchange(self, message: dict[str, Any], generation: int | None) -> dict[str, Any]:
        if not self.streaming and not self._reads_only(message):
            self.flush()
        try:
            reply = self.server.dispatch(message, self.preload)
        except SystemExit as exc:
            reply = exited(exc)
        except BaseException as exc:  # noqa: BLE001 - the submission's errors are data for the parent
            reply = raised(exc)
        self.remember(message, reply)
        self.write(request_line(message, reply) if self.streaming else {"rec": [message, reply]})
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
        the first that raises; ``start`` first begins a new example of ``start["part"]``.  A ``search``
        request runs a whole search instead (``search``)."""
        if "search" in request:
            try:
                return self.search(request["search"])
            finally:
                self.channel.flush()
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

    def search(self, spec: dict[str, Any]) -> dict[str, Any]:
        """Run one search of ``spec["part"]`` here, as ``lifecycle_verdicts`` would in process (shrinking
        included), under the settings ``spec["settings"]`` describes (``search.search_settings``).

        Each example writes ``{"ex": n}`` as its machine is made, then its steps
        and requests as a mirrored step does; the reply says whether the
        search failed: ``{"ok": {"failed": bool}}``.
        """
        from hypothesis import seed as hypothesis_seed
        from hypothesis.stateful import run_state_machine_as_test

        from ..lifecycle import MACHINES, SHRINK_SECONDS, shrink_budget, steady_draws
        from .search import search_settings

        server, channel = self.server, self.channel
        namespace = RemoteNamespace(channel, [p for p in spec["parts"] if p in server.names], spec["label"])
        cls = MACHINES[spec["part"]](namespace, frozenset(spec["disabled"]))

        class Searched(cls):  # type: ignore[valid-type, misc]
            def __init__(self) -> None:
                server.drop(list(server.objects))
                channel.example += 1
                channel.methods.clear()
                channel.reads.clear()
                channel.write({"ex": channel.example})
                super().__init__()

            def before_step(self, name: str, kwargs: dict[str, Any]) -> None:
                channel.write({"seg": [name, [[k, encode(v, _no_handles)] for k, v in kwargs.items()]]})

            def teardown(self) -> None:
                if not (self.failed or self.halted or not self.started):  # as the grader's machine does
                    channel.write({"seg": ["teardown", []]})
                super().teardown()

        Searched.__name__ = Searched.__qualname__ = cls.__name__
        Searched.__doc__ = cls.__doc__
        settings, seed = search_settings(spec["settings"], shrink=True)
        if seed is not None:
            Searched = hypothesis_seed(seed)(Searched)
        # The first line goes at once: the parent waits longer for it, while this child imports the kit.
        channel.streaming, channel.preload, channel.since = True, 0, -STREAM_SECONDS
        try:
            with shrink_budget(SHRINK_SECONDS), steady_draws():
                run_state_machine_as_test(Searched, settings=settings)
        except Exception:  # noqa: BLE001 - the grader judges the examples; here only "it failed" matters
            return {"ok": {"failed": True}}
        finally:
            channel.streaming, channel.preload = False, MIRROR_PRELOAD
        return {"ok": {"failed": False}}


def _no_handles(obj: Any) -> dict[str, Any]:
    raise TypeError(f"a lifecycle step's arguments are plain data, not {type(obj).__name__}")
