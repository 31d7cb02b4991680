"""Searched lifecycle parts: the sandbox child runs a whole search ahead, the grader judges it as it comes.

Mirrored steps (``mirror``) cost one exchange per step, and the two
processes take turns: the child cannot run a step before the grader's
Hypothesis has drawn it.  Here the child draws them itself.  For each search
``lifecycle_verdicts`` makes, the grader sends the part, the disabled clauses
and the settings (with a seed, unless they are derandomized); the child runs
the same search on the submission (``mirror_child.MirrorSession.search``),
writing ``{"ex": n}`` as each example starts and then every step and request
with the submission's answer, as a mirrored step does.  The grader runs the
same search meanwhile, over this channel: each example, step and request of
its own run is checked against the next line and answered from it.  So both
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

When the lines differ from the grader's run (``mirror.MirrorDiverged``), or
the child dies, times out or exits during a search (``SearchStopped``: the
live channel restarts the child where the child's search could not), the
part is judged again with mirrored steps, which handle each of those as the
live channel does.
"""

from __future__ import annotations

import random
from collections import deque
from typing import Any, TypeVar

from hypothesis import HealthCheck, Phase, Verbosity, seed as hypothesis_seed
from hypothesis import settings as Settings
from hypothesis.stateful import RuleBasedStateMachine, run_state_machine_as_test

from ..lifecycle import LifecycleViolation, steady_draws
from ..lifecycle.machine import final_run
from .child import decode, encode
from .mirror import KIT_SECONDS, MirrorDiverged, _what
from .lines import read_reply, reply_to
from .process import Sandbox, SandboxFailure
from .remote import RecordChannel, RemoteNamespace

__all__ = ["SearchChannel", "SearchStopped", "run_search", "search_settings", "searched"]

_T = TypeVar("_T")


class SearchStopped(BaseException):
    """The child's search ended early: it died, timed out or exited.  The part is then judged with
    mirrored steps, which restart the child and go on, as the live channel does."""


def search_settings(doc: dict[str, Any], *, shrink: bool) -> tuple[Settings, int | None]:
    """The settings both sides run one search under, from ``describe``'s document, and its seed (None:
    derandomized).  The child shrinks, the grader does not; neither has a database, a deadline or a
    health check that depends on time."""
    phases = [Phase[name] for name in doc["phases"] if shrink or name != Phase.shrink.name]
    checks = {HealthCheck[name] for name in doc["suppress_health_check"]} | {HealthCheck.too_slow}
    settings = Settings(max_examples=doc["max_examples"], stateful_step_count=doc["stateful_step_count"],
                        derandomize=doc["derandomize"], phases=phases, suppress_health_check=sorted(checks, key=str),
                        database=None, deadline=None, report_multiple_bugs=False, verbosity=Verbosity.quiet,
                        print_blob=False)
    return settings, doc["seed"]


def describe(settings: Settings) -> dict[str, Any]:
    """The document of ``settings`` that ``search_settings`` reads, with a fresh seed unless derandomized."""
    return {"max_examples": settings.max_examples, "stateful_step_count": settings.stateful_step_count,
            "derandomize": settings.derandomize, "phases": [phase.name for phase in settings.phases],
            "suppress_health_check": [check.name for check in settings.suppress_health_check],
            "seed": None if settings.derandomize else random.getrandbits(64)}


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
        self.ended: SearchStopped | MirrorDiverged | None = None
        self.kept: list[dict[str, Any]] = []   # the current example's lines, should Hypothesis run it again
        self.keeping = False        # the grader's own search runs: its lines are kept, example by example
        self.again = False          # Hypothesis runs its failing example again: the kept lines answer it
        self.namespace = RemoteNamespace(self, parts, sandbox.label)

    @property
    def generation(self) -> int:
        return self.example

    # ----------------------------------------------------------- searches

    def start(self, machine: Any, settings: dict[str, Any]) -> None:
        """Have the child begin the search of ``machine``'s part under ``settings`` (``describe``)."""
        spec = {"part": machine.part, "disabled": sorted(machine.disabled), "parts": self.parts,
                "label": self.label, "settings": settings}
        self.ended = None
        importing = self.kit_in != self.sandbox.generation or not self.sandbox.alive()
        try:  # the first line comes before any of the submission's code runs: only the kit's work is waited for
            first = self.sandbox.request({"op": "mirror", "search": spec}, "lifecycle",
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
            elif _of_example(line) and last is not None:
                last.append(line)
            else:
                break
        self.running = False
        outcome = line.get("ok")
        if not isinstance(outcome, dict) or _of_example(line):
            raise self._diverged(f"the child's search ended with {_what(line)}")
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
            raise self._diverged(f"the child ran {_what(line)} where the grader starts an example")

    def step(self, name: str, kwargs: dict[str, Any]) -> None:
        line = self._line()
        if line.get("seg") != [name, [[k, encode(v, _plain)] for k, v in kwargs.items()]]:
            raise self._diverged(f"the child ran {_what(line)} where the grader runs step {name}")

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
            raise self._diverged(f"the child made {_what(line)} where the grader reads {name!r} of #{handle}")
        if "exited" in reply:
            raise self._stopped(f"the {self.label} called sys.exit")
        return self.read_answer(obj, name, reply)

    def exchange(self, message: dict[str, Any], generation: int | None) -> dict[str, Any]:
        if generation is not None and generation != self.example:
            raise self._gone()
        line = self._line()
        reply = reply_to(message, line)
        if reply is None:
            raise self._diverged(f"the child made {_what(line)} where the grader makes {message!r:.200}")
        if "exited" in reply:  # the live channel restarts the child here; the child's search went on
            raise self._stopped(f"the {self.label} called sys.exit")
        self.remember(message, reply)
        return reply

    def _gone(self) -> SandboxFailure:
        return SandboxFailure("died", f"the {self.label}'s objects are gone: their example has ended")

    def _diverged(self, message: str) -> MirrorDiverged:
        self.ended = MirrorDiverged(message)
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
            if channel.ended is not None:  # the search is ending with SearchStopped or MirrorDiverged
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
    doc = describe(settings)
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
                getattr(instance, name)(**{k: decode(v, _plain) for k, v in kwargs})
        finally:
            instance.teardown()
    except LifecycleViolation as violation:
        return violation
    except (Exception, MirrorDiverged):
        return None
    finally:
        channel.ahead.clear()
    return None


def _of_example(line: dict[str, Any]) -> bool:
    """Whether ``line`` is a step or a request of an example (not a search's final reply)."""
    return "seg" in line or "g" in line or "c" in line or "rec" in line


def _plain(obj: Any) -> Any:
    raise TypeError(f"a lifecycle step's arguments are plain data, not {type(obj).__name__}")
