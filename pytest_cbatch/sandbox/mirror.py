"""Mirrored lifecycle steps: the sandbox child runs each step first, the parent judges it from the record.

Judging a lifecycle part over remote objects costs one round trip per
request the machine makes (a method call, an attribute read, ``len`` of a
view): tens per step, thousands per example.  Here each step costs one.  The
parent's machine, about to run a rule or an invariant, sends the step's name
and arguments to the child (``mirror_child``), which runs the kit's own
machine for that step on the submission in its process and writes every
request that machine makes, with the submission's answer, as it goes.  The
parent then runs the step itself, unchanged: each request its machine makes
is taken from those lines, after checking it is the one the child made.  So
every verdict is still computed here, from the submission's own answers, and
a failure's replay script is the parent's.  After a rule, the child also
runs the invariants that followed the previous rule, so the usual step is
one exchange.

Both machines are the same code seeing the same answers, so they make the
same requests.  Should they ever differ (a submission that tampers with the
child's copy of the kit, an order that depends on the process), the parent
raises ``MirrorDiverged``, which ends the part's search at once, and the
part is judged again over the live channel (``lifecycle_verdicts`` as
before).  Limits apply as over the live channel: a request the child does
not answer within ``call_seconds`` times out at that request, and a child
that dies fails the requests after it.
"""

from __future__ import annotations

from typing import Any, TypeVar

from .child import encode
from .process import Sandbox, SandboxFailure
from .remote import RecordChannel, RemoteNamespace

__all__ = ["MirrorDiverged", "ReplayChannel", "lifecycle_verdicts_of", "mirrored"]

_T = TypeVar("_T")
KIT_SECONDS = 60.0
"""Added to the call limit while a child imports the kit and Hypothesis for its first mirrored step."""


class MirrorDiverged(BaseException):
    """The child's run of a step made other requests than the parent's.

    A ``BaseException``, so no check mistakes it for the submission's error:
    it ends the search, and the part is judged over the live channel instead.
    """


class ReplayChannel(RecordChannel):
    """Answers the parent machine's requests from the child's record of the current step."""

    def __init__(self, sandbox: Sandbox, parts: list[str]) -> None:
        super().__init__()
        self.sandbox, self.label, self.parts = sandbox, sandbox.label, parts
        self.example = 0
        self.child = 0              # the sandbox generation the current example runs in
        self.starting = False       # the next step begins a new example in the child
        self.open = False           # the last request's lines are not all read
        self.after_rule: list[list[Any]] = []   # the invariant steps that followed the last rule
        self.tail: list[list[Any]] = []
        self.exchanges = 0          # mirror requests sent (for the benchmark and the tests)
        # Set once: the part is then judged over the live channel (kept should Hypothesis report its own error).
        self.divergence: MirrorDiverged | None = None
        self.namespace = RemoteNamespace(self, parts, sandbox.label)
        self.kit_in = -1            # the sandbox generation whose child has imported the kit

    @property
    def generation(self) -> int:
        return self.example

    # ------------------------------------------------------------ examples

    def new_example(self) -> None:
        """A new machine instance: its objects are new, and the child makes a new machine for it."""
        self.finish()
        self.example += 1
        self.methods.clear()
        self.reads.clear()
        self.starting = True

    def finish(self) -> None:
        """Read what is left of the last request's lines (an example that ended early leaves some)."""
        while self.open:
            try:
                line = self._line()
            except SandboxFailure:
                return
            self.open = "seg" in line or "rec" in line

    # --------------------------------------------------------------- steps

    def step(self, machine: Any, name: str, kwargs: dict[str, Any]) -> None:
        """The parent's machine starts judged step ``name``: take the child's record of it.

        The record is the next step of the child's lines when the child ran it
        ahead; otherwise one ``mirror`` request runs it (and, after a rule,
        the invariants expected to follow).
        """
        encoded = [[k, encode(v, _plain)] for k, v in kwargs.items()]
        here = [name, encoded]
        self._learn(here, name)
        if self.open:
            line = self._line()
            if line.get("seg") == here:
                return
            if "seg" in line or "rec" in line:
                raise self._diverged(f"the child ran {_what(line)} where the grader runs {name}")
            self._final(line)
        if not self.starting and (self.sandbox.generation != self.child or not self.sandbox.alive()):
            return  # the child died during this example: every request of the step fails as "gone"
        steps = [here, *(self.after_rule if encoded else ())]
        request: dict[str, Any] = {"op": "mirror", "steps": steps, "shortest": machine.shortest.lines}
        if self.starting:
            request["start"] = {"part": machine.part, "disabled": sorted(machine.disabled), "parts": self.parts,
                                "label": self.label, "example": self.example}
        self.exchanges += 1
        importing = self.kit_in != self.sandbox.generation or not self.sandbox.alive()
        try:  # the first line comes before any of the submission's code runs: only the kit's work is waited for
            first = self.sandbox.request(request, "lifecycle", extra_seconds=KIT_SECONDS if importing else 0.0)
        except SandboxFailure as exc:
            raise self._diverged(f"the child could not begin mirroring: {exc}") from None
        self.child, self.starting, self.open = self.sandbox.generation, False, True
        self.kit_in = self.child
        if first.get("seg") != here:
            self.open = "seg" in first or "rec" in first  # a final line (the child could not run it) ends the reply
            raise self._diverged(f"the child did not start step {name}: {_what(first)}")

    def _learn(self, here: list[Any], name: str) -> None:
        """Keep the argument-less steps (invariants) that followed the last rule, to run them ahead next time."""
        if name == "teardown":
            return
        if here[1]:
            self.after_rule, self.tail = self.tail, []
        else:
            self.tail.append(here)

    # ------------------------------------------------------------ requests

    def exchange(self, message: dict[str, Any], generation: int | None) -> dict[str, Any]:
        if generation is not None and generation != self.example:
            raise self._gone()
        if not self.open:
            if self.sandbox.generation != self.child or not self.sandbox.alive():
                raise self._gone()
            raise self._diverged(f"the child's step ended before the grader's request {message!r:.200}")
        line = self._line()
        record = line.get("rec")
        if not isinstance(record, list) or len(record) != 2 or record[0] != message:
            if "rec" not in line and "seg" not in line:
                self.open = False
            raise self._diverged(f"the child made {_what(line)} where the grader makes {message!r:.200}")
        reply = record[1] if isinstance(record[1], dict) else {}
        if "exited" in reply:  # as over the live channel: its state is suspect
            self.open = False
            self.sandbox.kill()
        self.remember(message, reply)
        return reply

    def _gone(self) -> SandboxFailure:
        return SandboxFailure("died", f"the {self.label}'s objects are gone: its process was restarted after an "
                                      f"earlier failure")

    def _diverged(self, message: str) -> MirrorDiverged:
        diverged = MirrorDiverged(message)
        self.divergence = self.divergence or diverged
        return diverged

    def _line(self) -> dict[str, Any]:
        try:
            return self.sandbox.receive("lifecycle", self.child)
        except SandboxFailure:
            self.open = False
            raise

    def _final(self, line: dict[str, Any]) -> None:
        """The last line of a request: the child's own verdict on running it is of no interest here."""
        self.open = False
        if "ok" not in line:
            raise self._diverged(f"the child could not run the step: {_what(line)}")


def mirrored(cls: type[_T], channel: ReplayChannel) -> type[_T]:
    """A subclass of the lifecycle machine ``cls`` (bound to ``channel.namespace``) whose every judged
    step and teardown the sandbox child runs first (see the module docstring)."""

    class Mirrored(cls):  # type: ignore[valid-type, misc]
        def __init__(self) -> None:
            super().__init__()
            channel.new_example()

        def before_step(self, name: str, kwargs: dict[str, Any]) -> None:
            channel.step(self, name, kwargs)

        def teardown(self) -> None:
            if channel.divergence is not None:  # the search is over; nothing more is asked of the child
                return
            if not (self.failed or self.halted or not self.started):  # the same test as the teardown's own
                channel.step(self, "teardown", {})
            super().teardown()
            channel.finish()

    Mirrored.__name__ = Mirrored.__qualname__ = cls.__name__
    Mirrored.__doc__ = cls.__doc__
    return Mirrored  # type: ignore[return-value]


def lifecycle_verdicts_of(impl: Any, part: str, settings: Any = None, **options: Any) -> tuple[dict[str, Any], str]:
    """``lifecycle_verdicts(part, ...)`` of ``impl``: searched by its child (``search``) when it offers
    ``lifecycle_channel`` (a sandboxed submission), over its plain ``namespace`` otherwise; returns
    ``(verdicts, note)``.

    When the child's search stops early (it died, timed out or exited), the
    part is judged again with mirrored steps; when its lines differ from the
    grader's run, too, and ``note`` says so; when mirrored steps differ, the
    part is judged once more over the live channel, as ``note`` says.  The
    time of a part's earlier tries is not counted against the submission's
    limits.  ``options`` go to ``lifecycle_verdicts``.
    """
    from ..lifecycle import lifecycle_verdicts
    from .search import SearchChannel, SearchStopped, run_search, searched

    channel_of = getattr(impl, "lifecycle_channel", None)
    if channel_of is None:
        return lifecycle_verdicts(part, impl.namespace, settings, **options), ""
    search = channel_of(SearchChannel)
    tally = search.sandbox.tally()
    try:
        return lifecycle_verdicts(part, search.namespace, settings, wrap=lambda cls: searched(cls, search),
                                  search=lambda machine, stage: run_search(search, machine, stage), **options), ""
    except SearchStopped:
        note = ""
    except MirrorDiverged as exc:
        note = (f"lifecycle {part}: judged one step at a time, since the sandbox's search differed from the "
                f"grader's run of it ({exc})")
    impl.close()  # its child is part-way through a search; the next request starts a fresh one
    search.sandbox.rewind(tally)
    channel = channel_of(ReplayChannel)
    try:
        verdicts = lifecycle_verdicts(part, channel.namespace, settings, wrap=lambda cls: mirrored(cls, channel),
                                      **options)
        if channel.divergence is None:
            return verdicts, note
        # The search ended at a divergence, but Hypothesis reported its own error for the example it cut
        # short (a FlakyStrategyDefinition, when an earlier example drew further): the verdicts are not judged.
        raise channel.divergence
    except MirrorDiverged as exc:
        impl.close()
        search.sandbox.rewind(tally)
        note = (f"lifecycle {part}: judged one request at a time, since the sandbox's record of a step differed "
                f"from the grader's run of it ({exc})")
        return lifecycle_verdicts(part, impl.namespace, settings, **options), note


def _plain(obj: Any) -> dict[str, Any]:
    raise TypeError(f"a lifecycle step's arguments are plain data, not {type(obj).__name__}")


def _what(line: dict[str, Any]) -> str:
    if "seg" in line:
        return f"step {line['seg'][0] if isinstance(line['seg'], list) and line['seg'] else line['seg']!r}"
    if "rec" in line:
        return f"request {line['rec'][0]!r:.200}" if isinstance(line["rec"], list) and line["rec"] else "a request"
    if "g" in line:
        return f"a read of {line['g'][1]!r:.200}" if isinstance(line["g"], list) and len(line["g"]) > 2 else "a read"
    if "c" in line:
        return f"a call of {line['c'][1]!r:.200}" if isinstance(line["c"], list) and len(line["c"]) > 2 else "a call"
    if "raised" in line:
        raised = line["raised"]
        return f"an error: {raised.get('type')}: {raised.get('message')}" if isinstance(raised, dict) else "an error"
    return f"{line!r:.200}"

