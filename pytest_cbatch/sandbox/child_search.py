"""The sandbox child's side of a searched lifecycle part (the grader's side is ``search``).

The child runs the kit's own lifecycle machine for the part being judged,
under its own Hypothesis search (the settings the grader sent), against the
submission in this process.  Every request the machine makes of the
submission's objects is answered here at once and written to the grader, one
line each (``protocol``'s search lines), streamed in batches by size and age
(``RecordingChannel.write``): the grader runs the same search and reads its
answers from those lines instead of waiting for each.  Nothing here judges:
the machine's own verdicts in this process are thrown away, and the grader's
run decides.  Imported by ``child._kit_module`` only, never by the grader.
"""

from __future__ import annotations

import time
from typing import Any, Callable

from hypothesis import seed as hypothesis_seed
from hypothesis.stateful import run_state_machine_as_test

from ..lifecycle import MACHINES, SHRINK_SECONDS, shrink_budget, steady_draws
from .protocol import decode, encode, exited, plain_only, raised, read_line, request_line, search_settings
from .remote import RecordChannel, RemoteNamespace

__all__ = ["RecordingChannel", "SearchSession"]

SendAll = Callable[[list[dict[str, Any]]], None]
STREAM_LINES = 256
STREAM_SECONDS = 0.01
"""Queued lines are sent once there are STREAM_LINES of them, or once STREAM_SECONDS have passed since lines
were last sent."""


class RecordingChannel(RecordChannel):
    """Answers each request from the submission in this process (``server``: the child's ``Server``) and
    queues its line for the grader."""

    def __init__(self, server: Any, send_all: SendAll) -> None:
        super().__init__()
        self.server, self.send_all = server, send_all
        self.example = 0
        self.lines: list[dict[str, Any]] = []
        self.since = -STREAM_SECONDS  # when lines were last sent: the first goes at once

    @property
    def generation(self) -> int:
        return self.example

    def write(self, line: dict[str, Any]) -> None:
        """Queue ``line``; send the queue once it is long or old.

        The grader reads ahead, so nothing need be sent before each of the
        submission's calls: a call that hangs times out with lines unsent,
        and the grader judges the part again over the live channel, which
        times out at that call.
        """
        lines = self.lines
        lines.append(line)
        if len(lines) >= STREAM_LINES or (len(lines) % 16 == 1 and time.monotonic() - self.since > STREAM_SECONDS):
            self.flush()  # the clock is read at every 16th line: reading it costs more than a line

    def flush(self) -> None:
        """Send the queued lines as one ``{"batch": [...]}`` line (the grader's reader unpacks it)."""
        if self.lines:
            lines, self.lines = self.lines, []
            self.send_all([{"batch": lines}])
        self.since = time.monotonic()

    def read(self, obj: Any, name: str) -> Any:
        """A read as ``exchange`` would answer it, without building the request."""
        handle = obj._handle
        found = self.reads.get((handle, name))
        if found is not None:
            return found[1] if found[0] else decode(found[1], self.proxy)
        target = self.server.objects.get(handle)
        try:
            if target is None:
                raise LookupError(f"no remote object #{handle} (released, or from before a restart)")
            reply = self.server.read(target, name, handle, recorded=True)
        except SystemExit as exc:
            reply = exited(exc)
        except BaseException as exc:  # noqa: BLE001 - the submission's errors are data for the grader
            reply = raised(exc)
        self.write(read_line(handle, name, reply))
        return self.read_answer(obj, name, reply)

    def exchange(self, message: dict[str, Any], generation: int | None) -> dict[str, Any]:
        try:
            reply = self.server.dispatch(message, recorded=True)
        except SystemExit as exc:
            reply = exited(exc)
        except BaseException as exc:  # noqa: BLE001 - the submission's errors are data for the grader
            reply = raised(exc)
        self.remember(message, reply)
        self.write(request_line(message, reply))
        return reply


class SearchSession:
    """One search of a lifecycle part in this child; ``search`` answers the grader's ``search`` request."""

    def __init__(self, server: Any, send_all: SendAll) -> None:
        self.server = server
        self.channel = RecordingChannel(server, send_all)

    def search(self, spec: dict[str, Any]) -> dict[str, Any]:
        """Run one search of ``spec["part"]`` here, as ``lifecycle_verdicts`` would in process (shrinking
        included), under the settings ``spec["settings"]`` describes (``protocol.search_settings``).

        Each example writes ``{"ex": n}`` as its machine is made, then its
        steps and requests; the reply says whether the search failed:
        ``{"ok": {"failed": bool}}``.
        """
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
                channel.write({"seg": [name, [[k, encode(v, plain_only)] for k, v in kwargs.items()]]})

            def teardown(self) -> None:
                if not (self.failed or self.halted or not self.started):  # as the grader's machine does
                    channel.write({"seg": ["teardown", []]})
                super().teardown()

        Searched.__name__ = Searched.__qualname__ = cls.__name__
        Searched.__doc__ = cls.__doc__
        settings, seed = search_settings(spec["settings"], shrink=True)
        if seed is not None:
            Searched = hypothesis_seed(seed)(Searched)
        try:
            with shrink_budget(SHRINK_SECONDS), steady_draws():
                run_state_machine_as_test(Searched, settings=settings)
        except Exception:  # noqa: BLE001 - the grader judges the examples; here only "it failed" matters
            return {"ok": {"failed": True}}
        finally:
            channel.flush()
        return {"ok": {"failed": False}}
