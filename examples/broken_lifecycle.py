"""Deliberately broken lifecycle implementations of the published API, one bug each.

Each namespace exposes ``PagedKV``, ``RecomputeRequest`` and ``TransferManager``;
two of the three are the reference classes and one is a subclass with a single
bug.  ``BROKEN`` maps a name to the namespace and the lifecycle clause id that
must catch it::

    pytest --cbatch-impl=pytest_cbatch.examples.broken_lifecycle:replay_refeed -k test_lifecycle
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

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
        super().create(target)
        for token in self.read(source):
            self.append(target, token)


# ------------------------------------------------------------------- request


class RefeedRequest(RecomputeRequest):
    """Replays prompt + outputs, feeding the pending sample a second time."""

    def resume(self) -> bool:
        replay = self.state == "preempted"
        resumed = super().resume()
        if resumed and replay and self.outputs:
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


class EagerAbortManager(TransferManager):
    """abort() frees the transfer's pages at once instead of waiting for the drain acknowledgement."""

    def abort(self, key: str, reason: str = "cancel") -> bool:
        aborted = super().abort(key, reason)
        if aborted:
            record = self.records[key]
            self.pool.unpin(record.source_pin)
            self.pool.unpin(record.destination_pin)
            record.source_pin = record.destination_pin = "gone"  # so check() does not notice
        return aborted


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
    """A begin() whose destination cannot be reserved leaves the source pin behind."""

    def begin(self, source: str, room: str) -> str:
        unpin = self.pool.unpin
        self.pool.unpin = lambda name: None  # type: ignore[method-assign]  # the rollback's unpin is lost
        try:
            return super().begin(source, room)
        finally:
            self.pool.unpin = unpin  # type: ignore[method-assign]


class ReusedKeyManager(TransferManager):
    """Keys count live transfers, so a key comes back once its transfer ended."""

    def begin(self, source: str, room: str) -> str:
        key = super().begin(source, room)
        reused = f"_transfer/{len(self.rooms)}"
        if reused == key or reused in self.pool.tables:
            return key
        record = self.records.pop(key)
        self.records[reused] = record
        self.rooms[room] = reused
        record.key = reused
        return reused


class AnyReasonManager(TransferManager):
    """abort() takes any reason."""

    def abort(self, key: str, reason: str = "cancel") -> bool:
        return super().abort(key, "cancel") and self._set_reason(key, reason)

    def _set_reason(self, key: str, reason: str) -> bool:
        self.records[key].reason = reason
        return True


class EarlyReadManager(TransferManager):
    """read() of an in-flight transfer returns the unpublished placeholder rows."""

    def read(self, key: str) -> list[int]:
        record = self.records[key]
        if record.state == "in_flight":
            return self.pool.read(record.owner)
        return super().read(key)


class PinLeakManager(TransferManager):
    """complete() and release_output() never drop the source pin."""

    def complete(self, key: str) -> bool:
        record = self.records.get(key)
        if record is None or record.state != "in_flight":
            return False
        pin = record.source_pin
        record.source_pin = f"{pin}#kept"  # complete() unpins this name: nothing
        self.pool.transfers[record.source_pin] = self.pool.transfers[pin]
        for page in self.pool.transfers[pin]:
            self.pool.pages[page].pins.add(record.source_pin)
        return super().complete(key) and self._keep(record, pin)

    def _keep(self, record: Any, pin: str) -> bool:
        record.source_pin = pin
        return True


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
}
"""Bug name -> (implementation namespace, id of the clause that must fail)."""
