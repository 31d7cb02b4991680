"""Preemption with full recomputation, and KV transfers that outlive cancellation.

CPU lifecycle exercises on the ``PagedKV`` of ``scheduler_sim.py`` (standard
library only): tokens stand for KV rows and call order for serialized
control-plane events; no latency, model or DMA is simulated.  Run ``python
scheduler_faults.py [--output faults.json]`` for the deterministic report of
``demo()``.

Three histories are kept apart.  ``RecomputeRequest`` keeps the prompt and the
client-visible ``outputs`` on the host; while it is active its page table holds
exactly ``committed = prompt + outputs[:-1]``: the newest output has been
sampled but not yet fed back.  Request states: ``"queued"`` (never resident),
``"active"`` (owns pages), ``"preempted"`` (pages released, history kept),
``"cancelled"`` (final).

``TransferManager`` copies a source owner's rows to a private destination in the
same pool.  Transfer states: ``"in_flight"`` -> ``"ready"`` (``complete``) ->
``"released"`` (``release_output``), or ``"in_flight"`` -> ``"draining"``
(``abort``) -> ``"drained"`` (``acknowledge_drained``).  While in flight or
draining, the source pages and the destination pages stay pinned, because a
timeout or a cancellation does not prove the transport stopped touching them.
Callbacks carry keys (``"_transfer/<generation>"``), never room names, so a
stale key cannot touch a newer attempt; one that does not apply returns False
and changes nothing.  Terminal records are kept as tombstones.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

if __package__:  # installed: pytest_cbatch.reference.scheduler_faults
    from .scheduler_sim import PagedKV
else:  # the course's layout: this file beside scheduler_sim.py, that folder on sys.path
    from scheduler_sim import PagedKV

__all__ = ["ABORT_REASONS", "PagedKV", "RecomputeRequest", "Transfer", "TransferManager", "demo", "main"]

ABORT_REASONS = ("cancel", "timeout", "producer_failure", "consumer_failure")
_LIVE = ("in_flight", "draining", "ready")


class RecomputeRequest:
    """One request whose KV is dropped on preemption and rebuilt by replaying its committed rows.

    ``events`` records, in order: ``resumed{recomputed_rows}`` (0 for the first
    resume), ``resume_blocked{rows}``, ``emit{index, token}`` (index from 0, one
    per output, never on replay), ``preempted{retained_tokens}`` and
    ``cancelled``.  Calls in the wrong state raise ValueError and change nothing.
    """

    def __init__(self, pool: PagedKV, owner: str, prompt: Sequence[int]) -> None:
        """Queue a request; nothing is allocated until ``resume()``.

        ValueError for an empty owner, an empty prompt or one holding a
        non-int, or an owner that already has a table in ``pool``.
        """
        if not owner:
            raise ValueError("the owner must be a non-empty name")
        try:
            tokens = list(prompt)
        except TypeError:
            raise ValueError(f"the prompt must be a list of ints, got {prompt!r}") from None
        if not tokens or any(type(token) is not int for token in tokens):
            raise ValueError(f"the prompt must be a non-empty list of ints, got {prompt!r}")
        if owner in pool.tables:
            raise ValueError(f"owner {owner!r} already has a table in the pool")
        self.pool = pool
        self.owner = owner
        self.prompt = tokens
        self.outputs: list[int] = []
        self.state = "queued"
        self.recomputed_rows = 0
        self.events: list[dict[str, Any]] = []

    @property
    def committed(self) -> list[int]:
        """The rows whose KV exists while active: the prompt and every output but the newest."""
        return self.prompt + self.outputs[:-1]

    def resume(self) -> bool:
        """Allocate ``committed`` atomically and become active; return whether it did.

        ValueError unless queued or preempted, or if the owner's name has a
        table (reused while suspended).  When the pool runs out midway every
        page it took is released, ``resume_blocked`` is recorded and False is
        returned.  A successful replay after a preemption adds its rows to
        ``recomputed_rows``; the first resume does not.
        """
        if self.state not in ("queued", "preempted"):
            raise ValueError(f"request {self.owner!r} is {self.state}: only a queued or preempted one resumes")
        if self.owner in self.pool.tables:
            raise ValueError(f"owner {self.owner!r} was created by someone else while the request was suspended")
        rows = self.committed
        self.pool.create(self.owner)
        try:
            for token in rows:
                self.pool.append(self.owner, token)
        except MemoryError:
            self.pool.release(self.owner)
            self.events.append({"event": "resume_blocked", "rows": len(rows)})
            return False
        replayed = len(rows) if self.state == "preempted" else 0
        self.recomputed_rows += replayed
        self.state = "active"
        self.events.append({"event": "resumed", "recomputed_rows": replayed})
        return True

    def sample(self, token: int) -> None:
        """Feed the pending output back, then record ``token`` (a stand-in model result) as the next output.

        ValueError unless active and ``token`` is an int.  A MemoryError from
        feeding the pending row propagates; then nothing changed or was emitted.
        """
        if self.state != "active":
            raise ValueError(f"request {self.owner!r} is {self.state}: only an active one samples")
        if type(token) is not int:
            raise ValueError(f"a sampled token must be an int, got {token!r}")
        if self.outputs:
            self.pool.append(self.owner, self.outputs[-1])
        self.outputs.append(token)
        self.events.append({"event": "emit", "index": len(self.outputs) - 1, "token": token})

    def preempt(self) -> None:
        """Release the pages of an active request and keep its history; ValueError unless active."""
        if self.state != "active":
            raise ValueError(f"request {self.owner!r} is {self.state}: only an active one is preempted")
        self.pool.release(self.owner)
        self.state = "preempted"
        self.events.append({"event": "preempted", "retained_tokens": len(self.committed)})

    def cancel(self) -> None:
        """Release any pages and end the request for good; a second call does nothing."""
        if self.state == "cancelled":
            return
        if self.state == "active":
            self.pool.release(self.owner)
        self.state = "cancelled"
        self.events.append({"event": "cancelled"})

    def check(self) -> None:
        """Verify the pool and the three histories against each other; AssertionError on a break."""
        self.pool.check()
        if self.state == "active":
            rows = self.pool.read(self.owner)
            assert rows == self.committed, (
                f"request {self.owner!r}: its table reads {rows}, expected prompt + outputs[:-1] = {self.committed}"
            )
        else:
            assert self.owner not in self.pool.tables, f"request {self.owner!r} is {self.state} but owns a table"
        emitted = [event["token"] for event in self.events if event["event"] == "emit"]
        assert emitted == self.outputs, f"request {self.owner!r}: emitted {emitted}, outputs {self.outputs}"


@dataclass
class Transfer:
    """One transfer attempt, kept after it ends as a tombstone."""

    key: str
    room: str
    owner: str  # the destination owner in the pool (named like the key)
    source_pin: str
    destination_pin: str
    snapshot: tuple[int, ...]
    destination_pages: tuple[int, ...]
    state: str = "in_flight"
    reason: str | None = None


class TransferManager:
    """Moves KV rows between owners of one pool, keeping storage until it is provably unused.

    ``generation`` counts every ``begin`` past validation, failed reservations
    included; the key is ``"_transfer/<generation>"``, which names the
    destination owner, and its pins are ``key + "/source"`` and ``key +
    "/destination"``.  The manager owns that namespace of the pool.  ``rooms``
    maps each room to its live (in_flight, draining or ready) key; ``events``
    logs every call that took effect, and ignored completions.
    """

    def __init__(self, pool: PagedKV) -> None:
        self.pool = pool
        self.generation = 0
        self.records: dict[str, Transfer] = {}
        self.rooms: dict[str, str] = {}
        self.events: list[dict[str, Any]] = []

    def begin(self, source: str, room: str) -> str:
        """Snapshot ``source``, pin it and reserve a pinned private destination; return the new key.

        ValueError for a blank room, a room with a live transfer or an empty
        source (KeyError for an unknown one).  The generation advances before
        allocating; a MemoryError rolls back every page and pin, then propagates.
        """
        if not isinstance(room, str) or not room.strip():
            raise ValueError(f"the room must be a non-blank string, got {room!r}")
        if room in self.rooms:
            raise ValueError(f"room {room!r} has a live transfer {self.rooms[room]!r}")
        snapshot = tuple(self.pool.read(source))
        if not snapshot:
            raise ValueError(f"source {source!r} holds no KV to transfer")
        self.generation += 1
        key = f"_transfer/{self.generation}"
        source_pin, destination_pin = key + "/source", key + "/destination"
        if key in self.pool.tables or source_pin in self.pool.transfers or destination_pin in self.pool.transfers:
            raise ValueError(f"{key!r} is taken in the pool: the manager owns the _transfer/ namespace")
        self.pool.pin(source, source_pin)
        self.pool.create(key)
        try:
            for _ in snapshot:  # placeholder rows: nothing is published before complete()
                self.pool.append(key, 0)
        except MemoryError:
            self.pool.release(key)
            self.pool.unpin(source_pin)
            raise
        pages = self.pool.pin(key, destination_pin)
        self.records[key] = Transfer(key, room, key, source_pin, destination_pin, snapshot, pages)
        self.rooms[room] = key
        self.events.append({"event": "begin", "key": key, "room": room, "rows": len(snapshot)})
        return key

    def complete(self, key: str) -> bool:
        """Publish an in-flight transfer (copy the snapshot, drop both pins); False and no change otherwise."""
        record = self.records.get(key)
        if record is None or record.state != "in_flight":
            self.events.append({"event": "completion_ignored", "key": key})
            return False
        offset = 0
        for page_id in record.destination_pages:
            tokens = self.pool.pages[page_id].tokens
            tokens[:] = record.snapshot[offset : offset + len(tokens)]
            offset += len(tokens)
        self.pool.unpin(record.source_pin)
        self.pool.unpin(record.destination_pin)
        record.state = "ready"
        self.events.append({"event": "ready", "key": key})
        return True

    def abort(self, key: str, reason: str = "cancel") -> bool:
        """Stop an in-flight transfer: drop the destination owner, keep both pins until the drain ack.

        ValueError for a reason outside ABORT_REASONS, checked first.  False
        and no change unless the key is in flight (a lost race with complete()).
        """
        if reason not in ABORT_REASONS:
            raise ValueError(f"unknown abort reason {reason!r}; expected one of {', '.join(ABORT_REASONS)}")
        record = self.records.get(key)
        if record is None or record.state != "in_flight":
            return False
        record.state, record.reason = "draining", reason
        self.pool.release(record.owner)
        self.events.append({"event": "abort", "key": key, "reason": reason})
        return True

    def acknowledge_drained(self, key: str) -> bool:
        """The transport stopped touching a draining transfer: free its pins and room; False otherwise."""
        record = self.records.get(key)
        if record is None or record.state != "draining":
            return False
        self.pool.unpin(record.source_pin)
        self.pool.unpin(record.destination_pin)
        record.state = "drained"
        del self.rooms[record.room]
        self.events.append({"event": "drained", "key": key})
        return True

    def release_output(self, key: str) -> bool:
        """Drop a published destination and free its room; False and no change unless it is ready."""
        record = self.records.get(key)
        if record is None or record.state != "ready":
            return False
        self.pool.release(record.owner)
        record.state = "released"
        del self.rooms[record.room]
        self.events.append({"event": "output_released", "key": key})
        return True

    def read(self, key: str) -> list[int]:
        """The published rows; ValueError unless the transfer is ready (KeyError for an unknown key)."""
        try:
            record = self.records[key]
        except KeyError:
            raise KeyError(f"unknown transfer {key!r}") from None
        if record.state != "ready":
            raise ValueError(f"transfer {key!r} is {record.state}: only completed KV is readable")
        return self.pool.read(record.owner)

    def check(self) -> None:
        """Verify the pool, the room table, every record's pins and owner, and the published rows."""
        self.pool.check()
        live = {record.room: key for key, record in self.records.items() if record.state in _LIVE}
        assert self.rooms == live, f"room table {self.rooms} but live transfers {live}"
        for key, record in self.records.items():
            pinned = record.state in ("in_flight", "draining")
            for pin in (record.source_pin, record.destination_pin):
                assert (pin in self.pool.transfers) == pinned, f"{key} is {record.state}: pin {pin!r} wrong"
            owned = record.state in ("in_flight", "ready")
            assert (record.owner in self.pool.tables) == owned, f"{key} is {record.state}: owner wrong"
            if pinned:
                assert self.pool.transfers[record.destination_pin] == record.destination_pages, (
                    f"{key}: destination pin holds {self.pool.transfers[record.destination_pin]}, "
                    f"reserved {record.destination_pages}"
                )
                frozen = tuple(t for p in self.pool.transfers[record.source_pin] for t in self.pool.pages[p].tokens)
                assert frozen == record.snapshot, f"{key}: the pinned source reads {frozen}, snapshot {record.snapshot}"
            if record.state == "ready":
                assert tuple(self.read(key)) == record.snapshot, f"{key}: published rows differ from the snapshot"


def demo() -> dict[str, Any]:
    """The built-in lifecycle run: the course's exercise 5, as a JSON-ready document.

    A request is preempted while a transfer of its committed rows is in
    flight; the transfer times out and keeps four pages until its drain is
    acknowledged; the replay recomputes four rows; a second transfer of the
    longer history is published, read and released; every page ends free.
    """
    pool = PagedKV(8, 2)
    request = RecomputeRequest(pool, "request", [10, 11, 12])
    _expect(request.resume(), "the first resume")
    request.sample(20)
    request.sample(21)
    transfers = TransferManager(pool)
    old = transfers.begin("request", "room-a")
    request.preempt()
    transfers.abort(old, "timeout")
    retained_before_ack = len(pool.pages)
    _expect(not transfers.complete(old), "an aborted transfer never completes")
    transfers.acknowledge_drained(old)
    _expect(request.resume(), "the replay after the drain")
    request.sample(22)
    new = transfers.begin("request", "room-a")
    _expect(not transfers.complete(old), "a stale completion is ignored")
    transfers.complete(new)
    received = transfers.read(new)
    transfers.release_output(new)
    request.cancel()
    return {
        "schema_version": 1,
        "model": "CPU lifecycle accounting; no timing model",
        "request_events": request.events,
        "transfer_events": transfers.events,
        "outputs": request.outputs,
        "received_rows": received,
        "recomputed_rows": request.recomputed_rows,
        "retained_pages_before_drain_ack": retained_before_ack,
        "free_pages_at_end": len(pool.free),
    }


def _expect(condition: bool, what: str) -> None:
    if not condition:  # not an assert: the demo must run the same under python -O
        raise RuntimeError(f"demo: {what} failed")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def _write_atomically(path: str, text: str) -> None:
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{os.path.basename(path)}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def main(argv: Iterable[str] | None = None) -> int:
    """Print the demo document with indent 2, or write it atomically to ``--output``; 1 if it cannot be written."""
    parser = _Parser(description="Deterministic preemption/recompute and KV-transfer lifecycle report.")
    parser.add_argument("--output", metavar="PATH", help="write the JSON report here instead of printing it")
    args = parser.parse_args(None if argv is None else list(argv))
    text = json.dumps(demo(), indent=2) + "\n"
    if args.output is None:
        sys.stdout.write(text)
        return 0
    try:
        _write_atomically(args.output, text)
    except OSError as exc:
        print(f"{parser.prog}: error: cannot write {args.output!r}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
