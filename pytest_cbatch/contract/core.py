"""The contract's building blocks: violations, the clause registry and the report index.

Every clause is registered with ``@clause(id, statement, why, needs=...)``
right above its check in one of the family modules (``requests``, ``rows``,
``pages``), so a clause id leads to its statement and its code in one place.
``needs`` names the event kinds a clause must observe; a report that declares
what it can observe (a client-side report of a live server lists them in
``observed``) skips the clauses it cannot judge, with that reason, where that
claim is honoured (``contract.CLAIMS``: only from kinds that declare it).

A clause registered with ``at=`` event kinds judges each such event against
the lifecycle so far: the index replays the events once (``ReportIndex.replayed``)
and calls every such clause it serves at its events, so clauses that audit
each snapshot share one replay instead of each walking the events again.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import groupby, repeat
from operator import itemgetter
from typing import Any, Callable, Collection, Iterable, Iterator, Mapping, Sequence

from .tables import BlockTables

__all__ = [
    "CLAUSES", "RUNNER_CLAUSES", "Clause", "ReportIndex", "Violation", "EVENT_KINDS", "TERMINAL",
    "clause", "required_blocks", "short", "replay_slack",
]

TERMINAL = ("finished", "cancelled", "rejected")
EVENT_KINDS = frozenset({
    "arrival", "admit", "admission_blocked", "rejected", "cancelled", "cancel_ignored", "snapshot",
    "dispatch", "token", "finished", "release", "preempted",
})


@dataclass(frozen=True)
class Violation:
    """One broken clause at one place: which request, which event, what was expected."""

    clause: str
    message: str
    request: str | None = None
    event_index: int | None = None
    time: float | None = None

    def __str__(self) -> str:
        where = []
        if self.request is not None:
            where.append(f"request {self.request!r}")
        if self.event_index is not None:
            where.append(f"event #{self.event_index}")
        if self.time is not None:
            where.append(f"t={self.time}")
        place = f" ({', '.join(where)})" if where else ""
        return f"[{self.clause}]{place} {self.message}"


@dataclass(frozen=True)
class Clause:
    """A contract clause: stable id, one-sentence statement, why it matters, what it must observe."""

    id: str
    statement: str
    why: str
    check: Callable[["ReportIndex"], Iterator[Violation]] | None = field(default=None, compare=False, repr=False)
    needs: frozenset[str] = frozenset()
    admits: str = ""   # the legitimate choices a correct scheduler may make that the clause allows
    reads: tuple[str, ...] = ()   # the report and trace fields the check reads
    compares: tuple[tuple[str, str], ...] = ()   # (value compared, the statement's words that define it)
    at: frozenset[str] = frozenset()   # event kinds it judges during the shared replay (see ``clause``)
    step: Callable[["ReportIndex", int, dict[str, Any], "Replay"], Iterable[Violation]] | None = field(
        default=None, compare=False, repr=False)   # its judge of one such event, when ``at`` is set
    opt_in: str = ""   # how a user asks for it, when it is judged only on request (see ``clause``)
    scope: Callable[[Mapping[str, Any]], str | None] | None = field(
        default=None, compare=False, repr=False)   # why a run's config is outside what it judges, or None


CLAUSES: dict[str, Clause] = {
    # Checked first, by check_report, as the gate for every other clause.
    "schema_valid": Clause(
        "schema_valid", "The report validates against schemas/report.schema.json.",
        "Tools that read reports (dashboards, graders, this checker) rely on the field names and types."),
}


def clause(cid: str, statement: str, why: str, *, needs: Sequence[str] = (), admits: str = "",
           reads: Sequence[str] = (), compares: Mapping[str, str] | None = None,
           at: Sequence[str] = (), opt_in: str = "",
           scope: Callable[[Mapping[str, Any]], str | None] | None = None) -> Callable:
    """Register a report clause; the decorated generator yields its violations.

    Without ``at`` it is called once, as ``check(index)``.  With ``at`` (event
    kinds other than token, which changes no request's state) it is called
    during the index's one replay of the events, as ``check(index, i, event,
    replay)`` at each event of those kinds, ``replay`` being the state just
    before the event; ``Clause.check`` then yields what those calls found.

    ``needs``: the event kinds it must observe; ``admits``: the legitimate
    choices of correct schedulers it was derived to allow (the clause table's
    "admits" column).  ``reads``: the fields the check reads, as paths
    (``trace.prompt_tokens``, ``config.block_size``, ``summary.finished``,
    ``requests.*.ttft_ticks``, ``events[token].time``, ``events[*].id``,
    ``events[dispatch].work[].input_tokens``); ``compares``: each value the
    check compares with what it expects, mapped to the words of the statement
    that define it (a value the statement does not define is not compared).
    ``opt_in``: a clause judged only when asked for, with the words that say
    how (``--cbatch-course``); every other clause is judged by default.
    ``scope(config)``: why a run's config is outside what the clause judges
    (that run skips it, with the reason), or None.
    """

    unvisited = sorted(set(at) - (EVENT_KINDS - {"token"}))
    if unvisited:
        raise ValueError(f"clause {cid!r}: at= names {unvisited}, which the replay does not visit")

    def register(fn: Callable[..., Iterable[Violation]]) -> Callable:
        if cid in CLAUSES:
            raise ValueError(f"clause {cid!r} registered twice")
        check = fn if not at else (lambda index: iter(index.replayed(cid)))
        CLAUSES[cid] = Clause(cid, statement, why, check, frozenset(needs), admits, tuple(reads),
                              tuple((compares or {}).items()), frozenset(at), fn if at else None, opt_in, scope)
        return fn

    return register


RUNNER_CLAUSES: dict[str, Clause] = {
    c.id: c
    for c in (
        Clause("deterministic", "The same trace and config give an identical report twice (engine reports; a live "
                                "server's timings are not expected to repeat).",
               "Verdicts and grades must be reproducible; a replayed failure must fail again."),
        Clause("input_not_mutated", "The implementation does not mutate the trace or config it is given.",
               "Callers reuse their workload objects; a scheduler that edits them corrupts later runs."),
        Clause("invalid_input_refused",
               "Invalid traces and configs are refused (an exception, or a non-zero exit) and produce no report.",
               "Garbage in must not become a plausible-looking report (booleans as integers, unknown fields, "
               "duplicate ids, cancels of unknown requests, non-positive lengths or settings)."),
    )
}


def required_blocks(prompt: int, output: int, block_size: int) -> int:
    """Pages a request needs at its largest: the last sampled token is never fed back."""
    return -(-(prompt + output - 1) // block_size)


def replay_slack(tick_seconds: float) -> float:
    """Seconds a client-side replay may act after a trace line's scheduled moment and still be on time
    (the replay repeats a run in which its client fell further behind)."""
    return max(1.0, 20 * tick_seconds)


def short(values: Sequence[Any], limit: int = 12) -> str:
    """A list cut to ``limit`` items for a message."""
    text = ", ".join(map(str, values[:limit]))
    return f"[{text}{', ...' if len(values) > limit else ''}]"


_FIRST = itemgetter(0)


class ReportIndex:
    """A report cross-referenced with its trace, built in one pass over the events.

    For each trace request the pass records, as compact lists in event order:
    its token events (``tokens``: event indices, with ``token_times`` and
    ``output_indices`` beside them), its dispatch rows (``rows_of``: the
    dispatch's index, input tokens and phase of each), and its other events
    (``marks``).  ``steps`` lists the index of every event but tokens and
    extensions (``x-...``), in order, whatever id it names; ``kinds[kind]``
    those of one kind.  ``replaying`` names the ``at=`` clauses the shared
    replay serves (None: every one).  Nothing here judges the report; the
    clauses do, most of them from these lists without walking the events again.
    ``config`` (kept as ``cfg``) is every setting the run asked for, defaults included (``check_report``
    fills them in).
    """

    def __init__(self, report: Mapping[str, Any], trace: Sequence[Mapping[str, Any]], config: Mapping[str, Any],
                 honoured: Collection[str] = ()):
        self.report = report
        self.trace = trace
        self.events: list[dict[str, Any]] = report["events"]
        # Every clause judges the settings the run asked for, which the scheduler had to obey, never the report's
        # own config: config_recorded compares that one with these, and a report recording another capacity (say)
        # must not have its pages judged against it.
        self.cfg: dict[str, Any] = dict(config)
        self.bs: int = self.cfg.get("block_size", 1)   # a client-side report may not know the pool
        self.capacity: int = self.cfg.get("capacity", 0)
        self.honoured = frozenset(honoured)   # the report claims its kind may make: see contract.CLAIMS
        observed = report.get("observed") if "observed" in honoured else None
        self.observed: frozenset[str] | None = None if observed is None else frozenset(observed)
        self.seconds = "time_unit" in honoured and report.get("time_unit") == "seconds"
        # A client-side replay's seconds per tick: the kit's client writes it, and only an honoured claim reads it.
        tick = report["config"].get("tick_seconds", 1.0) if self.seconds else 1
        self.tick: float = tick
        self.slack: float = replay_slack(tick) if self.seconds else 0
        self.replaying: Collection[str] | None = None
        self._replayed: dict[str, list[Violation]] = {}
        self._tables: BlockTables | None = None
        self._frame_times: dict[str, list[float]] = {}
        self.arrivals: dict[str, dict[str, Any]] = {}
        self.cancels: dict[str, list[int]] = {}
        for line in trace:
            if line["event"] == "arrival":
                self.arrivals[line["id"]] = line
            else:
                self.cancels.setdefault(line["id"], []).append(line["time"])
        for times in self.cancels.values():
            times.sort()  # a trace's file order is free; answers come in time order
        # The pages each request needs at its largest (``required_blocks``).
        self.largest: dict[str, int] = {
            rid: required_blocks(line["prompt_tokens"], line["output_tokens"], self.bs)
            for rid, line in self.arrivals.items()}
        self.unknown: dict[str, int] = {}
        self._terminal: dict[str, tuple[int, str]] = {}
        self._tokens: dict[str, tuple[list[int], list[Any], list[Any]]] = {
            rid: ([], [], []) for rid in self.arrivals}
        self._rows: dict[str, tuple[list[int], list[Any], list[Any]]] = {rid: ([], [], []) for rid in self.arrivals}
        self._marks: dict[str, list[tuple[int, str]]] = {rid: [] for rid in self.arrivals}
        self.steps: list[int] = []
        self.kinds: dict[str, list[int]] = {kind: [] for kind in EVENT_KINDS}
        self.dispatches: list[int] = self.kinds["dispatch"]
        self.snapshots: list[int] = self.kinds["snapshot"]
        # The one pass over the events: everything the clauses look up per request is filled in here, while
        # each event is in the cache (reading the events again per request, in another order, costs more).
        # The input tokens each dispatch feeds (its rows summed in order), in the order of ``dispatches``.
        self.dispatch_fed: list[Any] = []
        unknown, terminal, tokens, rows, marks = self.unknown, self._terminal, self._tokens, self._rows, self._marks
        dispatch_fed = self.dispatch_fed
        steps, kinds = self.steps, self.kinds
        for i, ev in enumerate(self.events):
            kind = ev["event"]
            if kind == "token":
                rid = ev["id"]
                target = tokens.get(rid)
                if target is None:
                    unknown.setdefault(rid, i)
                else:
                    target[0].append(i)
                    target[1].append(ev["time"])
                    target[2].append(ev["output_index"])
                continue
            if kind.startswith("x-"):
                continue
            steps.append(i)
            kinds.setdefault(kind, []).append(i)
            if kind == "dispatch":
                fed = 0
                for row in ev["work"]:
                    n = row["input_tokens"]
                    fed += n
                    rid = row["id"]
                    target = rows.get(rid)
                    if target is None:
                        unknown.setdefault(rid, i)
                    else:
                        target[0].append(i)
                        target[1].append(n)
                        target[2].append(row["phase"])
                dispatch_fed.append(fed)
            elif kind != "snapshot":
                rid = ev["id"]
                target = marks.get(rid)
                if target is None:
                    unknown.setdefault(rid, i)
                    continue
                target.append((i, kind))
                if kind in TERMINAL:
                    terminal.setdefault(rid, (i, kind))

    def observes(self, needs: frozenset[str]) -> bool:
        """Whether this report records every event kind in ``needs``."""
        if self.observed is None:
            return not needs - EVENT_KINDS
        return needs <= self.observed

    def unobserved(self, needs: frozenset[str]) -> list[str]:
        """The kinds of ``needs`` this report does not record."""
        if self.observed is None:
            return sorted(needs - EVENT_KINDS)
        return sorted(needs - self.observed)

    def time(self, i: int) -> float:
        return self.events[i]["time"]

    def on_time(self, event_time: float, trace_time: int) -> bool:
        """Whether an event answering a trace line at ``trace_time`` happened at that moment.

        Engine reports: exactly at that tick.  Client-side reports: not before
        the scheduled moment and within the replay's slack after it.
        """
        if not self.seconds:
            return event_time == trace_time
        due = trace_time * self.tick
        return due - 1e-9 <= event_time <= due + self.slack

    def when(self, trace_time: int) -> str:
        return f"t={trace_time}" if not self.seconds else f"t={trace_time * self.tick:g}s (+{self.slack:g}s slack)"

    def arrived_at(self, rid: str) -> float:
        """The time of the request's arrival event (its trace time when it has none)."""
        arrivals = self.of(rid, "arrival")
        return self.time(arrivals[0]) if arrivals else self.arrivals[rid]["time"]

    def marks(self, rid: str) -> list[tuple[int, str]]:
        """(event index, kind) of the request's events other than tokens and dispatch rows, in order."""
        return self._marks[rid]

    def of(self, rid: str, *kinds: str) -> list[int]:
        """Event indices of the request's events of ``kinds`` (not tokens or rows), in order."""
        return [i for i, kind in self._marks[rid] if kind in kinds]

    def first_event(self, rid: str) -> int | None:
        """The index of the first event naming the request (a token, a dispatch row or another), if any."""
        firsts = [entries[0] for entries in (self._tokens[rid][0], self._rows[rid][0]) if entries]
        if self._marks[rid]:
            firsts.append(self._marks[rid][0][0])
        return min(firsts, default=None)

    def sequence(self, rid: str) -> list[tuple[int, str, Any]]:
        """Every event naming the request, in event order, as ``(event index, kind, payload)``: a dispatch row
        is kind ``"row"`` with its input tokens as payload; tokens and other events have None."""
        at, fed, _ = self._rows[rid]
        merged = [*((i, kind, None) for i, kind in self._marks[rid]), *zip(at, repeat("row"), fed),
                  *zip(self._tokens[rid][0], repeat("token"), repeat(None))]
        merged.sort(key=_FIRST)   # stable: a dispatch's two rows for one request keep their order
        return merged

    def violation(self, cid: str, message: str, rid: str | None = None, i: int | None = None) -> Violation:
        return Violation(cid, message, rid, i, None if i is None else self.events[i]["time"])

    def terminal(self, rid: str) -> tuple[int, str] | None:
        """(event index, kind) of the request's first terminal event, if any."""
        return self._terminal.get(rid)

    def tokens(self, rid: str) -> list[int]:
        """The event indices of the request's token events, in order."""
        return self._tokens[rid][0]

    def token_times(self, rid: str) -> list[float]:
        """The times of the request's token events, in order."""
        return self._tokens[rid][1]

    def output_indices(self, rid: str) -> list[Any]:
        """The output_index of each of the request's token events, in order."""
        return self._tokens[rid][2]

    def frame_times(self, rid: str) -> list[float]:
        """The distinct times at which the request's tokens arrived (one per data frame), in order."""
        times = self._frame_times.get(rid)
        if times is None:
            times = self._frame_times[rid] = list(map(_FIRST, groupby(self.token_times(rid))))
        return times

    def rows_of(self, rid: str) -> tuple[list[int], list[Any], list[Any]]:
        """The request's dispatch rows, in order, as three lists: each row's dispatch (event index), its
        input_tokens and its phase."""
        return self._rows[rid]

    def rows(self) -> Iterator[tuple[str, dict[str, Any], dict[str, Any]]]:
        """(id, trace arrival line, requests-table row) for each trace request the table has."""
        table = self.report["requests"]
        for rid, line in self.arrivals.items():
            row = table.get(rid)
            if row is not None:
                yield rid, line, row

    def max_active(self) -> int:
        return 1 if self.cfg["policy"] == "serial" else self.cfg["max_active"]

    def block_tables(self) -> BlockTables:
        """What each snapshot's block tables changed, and each one's page census (built on first use)."""
        if self._tables is None:
            self._tables = BlockTables(self.events, self.snapshots, self.capacity, self.largest)
        return self._tables

    def replayed(self, cid: str) -> list[Violation]:
        """What clause ``cid`` (registered with ``at=``) finds at its events during the one replay of the events.

        The first call replays them once for every clause in ``replaying``
        (and ``cid``), calling each at the events it judges; later calls for
        those clauses return what that replay found.
        """
        if cid not in self._replayed:
            serve = {cid} | set(CLAUSES if self.replaying is None else self.replaying)
            self._replay([c for c in CLAUSES.values() if c.at and c.id in serve and c.id not in self._replayed])
        return self._replayed[cid]

    def _replay(self, clauses: Sequence[Clause]) -> None:
        judges: dict[str, list[tuple[list[Violation], Callable]]] = {}
        for c in clauses:
            found = self._replayed[c.id] = []
            for kind in c.at:
                judges.setdefault(kind, []).append((found, c.step))
        replay = Replay(self.bs)
        events = self.events
        for i in self.steps:
            ev = events[i]
            for found, step in judges.get(ev["event"], ()):
                found.extend(step(self, i, ev, replay))
            replay.advance(ev)


def next_state(state: str | None, kind: str) -> str | None:
    """A request's lifecycle state (queued, active, draining, ended, released) after one of its events of ``kind``.

    Finishing or being cancelled while admitted leaves it draining (it may
    still hold pages); otherwise ended.  Kinds that change no state keep it.
    """
    if kind in ("finished", "cancelled"):
        return "draining" if state == "active" else "ended"
    return _NEXT_STATE.get(kind, state)


_NEXT_STATE = {"arrival": "queued", "admit": "active", "preempted": "queued", "rejected": "released",
               "release": "released"}


class Replay:
    """Each request's state (see ``next_state``) and the rows it fed in its current incarnation,
    advanced one event at a time, and the time of the latest snapshot.  ``members[state]``
    is the set of ids in each state, kept up to date so lookups stay cheap.  ``regrown``: the
    ids whose pages needed for the rows fed (ceil(fed / block_size)) changed since the latest
    snapshot, so a clause that compares each snapshot's tables with those needs may look again
    only at them and at the tables that changed; ``underfed`` is where such a clause keeps what
    it found at the latest snapshot."""

    STATES = ("queued", "active", "draining", "ended", "released")

    def __init__(self, block_size: int = 1) -> None:
        self.state: dict[str, str] = {}
        self.fed: dict[str, int] = {}
        self.members: dict[str, set[str]] = {s: set() for s in self.STATES}
        self.snapshot_time: float | None = None
        self.bs = block_size
        self.regrown: set[str] = set()
        self.underfed: set[str] = set()

    def advance(self, ev: Mapping[str, Any]) -> None:
        kind = ev["event"]
        if kind == "dispatch":
            fed, bs, regrown = self.fed, self.bs, self.regrown
            for row in ev["work"]:
                rid = row["id"]
                old = fed.get(rid, 0)
                new = fed[rid] = old + row["input_tokens"]
                if new > -(-old // bs) * bs:   # past the pages its rows needed (a row feeds at least one token)
                    regrown.add(rid)
        elif kind == "snapshot":
            self.snapshot_time = ev["time"]
            self.regrown.clear()
        elif kind in _NEXT_STATE or kind in ("finished", "cancelled"):
            rid = ev["id"]
            old = self.state.get(rid)
            new = next_state(old, kind)
            if old is not None:
                self.members[old].discard(rid)
            self.state[rid] = new
            self.members[new].add(rid)
            if kind == "preempted":
                if self.fed.get(rid):
                    self.regrown.add(rid)
                self.fed[rid] = 0
