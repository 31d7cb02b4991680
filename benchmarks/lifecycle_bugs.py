"""One-bug variants of the published lifecycle classes that the benchmarks time.

Besides the shipped ``examples/broken_lifecycle.py`` namespaces, two bugs a
student writes that the shipped set lacks: a release that frees pinned pages,
and a replay that fails but still turns the request active.
"""

from __future__ import annotations

from types import SimpleNamespace

from pytest_cbatch.examples.broken_lifecycle import BROKEN
from pytest_cbatch.reference.scheduler_faults import PagedKV, RecomputeRequest, TransferManager


class PinBlindPool(PagedKV):
    """release() frees every page of the owner's table, pinned or not."""

    def release(self, owner: str) -> None:
        table = self._table(owner)
        del self.tables[owner]
        for page_id in table:
            page = self.pages[page_id]
            page.owners.discard(owner)
            if not page.owners:
                page.pins.clear()
                self._collect(page_id)


class FailedReplayActiveRequest(RecomputeRequest):
    """A replay that runs out of pages returns False but leaves the request active."""

    def resume(self) -> bool:
        resumed = super().resume()
        if not resumed:
            self.state = "active"
        return resumed


def _namespace(**overrides: type) -> SimpleNamespace:
    classes = {"PagedKV": PagedKV, "RecomputeRequest": RecomputeRequest, "TransferManager": TransferManager}
    return SimpleNamespace(**{**classes, **overrides})


failed_replay_active = _namespace(RecomputeRequest=FailedReplayActiveRequest)
release_ignores_pins = _namespace(PagedKV=PinBlindPool)
nonatomic_replay = BROKEN["nonatomic_replay"][0]
blocked_sample_emits = BROKEN["blocked_sample_emits"][0]
second_cancel_raises = BROKEN["second_cancel_raises"][0]

BUGS: dict[str, tuple[SimpleNamespace, str]] = {
    "failed_replay_active": (failed_replay_active, "recompute"),
    "nonatomic_replay": (nonatomic_replay, "recompute"),
    "release_ignores_pins": (release_ignores_pins, "allocator"),
    "blocked_sample_emits": (blocked_sample_emits, "recompute"),
    "second_cancel_raises": (second_cancel_raises, "recompute"),
}
"""Bug name -> (namespace, the lifecycle part that must fail)."""

