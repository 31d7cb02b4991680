"""The lifecycle verdicts reach the bugs a new user's model has, under the kit's default settings.

A transfer model written from the course text reserves its destination pages empty and copies the
rows in at complete() (``lifecycle_variant``): nothing published reads those pages before that, so
it passes; its twins with one real bug each (an abort that frees at once, a stale callback that
finds its transfer by room) then fail their own clause, where before every transfer run of theirs
stopped at ``lifecycle.pool_views``.  A pool that frees a page at unpin() while a fork still maps
it takes fork, pin, release and unpin in that order, which the ci profile's random runs missed.
(That the variant itself passes every clause is ``test_lifecycle_conformance``'s.)
Each is judged as the default ``cbatch-ci`` profile (no shrink phase: detection is what is tested)
and, for the allocator, as grading's default ``lifecycle_examples`` does.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import Phase, settings

from pytest_cbatch.examples import lifecycle_variant
from pytest_cbatch.examples.broken_lifecycle import BROKEN
from pytest_cbatch.grading.evaluate import _part_verdicts
from pytest_cbatch.grading.rubric import Rubric
from pytest_cbatch.lifecycle import lifecycle_verdicts
from pytest_cbatch.pytest_options import register_profiles


@pytest.fixture(scope="module")
def ci() -> settings:
    """The kit's default profile, without its shrink phase."""
    register_profiles()
    return settings(settings.get_profile("cbatch-ci"), phases=(Phase.explicit, Phase.generate))


class EagerAbortManager(lifecycle_variant.TransferManager):
    """abort() frees the transfer's pages at once instead of waiting for the drain acknowledgement."""

    def abort(self, key: Any, reason: str = "cancel") -> bool:
        if not super().abort(key, reason):
            return False
        return self.acknowledge_drained(key)


class RoomLookupManager(lifecycle_variant.TransferManager):
    """complete() finds the transfer by the key's room, so a stale key completes the newer attempt."""

    def complete(self, key: Any) -> bool:
        record = self.records.get(key)
        return super().complete(self.rooms.get(record.room, key) if record is not None else key)


class UncopiedManager(lifecycle_variant.TransferManager):
    """complete() publishes without copying the rows into the destination pages; read() answers from the record."""

    def complete(self, key: Any) -> bool:
        record = self._in(key, "in_flight")
        if record is None:
            return False
        self.pool.unpin(record.destination_pin)
        record.state = "ready"
        return True

    def read(self, key: Any) -> list[int]:
        super().read(key)  # keeps the "not published" refusal
        return list(self.records[key].snapshot)


def variant_with(manager: type) -> SimpleNamespace:
    return SimpleNamespace(PagedKV=lifecycle_variant.PagedKV, RecomputeRequest=lifecycle_variant.RecomputeRequest,
                           TransferManager=manager)


@pytest.mark.parametrize("manager,clause", [(EagerAbortManager, "lifecycle.abort_retains"),
                                            (RoomLookupManager, "lifecycle.callback_fencing")])
def test_a_bug_behind_empty_destination_pages_fails_its_own_clause(ci: settings, manager: type, clause: str) -> None:
    """The first failure the search finds is the bug's own clause (max_failures=1: the search stops there)."""
    verdicts = lifecycle_verdicts("transfer", variant_with(manager), ci, max_failures=1)
    failed = {cid: v.message for cid, v in verdicts.items() if v.status == "fail"}
    assert set(failed) == {clause}, failed


def test_published_destination_pages_are_compared_row_for_row(ci: settings) -> None:
    """Only an unpublished destination's rows are open: once complete() returns, its pages must hold the
    snapshot, and the replay asserts the very rows (no placeholder in it)."""
    verdict = lifecycle_verdicts("transfer", variant_with(UncopiedManager), ci, max_failures=1)["lifecycle.pool_views"]
    assert verdict.status == "fail", verdict.message
    header, _, replay = verdict.message.partition("replay")
    assert ".tokens == [], expected [" in header and "None" not in verdict.message, verdict.message
    assert replay.rstrip().splitlines()[-1].strip().startswith("assert list(pool.pages[")


def test_a_page_freed_under_a_fork_fails_under_the_ci_profile(ci: settings) -> None:
    namespace, clause = BROKEN["unpin_frees_forked_page"]
    verdicts = lifecycle_verdicts("allocator", namespace, ci, max_failures=1)
    assert verdicts[clause].status == "fail", verdicts[clause].message
    assert "pool.fork(" in verdicts[clause].message and "pool.unpin(" in verdicts[clause].message


def test_a_page_freed_under_a_fork_fails_in_grading() -> None:
    namespace, clause = BROKEN["unpin_frees_forked_page"]
    verdicts = _part_verdicts("allocator", SimpleNamespace(namespace=namespace), Rubric("default").lifecycle_examples, [])
    status, message, _ = verdicts[clause]
    assert status == "fail", message
