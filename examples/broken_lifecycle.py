"""Deliberately broken lifecycle implementations, one bug each, for the lifecycle machines.

Each namespace exposes ``PagedKV``, ``RecomputeRequest`` and ``TransferManager``;
two of the three are the reference classes and one is a subclass with a single
bug, written against the public API only. ``BROKEN`` maps a name to the
namespace and the lifecycle clause id that must catch it::

    pytest --cbatch-impl=pytest_cbatch.examples.broken_lifecycle:replay_refeed
"""

from __future__ import annotations

from itertools import count
from types import SimpleNamespace

from pytest_cbatch.reference.scheduler_faults import PagedKV, RecomputeRequest, TransferManager

__all__ = ["BROKEN"]


class RefeedRequest(RecomputeRequest):
    """Replays prompt + outputs, feeding the pending sample a second time."""

    def resume(self) -> bool:
        replay = self.state == "preempted"
        resumed = super().resume()
        if resumed and replay and self.outputs:
            self.pool.append(self.owner, self.outputs[-1:])
        return resumed


class ForgetfulPreemptRequest(RecomputeRequest):
    """Preemption drops the outputs already sent to the client."""

    def preempt(self) -> bool:
        preempted = super().preempt()
        self.outputs.clear()
        return preempted


class LeakyReplayRequest(RecomputeRequest):
    """Rebuilds block by block into a staging owner and abandons it when the pool runs dry."""

    _stagings = count()

    def resume(self) -> bool:
        if self.state in ("queued", "preempted"):
            staging = f"{self.owner}#staging{next(self._stagings)}"
            self.pool.create(staging)
            rows, block = self.committed_rows(), self.pool.block_size
            for start in range(0, len(rows), block):
                if not self.pool.append(staging, rows[start : start + block]):
                    return False  # the staged pages are never released
            self.pool.release(staging)
        return super().resume()


class DoubleCancelRequest(RecomputeRequest):
    """A second cancel() raises instead of doing nothing."""

    def cancel(self) -> None:
        if self.state == "cancelled":
            raise RuntimeError(f"request {self.owner!r} is already cancelled")
        super().cancel()


class EagerAbortManager(TransferManager):
    """abort() frees the transfer's pages at once instead of waiting for the drain acknowledgement."""

    def abort(self, key: int, reason: str) -> bool:
        aborted = super().abort(key, reason)
        if aborted:
            super().acknowledge_drained(key)
        return aborted


class LiveSourceManager(TransferManager):
    """read() publishes the source's current rows instead of the snapshot taken at begin()."""

    def read(self, key: int) -> list[int]:
        super().read(key)  # keeps the "not ready" refusal
        return self.pool.read(self.records[key].source)


def _namespace(**overrides: type) -> SimpleNamespace:
    classes = {"PagedKV": PagedKV, "RecomputeRequest": RecomputeRequest, "TransferManager": TransferManager}
    return SimpleNamespace(**{**classes, **overrides})


replay_refeed = _namespace(RecomputeRequest=RefeedRequest)
preempt_forgets_outputs = _namespace(RecomputeRequest=ForgetfulPreemptRequest)
abort_frees_immediately = _namespace(TransferManager=EagerAbortManager)
publishes_live_source = _namespace(TransferManager=LiveSourceManager)
nonatomic_replay = _namespace(RecomputeRequest=LeakyReplayRequest)
second_cancel_raises = _namespace(RecomputeRequest=DoubleCancelRequest)

BROKEN: dict[str, tuple[SimpleNamespace, str]] = {
    "replay_refeed": (replay_refeed, "lifecycle.replay_no_refeed"),
    "preempt_forgets_outputs": (preempt_forgets_outputs, "lifecycle.preempt_keeps_history"),
    "abort_frees_immediately": (abort_frees_immediately, "lifecycle.abort_retains"),
    "publishes_live_source": (publishes_live_source, "lifecycle.snapshot_published"),
    "nonatomic_replay": (nonatomic_replay, "lifecycle.replay_atomic"),
    "second_cancel_raises": (second_cancel_raises, "lifecycle.cancel_idempotent"),
}
"""Bug name -> (implementation namespace, id of the clause that must fail)."""
