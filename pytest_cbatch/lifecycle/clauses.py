"""The lifecycle clauses: what every correct implementation of the published lifecycle API guarantees.

The published API is the course's ``PagedKV`` (``scheduler_sim.py``) and
``RecomputeRequest``/``TransferManager`` (``scheduler_faults.py``).  Each
statement leaves open what that text leaves open: page ids and free-list
order, the form of transfer keys (any unique hashable) and the names of a
transfer's destination owner and pins, exception messages, an emit index
counted from 0 or 1, whether the source pin is dropped at completion or at
output release, ValueError or a False return for a call in the wrong state,
what release() of an unknown owner returns, records and pages as objects or
mappings, terminal records kept or dropped, the value of retained_tokens, what
a transfer's destination pages hold before complete() (placeholder rows, or
none: nothing published reads them), and further fields and kinds of event.  Each clause declares what its check reads
and compares (``LifecycleClause``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from .oracle import PoolOracle, PoolState

__all__ = ["ABORT_REASONS", "LIFECYCLE", "LIFECYCLE_CLAUSES", "PARTS", "PART_CLAUSES", "LifecycleClause",
           "LifecycleViolation", "StoppedViolation"]

ABORT_REASONS = ("cancel", "timeout", "producer_failure", "consumer_failure")

PARTS: dict[str, str] = {
    "allocator": "PagedKV",
    "recompute": "RecomputeRequest",
    "transfer": "TransferManager",
}
"""Part name -> the class it drives (every part also needs PagedKV)."""

@dataclass(frozen=True)
class LifecycleClause:
    """A lifecycle clause: its statement, and what its check reads and compares.

    ``reads`` maps each published name the check reads (written as the replay
    script writes it: ``pool.free``, ``records[key].room``, ``e['index']``) to
    the words of the statement that name it; a field of plain data the
    published text shows in neither form (a record's, a page's) is read as an
    attribute or a mapping key, whichever the implementation offers.
    ``compares`` maps each value the check compares with the oracle (a read,
    or a call's result) to the words of the statement that define it; a value
    the statement does not define is not compared.  ``tests/`` keeps the words
    in the statement and the reads equal to what the machines read.
    """

    id: str
    statement: str
    reads: Mapping[str, str] = field(default_factory=dict)
    compares: Mapping[str, str] = field(default_factory=dict)


def _unchanged(words: str, *, request: bool = False) -> dict[str, str]:
    """The reads that show a refused call changed nothing: the pool's views (and the request's)."""
    views = {"pool.free": words, "pool.tables": words, "pool.transfers": words}
    if request:
        views.update({"request.state": words, "request.outputs": words, "request.events": words,
                      "e['event']": words, "e['index']": words, "e['token']": words})
    return views


_CLAUSES = (
    # ---------------------------------------------------------------- the pool
    LifecycleClause(
        "lifecycle.page_conservation",
        "Every page is free or allocated, never both: pool.free has no duplicates and no id of pool.pages, "
        "len(pool.free) is capacity minus the pages that tables and pins hold, and pool.pages holds exactly those.",
        reads={"pool.free": "pool.free", "pool.pages": "pool.pages"},
        compares={"pool.free": "no duplicates", "len(pool.free)": "len(pool.free) is capacity minus",
                  "set(pool.pages)": "pool.pages holds exactly those"}),
    LifecycleClause(
        "lifecycle.pool_views",
        "pool.tables lists exactly the live owners and pool.transfers the live pins, with the pages the operations "
        "imply (same id where a page is shared, a distinct id for every other page); each page's owners, pins and "
        "tokens (pool.pages[id], as attributes or keys) match, but for a transfer destination's tokens before "
        "complete() publishes it (any rows, or none).",
        reads={"pool.tables": "pool.tables", "pool.transfers": "pool.transfers", "pool.pages": "pool.pages[id]",
               "pool.pages[id].owners": "owners", "pool.pages[id].pins": "pins", "pool.pages[id].tokens": "tokens"},
        compares={"set(pool.tables)": "the live owners", "set(pool.transfers)": "the live pins",
                  "pool.tables[owner]": "the pages the operations imply",
                  "pool.transfers[name]": "the pages the operations imply",
                  "pool.pages[id].owners": "owners", "pool.pages[id].pins": "pins",
                  "pool.pages[id].tokens": "tokens"}),
    LifecycleClause(
        "lifecycle.read_matches_history",
        "pool.read(owner) returns a list of exactly the rows appended to that owner and the prefix it forked.",
        reads={"pool.read(owner)": "pool.read(owner)"},
        compares={"pool.read(owner)": "exactly the rows appended"}),
    LifecycleClause(
        "lifecycle.append_atomic",
        "append(owner, token) writes that one row, or raises MemoryError and changes nothing, exactly when it needs a "
        "page (no tail, a full tail, or a shared or pinned partial tail to copy) and none is free.",
        reads={"pool.read(owner)": "writes that one row", "pool.free": "none is free"},
        compares={"pool.read(owner)": "writes that one row", "len(pool.free)": "changes nothing",
                  "append() raising": "raises MemoryError"}),
    LifecycleClause(
        "lifecycle.fork_shares",
        "fork(source, target) gives target the very pages of source, partial tail included, allocating nothing; "
        "an existing target raises ValueError and changes nothing.",
        reads={"pool.tables[target]": "the very pages of source", "pool.read(target)": "changes nothing",
               "pool.free": "allocating nothing"},
        compares={"pool.tables[target]": "the very pages of source", "pool.read(target)": "changes nothing",
                  "len(pool.free)": "allocating nothing", "fork() raising": "raises ValueError"}),
    LifecycleClause(
        "lifecycle.cow_isolation",
        "Appending into a shared or pinned partial tail copies it first: no other owner's rows and no pinned view "
        "change.",
        reads={"pool.read(other)": "no other owner's rows", "pool.transfers[name]": "no pinned view",
               "pool.pages[id].tokens": "no pinned view"},
        compares={"pool.read(other)": "no other owner's rows", "pinned rows": "no pinned view"}),
    LifecycleClause(
        "lifecycle.pin_retains",
        "pin(owner, name) returns the owner's page ids (pool.tables[owner]) and allocates nothing; an existing name "
        "raises ValueError and changes no pinned view; pinned pages stay allocated after every owner releases them "
        "and are freed by the last unpin().",
        reads={"pool.tables[owner]": "pool.tables[owner]", "pool.free": "allocates nothing",
               "pool.transfers[name]": "pinned view", "pool.pages[id].tokens": "pinned view"},
        compares={"pin() result": "returns the owner's page ids", "len(pool.free)": "stay allocated",
                  "pinned rows": "changes no pinned view", "pin() raising": "raises ValueError"}),
    LifecycleClause(
        "lifecycle.owner_names",
        "create() raises ValueError for a live owner; read, append, fork, pin and unpin raise KeyError or ValueError "
        "for an unknown owner or pin (release may also do nothing, whatever it returns); a refused call changes "
        "nothing.",
        reads={"pool.read": "read", "pool.append": "append", "pool.fork": "fork", "pool.pin": "pin",
               "pool.unpin": "unpin", "pool.release": "release", **_unchanged("changes nothing")},
        compares={"the exception raised": "raise KeyError or ValueError", "len(pool.free)": "changes nothing",
                  "set(pool.tables)": "changes nothing", "set(pool.transfers)": "changes nothing",
                  "pool.read(owner)": "changes nothing"}),
    LifecycleClause(
        "lifecycle.self_check",
        "check() of the pool, of every request and of the manager returns without raising in every reachable state.",
        reads={"pool.check()": "check()", "request.check()": "check()", "manager.check()": "check()"},
        compares={"check() raising": "returns without raising"}),
    LifecycleClause(
        "lifecycle.teardown_frees_all",
        "After every request is cancelled, every transfer drained or released and every owner and pin dropped, "
        "all pages are free.",
        reads={"pool.free": "all pages are free", "pool.pages": "all pages are free",
               "pool.tables": "every owner and pin dropped", "pool.transfers": "every owner and pin dropped"},
        compares={"len(pool.free)": "all pages are free", "len(pool.pages)": "all pages are free",
                  "set(pool.tables)": "every owner and pin dropped",
                  "set(pool.transfers)": "every owner and pin dropped"}),
    # ------------------------------------------------------------- the request
    LifecycleClause(
        "lifecycle.request_arguments",
        "RecomputeRequest() raises ValueError for an empty owner, an empty prompt, a non-int prompt token or an owner "
        "that already has a table, and sample() of an active request raises ValueError for a non-int token; a refused "
        "call changes nothing.",
        reads={"request.sample": "sample()", **_unchanged("changes nothing", request=True)},
        compares={"the exception raised": "raises ValueError", "state, outputs, emissions": "changes nothing",
                  "len(pool.free)": "changes nothing", "set(pool.tables)": "changes nothing"}),
    LifecycleClause(
        "lifecycle.request_state",
        "state is 'queued' until the first successful resume(), 'active' after it, 'preempted' after preempt() and "
        "'cancelled' for good after cancel().",
        reads={"request.state": "state"},
        compares={"request.state": "state is"}),
    LifecycleClause(
        "lifecycle.active_rows",
        "committed == prompt + outputs[:-1] always, and while a request is active pool.read(owner) == committed.",
        reads={"request.committed": "committed", "pool.read(owner)": "pool.read(owner)"},
        compares={"request.committed": "committed == prompt + outputs[:-1]",
                  "pool.read(owner)": "pool.read(owner) == committed"}),
    LifecycleClause(
        "lifecycle.replay_no_refeed",
        "resume() rebuilds exactly prompt + outputs[:-1] (what pool.read(owner) then returns): the pending sample is "
        "not fed again.",
        reads={"pool.read(owner)": "pool.read(owner)"},
        compares={"pool.read(owner)": "rebuilds exactly prompt + outputs[:-1]"}),
    LifecycleClause(
        "lifecycle.replay_atomic",
        "resume() returns True exactly when every page of the committed rows can be allocated; otherwise it returns "
        "False, keeps the state, leaves no owner, pin or page behind and emits nothing.",
        reads={"pool.free": "no owner, pin or page", "pool.tables": "no owner, pin or page",
               "pool.transfers": "no owner, pin or page"},
        compares={"resume() result": "returns True exactly when", "len(pool.free)": "no owner, pin or page",
                  "set(pool.tables)": "no owner, pin or page", "set(pool.transfers)": "no owner, pin or page"}),
    LifecycleClause(
        "lifecycle.decode_atomic",
        "sample(token) first feeds the pending output; when that needs a page and none is free it raises MemoryError "
        "and changes, records and emits nothing.",
        reads={"pool.free": "none is free", "pool.read(owner)": "changes, records and emits nothing",
               "request.outputs": "changes, records and emits nothing",
               "request.events": "changes, records and emits nothing", "e['event']": "emits nothing",
               "e['index']": "emits nothing", "e['token']": "emits nothing"},
        compares={"sample() raising": "raises MemoryError", "len(pool.free)": "changes",
                  "pool.read(owner)": "changes", "request.outputs": "records", "emissions": "emits nothing"}),
    LifecycleClause(
        "lifecycle.outputs_append_only",
        "outputs grows by exactly the sampled token on each successful sample() and otherwise never changes.",
        reads={"request.outputs": "outputs"},
        compares={"request.outputs": "grows by exactly the sampled token"}),
    LifecycleClause(
        "lifecycle.emission_events",
        "events holds one {'event': 'emit', 'index': i, 'token': outputs[i]} per output, in order, i counted from 0 or "
        "from 1 and rising by one; replay, preemption and refused or failed calls emit nothing.",
        reads={"request.events": "events", "e['event']": "'event'", "e['index']": "'index'", "e['token']": "'token'"},
        compares={"e['index']": "i counted from 0 or from 1 and rising by one", "e['token']": "outputs[i]"}),
    LifecycleClause(
        "lifecycle.request_events",
        "Besides emissions, events records in order resumed{recomputed_rows} for each successful resume() (the rows "
        "it rebuilt after a preemption, 0 for the first), resume_blocked{rows} for each failed one (len(committed)), "
        "preempted{retained_tokens} for each preempt() (any value: the published text does not define it) and one "
        "cancelled; further fields and further kinds of event are free.",
        reads={"request.events": "events", "e['event']": "records in order", "e['recomputed_rows']": "recomputed_rows",
               "e['rows']": "rows", "e['retained_tokens']": "retained_tokens"},
        compares={"e['event']": "records in order", "e['recomputed_rows']": "the rows it rebuilt after a preemption",
                  "e['rows']": "len(committed)", "'retained_tokens' in e": "preempted{retained_tokens}"}),
    LifecycleClause(
        "lifecycle.preempt_keeps_history",
        "preempt() of an active request drops its owner, frees its pages and keeps its prompt and outputs.",
        reads={"request.prompt": "prompt", "request.outputs": "outputs", "pool.tables": "drops its owner",
               "pool.transfers": "frees its pages", "pool.free": "frees its pages"},
        compares={"request.prompt": "keeps its prompt", "request.outputs": "and outputs",
                  "set(pool.tables)": "drops its owner", "len(pool.free)": "frees its pages"}),
    LifecycleClause(
        "lifecycle.recompute_count",
        "recomputed_rows grows by len(committed) on each successful resume() after a preemption and by nothing else.",
        reads={"request.recomputed_rows": "recomputed_rows"},
        compares={"request.recomputed_rows": "grows by len(committed)"}),
    LifecycleClause(
        "lifecycle.cancel_idempotent",
        "cancel() frees the request's pages; repeating it neither raises nor changes or records anything, and a "
        "cancelled request never resumes.",
        reads={"request.resume": "never resumes", **_unchanged("changes or records anything", request=True)},
        compares={"len(pool.free)": "frees the request's pages", "request.state": "changes",
                  "kinds of events": "records anything", "resume() result": "never resumes"}),
    LifecycleClause(
        "lifecycle.wrong_state_refused",
        "resume() of a request that is active or cancelled or whose owner name has a table, and sample() or preempt() "
        "of one that is not active, raise ValueError or return False, and change nothing.",
        reads={"request.resume": "resume()", "request.sample": "sample()", "request.preempt": "preempt()",
               **_unchanged("change nothing", request=True)},
        compares={"the call's outcome": "raise ValueError or return False", "state, outputs, emissions": "change "
                  "nothing", "len(pool.free)": "change nothing", "set(pool.tables)": "change nothing"}),
    # ------------------------------------------------------------ the transfer
    LifecycleClause(
        "lifecycle.snapshot_published",
        "After complete(key), read(key) returns a list of the source's rows as they were at begin(), whatever "
        "happened to the source since.",
        reads={"manager.read(key)": "read(key)"},
        compares={"manager.read(key)": "the source's rows as they were at begin()"}),
    LifecycleClause(
        "lifecycle.unpublished_unreadable",
        "read(key) raises ValueError for a transfer that is not ready (in flight, draining, drained or released), "
        "and KeyError or ValueError for a key begin() never returned.",
        compares={"read() raising": "raises ValueError"}),
    LifecycleClause(
        "lifecycle.begin_arguments",
        "begin() raises ValueError for a blank room or an empty source and KeyError or ValueError for an unknown "
        "source, and then changes nothing.",
        reads={"manager.rooms": "changes nothing", **_unchanged("changes nothing")},
        compares={"begin() raising": "raises ValueError", "len(pool.free)": "changes nothing",
                  "set(pool.tables)": "changes nothing", "dict(manager.rooms)": "changes nothing"}),
    LifecycleClause(
        "lifecycle.begin_rollback",
        "begin() pins the source's pages and reserves a destination owner with pages for the snapshot's rows under a "
        "pin of its own (one new owner in pool.tables, two new pins in pool.transfers); it raises MemoryError exactly when "
        "the destination's pages cannot all be allocated, and then leaves no owner, pin, page or room behind.",
        reads={"pool.tables": "pool.tables", "pool.transfers": "pool.transfers", "pool.free": "no owner, pin, page",
               "manager.rooms": "or room behind"},
        compares={"new owners and pins": "one new owner in pool.tables, two new pins in pool.transfers",
                  "pool.transfers[name]": "pins the source's pages", "begin() raising": "raises MemoryError",
                  "len(pool.free)": "no owner, pin, page", "dict(manager.rooms)": "or room behind"}),
    LifecycleClause(
        "lifecycle.key_fresh",
        "Every key begin() returns differs from every earlier key, and generation grows by one on every begin() "
        "that reaches allocation, failed reservations included.",
        reads={"manager.generation": "generation"},
        compares={"begin() result": "differs from every earlier key", "manager.generation": "grows by one"}),
    LifecycleClause(
        "lifecycle.room_exclusive",
        "begin() in a room with a live transfer raises ValueError or returns False or None and changes nothing; the "
        "room is free again (gone from manager.rooms) once that transfer is drained or its output released.",
        reads={"manager.rooms": "manager.rooms", **_unchanged("changes nothing")},
        compares={"begin() outcome": "raises ValueError or returns False or None",
                  "dict(manager.rooms)": "manager.rooms", "len(pool.free)": "changes nothing"}),
    LifecycleClause(
        "lifecycle.transfer_records",
        "records[key] keeps room, the snapshot taken at begin(), reason (None until abort(), then its reason) and "
        "state 'in_flight', 'draining' or 'ready' while live and none of these after, when the record is kept (as "
        "attributes or keys); rooms maps each room to its live key.",
        reads={"manager.records": "records[key]", "records[key].room": "room", "records[key].snapshot": "snapshot",
               "records[key].reason": "reason", "records[key].state": "state", "manager.rooms": "rooms"},
        compares={"records[key].room": "room", "records[key].snapshot": "the snapshot taken at begin()",
                  "records[key].reason": "None until abort(), then its reason",
                  "records[key].state": "'in_flight', 'draining' or 'ready' while live",
                  "dict(manager.rooms)": "maps each room to its live key"}),
    LifecycleClause(
        "lifecycle.abort_retains",
        "abort() of an in-flight transfer returns True, drops the destination owner and keeps the source and "
        "destination pages allocated until acknowledge_drained(key).",
        reads={"pool.tables": "drops the destination owner", "pool.transfers": "keeps the source and destination",
               "pool.free": "pages allocated"},
        compares={"abort() result": "returns True", "set(pool.tables)": "drops the destination owner",
                  "set(pool.transfers)": "keeps the source and destination", "len(pool.free)": "pages allocated"}),
    LifecycleClause(
        "lifecycle.drain_frees",
        "acknowledge_drained() of a draining transfer drops both pins and release_output() of a ready one drops the "
        "destination (and any pin complete() kept in pool.transfers); each returns True and frees the pages nothing "
        "else holds.",
        reads={"pool.transfers": "pool.transfers", "pool.tables": "drops the destination",
               "pool.free": "frees the pages"},
        compares={"the call's result": "returns True", "set(pool.transfers)": "drops both pins",
                  "set(pool.tables)": "drops the destination", "len(pool.free)": "frees the pages"}),
    LifecycleClause(
        "lifecycle.callback_fencing",
        "complete() and abort() apply to an in-flight key, acknowledge_drained() to a draining one, release_output() "
        "to a ready one; for a duplicate, stale, lost-race or unknown key they return False and change nothing.",
        reads={"manager.complete": "complete()", "manager.abort": "abort()",
               "manager.acknowledge_drained": "acknowledge_drained()", "manager.release_output": "release_output()",
               **_unchanged("change nothing")},
        compares={"the call's result": "return False", "len(pool.free)": "change nothing",
                  "set(pool.tables)": "change nothing"}),
    LifecycleClause(
        "lifecycle.abort_reason",
        "abort() accepts exactly cancel (the default), timeout, producer_failure and consumer_failure; any other "
        "reason raises ValueError, whatever the key, and changes nothing.",
        reads=_unchanged("changes nothing"),
        compares={"abort() raising": "raises ValueError", "len(pool.free)": "changes nothing",
                  "set(pool.tables)": "changes nothing"}),
)

LIFECYCLE: dict[str, LifecycleClause] = {c.id: c for c in _CLAUSES}
"""Clause id -> its statement, reads and compares."""

LIFECYCLE_CLAUSES: dict[str, str] = {c.id: c.statement for c in _CLAUSES}
"""Clause id -> its statement."""

_POOL = (
    "lifecycle.page_conservation", "lifecycle.pool_views", "lifecycle.read_matches_history",
    "lifecycle.append_atomic", "lifecycle.cow_isolation", "lifecycle.self_check", "lifecycle.teardown_frees_all",
)

PART_CLAUSES: dict[str, tuple[str, ...]] = {
    "allocator": (*_POOL, "lifecycle.fork_shares", "lifecycle.pin_retains", "lifecycle.owner_names"),
    "recompute": (
        *_POOL, "lifecycle.pin_retains", "lifecycle.request_arguments", "lifecycle.request_state",
        "lifecycle.active_rows", "lifecycle.replay_no_refeed", "lifecycle.replay_atomic", "lifecycle.decode_atomic",
        "lifecycle.outputs_append_only", "lifecycle.emission_events", "lifecycle.request_events",
        "lifecycle.preempt_keeps_history", "lifecycle.recompute_count", "lifecycle.cancel_idempotent",
        "lifecycle.wrong_state_refused",
    ),
    "transfer": (
        *_POOL, "lifecycle.snapshot_published", "lifecycle.unpublished_unreadable", "lifecycle.begin_arguments",
        "lifecycle.begin_rollback", "lifecycle.key_fresh", "lifecycle.room_exclusive", "lifecycle.transfer_records",
        "lifecycle.abort_retains", "lifecycle.drain_frees", "lifecycle.callback_fencing", "lifecycle.abort_reason",
    ),
}
"""Part -> the clauses its state machine judges."""


class LifecycleViolation(AssertionError):
    """A lifecycle clause failed; ``clause`` is its id and the message starts with ``[clause]``.

    ``replay`` is a runnable Python script (the operations of the failing run,
    ending with the step that shows the violation).  ``pools`` holds, for each
    line of ``replay``, the contract's model of the pool after it (a copy of
    the machine's ``PoolOracle``, None before the pool exists; empty when not
    given); ``steps`` is what the picture of the failure draws from.
    """

    def __init__(self, clause: str, message: str, replay: str, pools: tuple[PoolOracle | None, ...] = ()) -> None:
        super().__init__(
            f"[{clause}] {message}\n  clause: {LIFECYCLE_CLAUSES[clause]}\n"
            "  replay (runnable Python; its last line fails on this implementation):\n"
            + "".join(f"    {line}\n" for line in replay.splitlines())
        )
        self.clause = clause
        self.detail = message
        self.replay = replay
        self.pools = pools

    def steps(self) -> tuple[tuple[str, PoolState | None], ...]:
        """Each line of the replay with the model's pool after it (``PoolState``; None where ``pools`` has none)."""
        lines = self.replay.splitlines()
        pools = [*self.pools, *[None] * len(lines)]
        return tuple((line, None if pool is None else pool.state()) for line, pool in zip(lines, pools))


class StoppedViolation(BaseException):
    """A call of a lifecycle example did not return in time (``bounded.CallTimedOut``): ``violation`` names
    the clause whose step it was and the operations up to that call.  A ``BaseException``, so Hypothesis
    neither shrinks the example nor runs it again: the search, and the part, end there."""

    def __init__(self, violation: LifecycleViolation) -> None:
        super().__init__(str(violation))
        self.violation = violation
