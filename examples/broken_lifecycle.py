"""Deliberately broken lifecycle implementations of the published API, one bug each.

Each namespace exposes ``PagedKV``, ``RecomputeRequest`` and ``TransferManager``;
two of the three are the reference classes and one is a subclass with a single
bug.  ``BROKEN`` maps a name to the namespace and the lifecycle clause id that
must catch it::

    pytest --cbatch-impl=pytest_cbatch.examples.broken_lifecycle:replay_refeed -k test_lifecycle
"""

from __future__ import annotations

from types import SimpleNamespace
from pytest_cbatch.reference.scheduler_faults import PagedKV, RecomputeRequest, TransferManager

__all__ = ["BROKEN"]


# ----------------------------------------------------------------- allocator


class NoCopyOnWritePool(PagedKV):
    """Writes into a shared or pinned partial tail in place."""

    def append(self, owner: str, token: int) -> None:
        table = self.tables[owner]
        if table and len(self.pages[table[-1]].tokens) < self.block_size:
            self.pages[table[-1]].tokens.append(token)
            return
        super().append(owner, token)


class CopyingForkPool(PagedKV):
    """fork() copies every page instead of sharing it."""

    def fork(self, source: str, target: str) -> None:
        rows = self.read(source)
        self.create(target)
        for token in rows:
            self.append(target, token)


class UnknownReleaseRegistersPool(PagedKV):
    """release() of an unknown owner returns [] but leaves an empty table behind under that name."""

    def release(self, owner: str) -> list[int]:
        if owner not in self.tables:
            self.tables[owner] = []
            return []
        super().release(owner)
        return []


class PinHandoffPool(PagedKV):
    """release() hands a page a pin holds over to that pin, and the last unpin() frees it, though a fork of
    the released owner still maps it (the page is then handed out again under the fork)."""

    def __init__(self, capacity: int, block_size: int) -> None:
        super().__init__(capacity, block_size)
        self.handed: set[int] = set()

    def release(self, owner: str) -> None:
        self.handed |= {page for page in self.tables.get(owner, ()) if self.pages[page].pins}
        super().release(owner)

    def unpin(self, name: str) -> None:
        super().unpin(name)
        for page in sorted(self.handed):
            if page in self.pages and not self.pages[page].pins:
                self.pages[page].owners.clear()  # the bug: the fork's owners are forgotten
                self._collect(page)

    def _collect(self, page_id: int) -> None:
        super()._collect(page_id)
        if page_id not in self.pages:
            self.handed.discard(page_id)


# ------------------------------------------------------------------- request


class RefeedRequest(RecomputeRequest):
    """Replays prompt + outputs, feeding the pending sample a second time."""

    def resume(self) -> bool:
        replay = self.state == "preempted"
        resumed = super().resume()
        if resumed and replay and self.outputs and self.pool.free:
            self.pool.append(self.owner, self.outputs[-1])
        return resumed


class ReemitRequest(RecomputeRequest):
    """A replay emits the outputs the client already has once more."""

    def resume(self) -> bool:
        replay = self.state == "preempted"
        resumed = super().resume()
        if resumed and replay:
            self.events += [{"event": "emit", "index": i, "token": t} for i, t in enumerate(self.outputs)]
        return resumed


class ForgetfulPreemptRequest(RecomputeRequest):
    """Preemption drops the outputs already sent to the client."""

    def preempt(self) -> None:
        super().preempt()
        self.outputs.clear()


class LeakyReplayRequest(RecomputeRequest):
    """When the pool runs out midway through a replay, the pages taken so far are kept."""

    def resume(self) -> bool:
        if self.state not in ("queued", "preempted") or self.owner in self.pool.tables:
            raise ValueError("wrong state")
        self.pool.create(self.owner)
        try:
            for token in self.committed:
                self.pool.append(self.owner, token)
        except MemoryError:
            self.events.append({"event": "resume_blocked", "rows": len(self.committed)})
            self.pool.release(self.owner)
            self.pool.create(self.owner)  # the bug: a table is left behind ...
            self.pool.append(self.owner, self.committed[0])  # ... holding a page
            return False
        replayed = len(self.committed) if self.state == "preempted" else 0
        self.recomputed_rows += replayed
        self.state = "active"
        self.events.append({"event": "resumed", "recomputed_rows": replayed})
        return True


class FirstPrefillCountedRequest(RecomputeRequest):
    """recomputed_rows also counts the first prefill."""

    def resume(self) -> bool:
        first = self.state == "queued"
        resumed = super().resume()
        if resumed and first:
            self.recomputed_rows += len(self.committed)
        return resumed


class EmitOnBlockedSampleRequest(RecomputeRequest):
    """A sample() whose pending row finds no page still records and emits the new output."""

    def sample(self, token: int) -> None:
        try:
            super().sample(token)
        except MemoryError:
            self.outputs.append(token)
            self.events.append({"event": "emit", "index": len(self.outputs) - 1, "token": token})


class DoubleCancelRequest(RecomputeRequest):
    """A second cancel() raises instead of doing nothing."""

    def cancel(self) -> None:
        if self.state == "cancelled":
            raise RuntimeError(f"request {self.owner!r} is already cancelled")
        super().cancel()


class UndeadRequest(RecomputeRequest):
    """resume() brings a cancelled request back."""

    def resume(self) -> bool:
        if self.state == "cancelled":
            self.state = "preempted"
        return super().resume()


# ------------------------------------------------------------------ transfer


class UncountedPreemptRequest(RecomputeRequest):
    """preempt() records a bare preempted event, without the retained_tokens field the contract names."""

    def preempt(self) -> None:
        super().preempt()
        self.events[-1] = {"event": "preempted"}


class EagerAbortManager(TransferManager):
    """abort() frees the transfer's pages at once instead of waiting for the drain acknowledgement."""

    def abort(self, key: str, reason: str = "cancel") -> bool:
        if not super().abort(key, reason):
            return False
        record = self.records[key]
        self.pool.unpin(record.source_pin)
        self.pool.unpin(record.destination_pin)
        record.state = "drained"
        del self.rooms[record.room]
        return True


class LiveSourceManager(TransferManager):
    """read() publishes the source's current rows instead of the snapshot taken at begin()."""

    def __init__(self, pool: PagedKV) -> None:
        super().__init__(pool)
        self.sources: dict[str, str] = {}

    def begin(self, source: str, room: str) -> str:
        key = super().begin(source, room)
        self.sources[key] = source
        return key

    def read(self, key: str) -> list[int]:
        super().read(key)  # keeps the "not ready" refusal
        return self.pool.read(self.sources[key])


class RoomLookupManager(TransferManager):
    """complete() looks the transfer up by the key's room, so a stale key completes the newer attempt."""

    def complete(self, key: str) -> bool:
        record = self.records.get(key)
        return super().complete(self.rooms.get(record.room, key) if record is not None else key)


class LeakyRollbackManager(TransferManager):
    """A begin() whose destination cannot be reserved leaves the source pinned."""

    def begin(self, source: str, room: str) -> str:
        try:
            return super().begin(source, room)
        except MemoryError:
            self.pool.pin(source, f"_transfer/{self.generation}/source")  # undoes the rollback's unpin
            raise


class ReusedKeyManager(TransferManager):
    """Numbering restarts whenever nothing is live, so an ended transfer's key comes back."""

    def begin(self, source: str, room: str) -> str:
        if not self.rooms:
            self.generation = 0
        return super().begin(source, room)


class AnyReasonManager(TransferManager):
    """abort() takes any reason."""

    def abort(self, key: str, reason: str = "cancel") -> bool:
        aborted = super().abort(key)
        if aborted:
            self.records[key].reason = reason
        return aborted


class ForgottenReasonManager(TransferManager):
    """abort() drains the transfer but leaves its record's reason at None."""

    def abort(self, key: str, reason: str = "cancel") -> bool:
        aborted = super().abort(key, reason)
        if aborted:
            self.records[key].reason = None
        return aborted


class UnpinnedDestinationManager(TransferManager):
    """begin() reserves the destination without pinning it, so nothing holds its pages past an abort."""

    def begin(self, source: str, room: str) -> str:
        key = super().begin(source, room)
        self.pool.unpin(self.records[key].destination_pin)
        return key


class EarlyReadManager(TransferManager):
    """read() of an in-flight transfer returns the unpublished placeholder rows."""

    def read(self, key: str) -> list[int]:
        record = self.records[key]
        if record.state == "in_flight":
            return self.pool.read(record.owner)
        return super().read(key)


class PinLeakManager(TransferManager):
    """complete() keeps the source pin, and release_output() does not drop it either."""

    def complete(self, key: str) -> bool:
        record = self.records.get(key)
        if record is None or record.state != "in_flight":
            return super().complete(key)
        offset = 0
        for page_id in record.destination_pages:
            tokens = self.pool.pages[page_id].tokens
            tokens[:] = record.snapshot[offset : offset + len(tokens)]
            offset += len(tokens)
        self.pool.unpin(record.destination_pin)
        record.state = "ready"
        return True

    def check(self) -> None:  # its own check() shares the blind spot
        self.pool.check()


def _namespace(**overrides: type) -> SimpleNamespace:
    classes = {"PagedKV": PagedKV, "RecomputeRequest": RecomputeRequest, "TransferManager": TransferManager}
    return SimpleNamespace(**{**classes, **overrides})


append_without_cow = _namespace(PagedKV=NoCopyOnWritePool)
fork_copies_pages = _namespace(PagedKV=CopyingForkPool)
replay_refeed = _namespace(RecomputeRequest=RefeedRequest)
replay_reemits = _namespace(RecomputeRequest=ReemitRequest)
preempt_forgets_outputs = _namespace(RecomputeRequest=ForgetfulPreemptRequest)
nonatomic_replay = _namespace(RecomputeRequest=LeakyReplayRequest)
first_prefill_counted = _namespace(RecomputeRequest=FirstPrefillCountedRequest)
blocked_sample_emits = _namespace(RecomputeRequest=EmitOnBlockedSampleRequest)
second_cancel_raises = _namespace(RecomputeRequest=DoubleCancelRequest)
cancelled_resumes = _namespace(RecomputeRequest=UndeadRequest)
abort_frees_immediately = _namespace(TransferManager=EagerAbortManager)
publishes_live_source = _namespace(TransferManager=LiveSourceManager)
room_lookup_callbacks = _namespace(TransferManager=RoomLookupManager)
begin_leaks_source_pin = _namespace(TransferManager=LeakyRollbackManager)
keys_reused = _namespace(TransferManager=ReusedKeyManager)
abort_any_reason = _namespace(TransferManager=AnyReasonManager)
reads_in_flight = _namespace(TransferManager=EarlyReadManager)
source_pin_leaks = _namespace(TransferManager=PinLeakManager)
unknown_release_registers = _namespace(PagedKV=UnknownReleaseRegistersPool)
unpin_frees_forked_page = _namespace(PagedKV=PinHandoffPool)
preempted_uncounted = _namespace(RecomputeRequest=UncountedPreemptRequest)
abort_forgets_reason = _namespace(TransferManager=ForgottenReasonManager)
destination_unpinned = _namespace(TransferManager=UnpinnedDestinationManager)

BROKEN: dict[str, tuple[SimpleNamespace, str]] = {
    "append_without_cow": (append_without_cow, "lifecycle.cow_isolation"),
    "fork_copies_pages": (fork_copies_pages, "lifecycle.fork_shares"),
    "replay_refeed": (replay_refeed, "lifecycle.replay_no_refeed"),
    "replay_reemits": (replay_reemits, "lifecycle.emission_events"),
    "preempt_forgets_outputs": (preempt_forgets_outputs, "lifecycle.preempt_keeps_history"),
    "nonatomic_replay": (nonatomic_replay, "lifecycle.replay_atomic"),
    "first_prefill_counted": (first_prefill_counted, "lifecycle.recompute_count"),
    "blocked_sample_emits": (blocked_sample_emits, "lifecycle.decode_atomic"),
    "second_cancel_raises": (second_cancel_raises, "lifecycle.cancel_idempotent"),
    "cancelled_resumes": (cancelled_resumes, "lifecycle.cancel_idempotent"),
    "abort_frees_immediately": (abort_frees_immediately, "lifecycle.abort_retains"),
    "publishes_live_source": (publishes_live_source, "lifecycle.snapshot_published"),
    "room_lookup_callbacks": (room_lookup_callbacks, "lifecycle.callback_fencing"),
    "begin_leaks_source_pin": (begin_leaks_source_pin, "lifecycle.begin_rollback"),
    "keys_reused": (keys_reused, "lifecycle.key_fresh"),
    "abort_any_reason": (abort_any_reason, "lifecycle.abort_reason"),
    "reads_in_flight": (reads_in_flight, "lifecycle.unpublished_unreadable"),
    "source_pin_leaks": (source_pin_leaks, "lifecycle.drain_frees"),
    "unknown_release_registers": (unknown_release_registers, "lifecycle.owner_names"),
    "unpin_frees_forked_page": (unpin_frees_forked_page, "lifecycle.pin_retains"),
    "preempted_uncounted": (preempted_uncounted, "lifecycle.request_events"),
    "abort_forgets_reason": (abort_forgets_reason, "lifecycle.transfer_records"),
    "destination_unpinned": (destination_unpinned, "lifecycle.begin_rollback"),
}
"""Bug name -> (implementation namespace, id of the clause that must fail)."""
