"""Searched lifecycle parts, the grader's side: the sandbox child runs a whole search ahead, the grader
judges it as it comes (the child's side is ``child_search``).

Judging a part over remote objects one request at a time (the live channel,
``proxies.LiveChannel``) costs a round trip per request the machine makes:
tens per step, thousands per example.  Here the child runs the search
itself.  For each search ``lifecycle_verdicts`` makes, the grader sends the
part, the disabled clauses and the settings (with a seed, unless they are
derandomized); the child runs the same search on the submission, writing
``{"ex": n}`` as each example starts and then every step and request with the
submission's answer (``protocol``'s search lines).  The grader runs the same
search meanwhile, over this channel: each example, step and request of its
own run is checked against the next line and answered from it.  So both
processes work at once, and every verdict is still computed here.

Both searches are the same code, seed and settings seeing the same answers,
and neither draws constants from the modules its process has loaded
(``lifecycle.steady_draws``), so they draw the same examples, up to the
first failing one.  There they part: shrinking is capped in seconds, so the
two would shrink differently.  The grader therefore does not shrink: its
Hypothesis runs its first failing example again (answered from that
example's lines) and reports it.  Then the grader reads on to the end of the
child's search, which shrank the failure, and judges the child's last
example (the shrunk one Hypothesis ran again) from its lines.  The violation
found there is the verdict, with its replay; should that example not fail
here, the grader's own first violation is.

When the lines differ from the grader's run (``SearchDiverged``: a
submission that patches the child's copy of the kit, say), or the child
dies, times out or exits during a search (``SearchStopped``), the part is
judged again over the live channel, which restarts the child after each
failure and goes on (``lifecycle_verdicts_of``).
"""

from __future__ import annotations

from collections import deque
from typing import Any, TypeVar

from hypothesis import seed as hypothesis_seed
from hypothesis import settings as Settings
from hypothesis.stateful import RuleBasedStateMachine, run_state_machine_as_test

from ..lifecycle import LifecycleViolation, lifecycle_verdicts, steady_draws
from ..lifecycle.machine import final_run
from .process import Sandbox, SandboxFailure
from .protocol import (
    decode, describe_line, encode, of_example, plain_only, read_reply, reply_to, search_settings, settings_document,
)
from .remote import RecordChannel, RemoteNamespace

__all__ = ["KIT_SECONDS", "MAX_EXAMPLE_LINES", "SearchChannel", "SearchDiverged", "SearchStopped", "lifecycle_verdicts_of",
           "run_search", "searched"]

_T = TypeVar("_T")
KIT_SECONDS = 60.0
"""Added to the call limit of a search's first line while the child imports the kit and Hypothesis."""
MAX_EXAMPLE_LINES = 1 << 18
"""Lines of one example of the child's that the grader keeps to judge again (the kit's machines make a few
thousand at most): past it the child's search differs from the grader's."""


class SearchDiverged(BaseException):
    """The child's search made other requests than the grader's run of it.

    A ``BaseException``, so no check mistakes it for the submission's error:
    it ends the search, and the part is judged over the live channel instead.
    """


class SearchStopped(BaseException):
    """The child's search ended early: it died, timed out or exited.  The part is then judged over the live
    channel, which restarts the child and goes on."""


class SearchChannel(RecordChannel):
    """Answers the grader's requests from the child's run of the same search (see the module docstring)."""

    def __init__(self, sandbox: Sandbox, parts: list[str]) -> None:
        super().__init__()
        self.sandbox, self.label, self.parts = sandbox, sandbox.label, parts
        self.example = 0
        self.child = 0              # the sandbox generation running the current search
        self.kit_in = -1            # the sandbox generation whose child has imported the kit
        self.running = False        # the current search's lines are not all read
        self.ahead: deque[dict[str, Any]] = deque()   # lines read, or kept to judge again, not yet used
        self.searches = 0           # searches the child ran (for the benchmark and the tests)
        # Set when the search ends early, to why: nothing more is asked of its lines (see run_search).
        self.ended: SearchStopped | SearchDiverged | None = None
        self.kept: list[dict[str, Any]] = []   # the current example's lines, should Hypothesis run it again
        self.keeping = False        # the grader's own search runs: its lines are kept, example by example
        self.again = False          # Hypothesis runs its failing example again: the kept lines answer it
        self.namespace = RemoteNamespace(self, parts, sandbox.label)

    @property
    def generation(self) -> int:
        return self.example

    # ----------------------------------------------------------- searches

    def start(self, machine: Any, settings: dict[str, Any]) -> None:
        """Have the child begin the search of ``machine``'s part under ``settings`` (``settings_document``)."""
        spec = {"part": machine.part, "disabled": sorted(machine.disabled), "parts": self.parts,
                "label": self.label, "settings": settings}
        self.ended = None
        importing = self.kit_in != self.sandbox.generation or not self.sandbox.alive()
        try:  # the first line comes before any of the submission's code runs: only the kit's work is waited for
            first = self.sandbox.request({"op": "search", "spec": spec}, "lifecycle",
                                         extra_seconds=KIT_SECONDS if importing else 0.0)
        except SandboxFailure as exc:
            raise self._stopped(f"the child could not begin the search: {exc}") from None
        self.child = self.kit_in = self.sandbox.generation
        self.running, self.searches = True, self.searches + 1
        self.keeping, self.again = True, False
        self.ahead.append(first)

    def finish(self) -> list[dict[str, Any]] | None:
        """Read the rest of the child's search; the lines of its last example when the search failed."""
        last: list[dict[str, Any]] | None = None
        self.keeping = self.again = False
        while True:
            line = self._line()
            if "ex" in line:
                last = [line]
            elif of_example(line) and last is not None:
                if len(last) >= MAX_EXAMPLE_LINES:
                    raise self._diverged(f"the child's search wrote more than {MAX_EXAMPLE_LINES} lines for one "
                                         f"example (the grader's MAX_EXAMPLE_LINES)")
                last.append(line)
            else:
                break
        self.running = False
        outcome = line.get("ok")
        if not isinstance(outcome, dict) or of_example(line):
            raise self._diverged(f"the child's search ended with {describe_line(line)}")
        return last if outcome.get("failed") else None

    def abandon(self) -> None:
        """The grader's search ended while the child's goes on: stop the child (the next search restarts it)."""
        if self.running:
            self.running = False
            self.ahead.clear()
            self.sandbox.kill()

    # ------------------------------------------------------- the grader's run

    def new_example(self) -> None:
        """A new machine instance: its objects are new.  When Hypothesis runs its failing example again
        (to report it), the lines of that example answer the run, as the child's next ones would not."""
        if final_run():
            self.ahead.extend(self.kept)
            self.again, self.keeping = True, False
        else:
            self.kept = []
        self.example += 1
        self.methods.clear()
        self.reads.clear()
        line = self._line()
        if "ex" not in line:
            raise self._diverged(f"the child ran {describe_line(line)} where the grader starts an example")

    def step(self, name: str, kwargs: dict[str, Any]) -> None:
        line = self._line()
        if line.get("seg") != [name, [[k, encode(v, plain_only)] for k, v in kwargs.items()]]:
            raise self._diverged(f"the child ran {describe_line(line)} where the grader runs step {name}")

    def read(self, obj: Any, name: str) -> Any:
        """A read, as ``exchange`` would answer it, without building the request (most requests are reads)."""
        handle = obj._handle
        if obj._generation != self.example:
            raise self._gone()
        found = self.reads.get((handle, name))
        if found is not None:
            return found[1] if found[0] else decode(found[1], self.proxy)
        line = self._line()
        reply = read_reply(line.get("g"), handle, name)
        if reply is None:
            raise self._diverged(f"the child made {describe_line(line)} where the grader reads {name!r} of "
                                 f"#{handle}")
        if "exited" in reply:
            raise self._stopped(f"the {self.label} called sys.exit")
        return self.read_answer(obj, name, reply)

    def exchange(self, message: dict[str, Any], generation: int | None) -> dict[str, Any]:
        if generation is not None and generation != self.example:
            raise self._gone()
        line = self._line()
        reply = reply_to(message, line)
        if reply is None:
            raise self._diverged(f"the child made {describe_line(line)} where the grader makes {message!r:.200}")
        if "exited" in reply:  # the live channel restarts the child here; the child's search went on
            raise self._stopped(f"the {self.label} called sys.exit")
        self.remember(message, reply)
        return reply

    def _gone(self) -> SandboxFailure:
        return SandboxFailure("died", f"the objects of the {self.label} are gone: their example has ended")

    def _diverged(self, message: str) -> SearchDiverged:
        self.ended = SearchDiverged(message)
        return self.ended

    def _stopped(self, message: str) -> SearchStopped:
        self.ended = SearchStopped(message)
        return self.ended

    def _line(self) -> dict[str, Any]:
        if self.ahead:
            line = self.ahead.popleft()
        elif self.again or not self.running:
            raise self._diverged("the grader's run goes on past the child's")
        else:
            try:
                line = self.sandbox.receive("lifecycle", self.child)
            except SandboxFailure as exc:
                self.running = False
                raise self._stopped(f"the child's search stopped: {exc}") from None
        if self.keeping:
            self.kept.append(line)
        return line


def searched(cls: type[_T], channel: SearchChannel) -> type[_T]:
    """A subclass of the lifecycle machine ``cls`` (bound to ``channel.namespace``) whose examples, steps
    and requests are read from the child's search."""

    class Searched(cls):  # type: ignore[valid-type, misc]
        def __init__(self) -> None:
            super().__init__()
            channel.new_example()

        def before_step(self, name: str, kwargs: dict[str, Any]) -> None:
            channel.step(name, kwargs)

        def teardown(self) -> None:
            if channel.ended is not None:  # the search is ending with SearchStopped or SearchDiverged
                return
            if not (self.failed or self.halted or not self.started):  # the same test as the teardown's own
                channel.step("teardown", {})
            super().teardown()

    Searched.__name__ = Searched.__qualname__ = cls.__name__
    Searched.__doc__ = cls.__doc__
    return Searched  # type: ignore[return-value]


def run_search(channel: SearchChannel, machine: type[RuleBasedStateMachine], settings: Settings) -> None:
    """A ``lifecycle.verdicts.Search`` over ``channel``: raise the violation of the search, shrunk by the
    child and judged here, or return when it passes (see the module docstring)."""
    doc = settings_document(settings)
    own, seed = search_settings(doc, shrink=False)
    if seed is not None:
        machine = hypothesis_seed(seed)(machine)
    channel.start(machine, doc)
    try:
        with steady_draws():
            run_state_machine_as_test(machine, settings=own)
    except LifecycleViolation as own_violation:
        last = channel.finish()
        raise (_judge_again(machine, channel, last) if last else None) or own_violation from None
    except BaseException:
        channel.abandon()
        if channel.ended is not None:  # Hypothesis may report its own error for the example that cut short
            raise channel.ended from None  # (a FlakyStrategyDefinition, when an earlier example drew further)
        raise
    if channel.finish() is not None:
        raise channel._diverged("the child's search failed where the grader's passed")


def _judge_again(machine: type[RuleBasedStateMachine], channel: SearchChannel,
                 lines: list[dict[str, Any]]) -> LifecycleViolation | None:
    """Judge the child's example ``lines`` here, step by step as the child ran it; its violation, or None."""
    channel.ahead.extend(lines)
    try:
        instance = machine()
        try:
            for line in lines:
                name, kwargs = line.get("seg") or (None, None)
                if name is None or name == "teardown":  # the teardown runs below, as Hypothesis runs it
                    continue
                getattr(instance, name)(**{k: decode(v, plain_only) for k, v in kwargs})
        finally:
            instance.teardown()
    except LifecycleViolation as violation:
        return violation
    except (Exception, SearchDiverged):
        return None
    finally:
        channel.ahead.clear()
    return None


def lifecycle_verdicts_of(impl: Any, part: str, settings: Any = None, **options: Any) -> tuple[dict[str, Any], str]:
    """``lifecycle_verdicts(part, ...)`` of ``impl``: searched by its child when it offers ``lifecycle_channel``
    (a sandboxed submission), over its plain ``namespace`` otherwise; returns ``(verdicts, note)``.

    When the child's search stops early (it died, timed out or exited), the
    part is judged again over the live channel, which handles each of those
    by restarting the child; when its lines differ from the grader's run,
    too, and ``note`` says so.  The time of the searched try is not counted
    against the submission's limits.  ``options`` go to ``lifecycle_verdicts``.
    """
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
    except SearchDiverged as exc:
        note = (f"lifecycle {part}: judged one request at a time, since the sandbox's search differed from the "
                f"grader's run of it ({exc})")
    impl.close()  # its child is part-way through a search; the next request starts a fresh one
    search.sandbox.rewind(tally)
    return lifecycle_verdicts(part, impl.namespace, settings, **options), note
