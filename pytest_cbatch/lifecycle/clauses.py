"""The lifecycle clauses: what every correct implementation of the published lifecycle API guarantees.

The published API is the course's ``PagedKV`` (``scheduler_sim.py``) and
``RecomputeRequest``/``TransferManager`` (``scheduler_faults.py``).  Each
statement leaves open what that text leaves open: page ids and free-list
order, the form of transfer keys (any unique hashable), exception messages,
an emit index counted from 0 or 1, whether the source pin is dropped at
completion or at output release, and ValueError or a False return for a
call in the wrong state.
"""

from __future__ import annotations

__all__ = ["ABORT_REASONS", "LIFECYCLE_CLAUSES", "PARTS", "PART_CLAUSES", "LifecycleViolation"]

ABORT_REASONS = ("cancel", "timeout", "producer_failure", "consumer_failure")

PARTS: dict[str, str] = {
    "allocator": "PagedKV",
    "recompute": "RecomputeRequest",
    "transfer": "TransferManager",
}
"""Part name -> the class it drives (every part also needs PagedKV)."""

LIFECYCLE_CLAUSES: dict[str, str] = {
    # ---------------------------------------------------------------- the pool
    "lifecycle.page_conservation": (
        "Every page is free or allocated, never both: pool.free has no duplicates and no id of pool.pages, "
        "len(pool.free) is capacity minus the pages that tables and pins hold, and pool.pages holds exactly those."
    ),
    "lifecycle.pool_views": (
        "pool.tables lists exactly the live owners and pool.transfers the live pins, with the pages the operations "
        "imply (same id where a page is shared, a distinct id for every other page); each page's owners, pins and "
        "tokens match."
    ),
    "lifecycle.read_matches_history": (
        "pool.read(owner) returns a list of exactly the rows appended to that owner and the prefix it forked."
    ),
    "lifecycle.append_atomic": (
        "append(owner, token) writes that one row, or raises MemoryError and changes nothing, exactly when it needs a "
        "page (no tail, a full tail, or a shared or pinned partial tail to copy) and none is free."
    ),
    "lifecycle.fork_shares": (
        "fork(source, target) gives target the very pages of source, partial tail included, allocating nothing; "
        "an existing target raises ValueError and changes nothing."
    ),
    "lifecycle.cow_isolation": (
        "Appending into a shared or pinned partial tail copies it first: no other owner's rows and no pinned view "
        "change."
    ),
    "lifecycle.pin_retains": (
        "pin(owner, name) returns the owner's page ids and allocates nothing; an existing name raises ValueError; "
        "pinned pages stay allocated after every owner releases them and are freed by the last unpin()."
    ),
    "lifecycle.owner_names": (
        "create() raises ValueError for a live owner; read, append, fork, pin and unpin raise KeyError or ValueError "
        "for an unknown owner or pin (release may also do nothing); a refused call changes nothing."
    ),
    "lifecycle.self_check": (
        "check() of the pool, of every request and of the manager returns without raising in every reachable state."
    ),
    "lifecycle.teardown_frees_all": (
        "After every request is cancelled, every transfer drained or released and every owner and pin dropped, "
        "all pages are free."
    ),
    # ------------------------------------------------------------- the request
    "lifecycle.request_arguments": (
        "RecomputeRequest() raises ValueError for an empty owner, an empty prompt, a non-int prompt token or an owner "
        "that already has a table, and sample() of an active request raises ValueError for a non-int token; a refused "
        "call changes nothing."
    ),
    "lifecycle.request_state": (
        "state is 'queued' until the first successful resume(), 'active' after it, 'preempted' after preempt() and "
        "'cancelled' for good after cancel()."
    ),
    "lifecycle.active_rows": (
        "committed == prompt + outputs[:-1] always, and while a request is active pool.read(owner) == committed."
    ),
    "lifecycle.replay_no_refeed": (
        "resume() rebuilds exactly prompt + outputs[:-1]: the pending sample is not fed again."
    ),
    "lifecycle.replay_atomic": (
        "resume() returns True exactly when every page of the committed rows can be allocated; otherwise it returns "
        "False, keeps the state, leaves no owner or page behind and emits nothing."
    ),
    "lifecycle.decode_atomic": (
        "sample(token) first feeds the pending output; when that needs a page and none is free it raises MemoryError "
        "and changes, records and emits nothing."
    ),
    "lifecycle.outputs_append_only": (
        "outputs grows by exactly the sampled token on each successful sample() and otherwise never changes."
    ),
    "lifecycle.emission_events": (
        "events holds one {'event': 'emit', 'index': i, 'token': outputs[i]} per output, in order, i counted from 0 or "
        "from 1 and rising by one; replay, preemption and refused or failed calls emit nothing."
    ),
    "lifecycle.request_events": (
        "Besides emissions, events records in order resumed{recomputed_rows} for each successful resume(), "
        "resume_blocked{rows} for each failed one, preempted{retained_tokens} and one cancelled."
    ),
    "lifecycle.preempt_keeps_history": (
        "preempt() of an active request frees its pages and keeps its prompt and outputs."
    ),
    "lifecycle.recompute_count": (
        "recomputed_rows grows by len(committed) on each successful resume() after a preemption and by nothing else."
    ),
    "lifecycle.cancel_idempotent": (
        "cancel() frees the request's pages; repeating it neither raises nor changes or records anything, and a "
        "cancelled request never resumes."
    ),
    "lifecycle.wrong_state_refused": (
        "resume() of a request that is active or cancelled or whose owner name has a table, and sample() or preempt() "
        "of one that is not active, raise ValueError or return False, and change nothing."
    ),
    # ------------------------------------------------------------ the transfer
    "lifecycle.snapshot_published": (
        "After complete(key), read(key) returns a list of the source's rows as they were at begin(), whatever "
        "happened to the source since."
    ),
    "lifecycle.unpublished_unreadable": (
        "read(key) raises ValueError for a transfer that is not ready (in flight, draining, drained or released), "
        "and KeyError or ValueError for a key begin() never returned."
    ),
    "lifecycle.begin_arguments": (
        "begin() raises ValueError for a blank room or an empty source and KeyError or ValueError for an unknown "
        "source, and then changes nothing."
    ),
    "lifecycle.begin_rollback": (
        "begin() raises MemoryError exactly when the destination's pages cannot all be allocated, and then leaves no "
        "owner, pin, page or room behind."
    ),
    "lifecycle.key_fresh": (
        "Every key begin() returns differs from every earlier key, and generation grows by one on every begin() "
        "that reaches allocation, failed reservations included."
    ),
    "lifecycle.room_exclusive": (
        "begin() in a room with a live transfer raises ValueError or returns False or None and changes nothing; the "
        "room is free again once that transfer is drained or its output released."
    ),
    "lifecycle.transfer_records": (
        "records[key] keeps room, the snapshot taken at begin(), reason (None until abort(), then its reason) and "
        "state 'in_flight', 'draining' or 'ready' while live and none of these after; rooms maps each room to its live "
        "key."
    ),
    "lifecycle.abort_retains": (
        "abort() of an in-flight transfer returns True, drops the destination owner and keeps the source and "
        "destination pages allocated until acknowledge_drained(key)."
    ),
    "lifecycle.drain_frees": (
        "acknowledge_drained() of a draining transfer drops both pins and release_output() of a ready one drops the "
        "destination (and any pin complete() kept); each returns True and frees the pages nothing else holds."
    ),
    "lifecycle.callback_fencing": (
        "complete() and abort() apply to an in-flight key, acknowledge_drained() to a draining one, release_output() "
        "to a ready one; for a duplicate, stale, lost-race or unknown key they return False and change nothing."
    ),
    "lifecycle.abort_reason": (
        "abort() accepts exactly cancel (the default), timeout, producer_failure and consumer_failure; any other "
        "reason raises ValueError, whatever the key, and changes nothing."
    ),
}

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
    ending with the step that shows the violation).
    """

    def __init__(self, clause: str, message: str, replay: str) -> None:
        super().__init__(
            f"[{clause}] {message}\n  clause: {LIFECYCLE_CLAUSES[clause]}\n"
            "  replay (runnable Python; its last line fails on this implementation):\n"
            + "".join(f"    {line}\n" for line in replay.splitlines())
        )
        self.clause = clause
        self.detail = message
        self.replay = replay
