"""Preemption with full recomputation, and KV transfers that outlive cancellation.

Standard library only. Run ``python scheduler_faults.py --output faults.json``
for the deterministic built-in report (``demo()``); without ``--output`` the
JSON is printed.

Three histories are kept apart. ``RecomputeRequest`` keeps the prompt and the
client-visible ``outputs`` on the host; its page table holds the committed KV
rows, which while active are exactly ``prompt + outputs[:-1]``: the newest
output has been sampled but not yet fed back.

Request states: ``"queued"`` (never resident), ``"active"`` (owns pages),
``"preempted"`` (pages released, history kept) and ``"cancelled"`` (final).

``TransferManager`` copies a source owner's rows to a private destination in the
same pool. Transfer states: ``"in_flight"`` -> ``"ready"`` (``complete``) ->
``"released"`` (``release_output``), or ``"in_flight"`` -> ``"aborted"``
(``abort``) -> ``"drained"`` (``acknowledge_drained``). A ``begin`` that cannot
proceed returns None and leaves a ``"rejected"`` tombstone under the key it
consumed. Aborted transfers keep their source and destination pages pinned
until the drain acknowledgement, because a timeout or cancellation does not
prove that the transport stopped touching them.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any, NoReturn

try:
    from .paged_kv import PagedKV
except ImportError:  # run as a script, or imported from inside reference/
    from paged_kv import PagedKV

__all__ = [
    "ABORT_REASONS",
    "PagedKV",
    "RecomputeRequest",
    "TransferManager",
    "TransferNotReady",
    "TransferRecord",
    "demo",
    "main",
]

ABORT_REASONS = ("cancelled", "timeout", "producer_failure", "consumer_failure")


class RecomputeRequest:
    """One request whose KV can be dropped on preemption and rebuilt by replay.

    ``events`` is a list of dicts. Every emitted output appends exactly one
    ``{"event": "emit", "index": i, "token": t}`` with ``i`` counting up from 0;
    replay, failures, preemption and cancellation append other kinds and never
    an emission.
    """

    def __init__(self, pool: PagedKV, owner: str, prompt: Sequence[int]) -> None:
        """Queue a request; nothing is allocated until ``resume()``. The prompt must be non-empty."""
        if not prompt:
            raise ValueError("prompt must hold at least one token")
        self.pool = pool
        self.owner = owner
        self.prompt: tuple[int, ...] = tuple(prompt)
        self.outputs: list[int] = []
        self.recomputed_rows = 0
        self.state = "queued"
        self.events: list[dict[str, Any]] = []

    def resume(self) -> bool:
        """Make the request active; return whether it is active afterwards.

        From queued or preempted, allocate ``prompt + outputs[:-1]`` atomically:
        on failure nothing is allocated, the state is unchanged and False is
        returned. A successful replay after preemption adds its rows to
        ``recomputed_rows``; the first prefill does not. Active requests return
        True unchanged; cancelled ones return False.
        """
        if self.state in ("active", "cancelled"):
            return self.state == "active"
        rows = self.committed_rows()
        self.pool.create(self.owner)
        if not self.pool.append(self.owner, rows):
            self.pool.release(self.owner)
            self.events.append({"event": "resume_failed", "rows": len(rows)})
            return False
        replay = self.state == "preempted"
        if replay:
            self.recomputed_rows += len(rows)
        self.state = "active"
        self.events.append({"event": "resume", "rows": len(rows), "replay": replay})
        return True

    def sample(self, token: int) -> bool:
        """Commit the pending output's KV row, then record ``token`` as the next output.

        ``token`` stands for a model result; nothing is evaluated. If the commit
        cannot allocate, nothing changes and False is returned. Raises
        RuntimeError unless the request is active.
        """
        if self.state != "active":
            raise RuntimeError(f"cannot sample request {self.owner!r} while {self.state}")
        if self.outputs and not self.pool.append(self.owner, [self.outputs[-1]]):
            self.events.append({"event": "decode_failed", "token": token})
            return False
        self.events.append({"event": "emit", "index": len(self.outputs), "token": token})
        self.outputs.append(token)
        return True

    def preempt(self) -> bool:
        """Release the page table of an active request, keeping its history; return whether it was active."""
        if self.state != "active":
            return False
        self.pool.release(self.owner)
        self.state = "preempted"
        self.events.append({"event": "preempt", "outputs": len(self.outputs)})
        return True

    def cancel(self) -> None:
        """Release any pages and make the request cancelled for good; repeated calls do nothing."""
        if self.state == "cancelled":
            return
        if self.state == "active":
            self.pool.release(self.owner)
        self.state = "cancelled"
        self.events.append({"event": "cancel"})

    def committed_rows(self) -> list[int]:
        """The input rows whose KV exists while active: the prompt and all outputs but the newest."""
        return [*self.prompt, *self.outputs[:-1]]

    def check(self) -> None:
        """Verify the request's histories against each other and the pool."""
        if self.state == "active":
            rows = self.pool.read(self.owner)
            assert rows == self.committed_rows(), (
                f"request {self.owner!r}: page table reads {rows}, "
                f"expected prompt + outputs[:-1] = {self.committed_rows()}"
            )
        else:
            assert self.owner not in self.pool, (
                f"request {self.owner!r} is {self.state} but still owns pages"
            )
        emitted = [(e["index"], e["token"]) for e in self.events if e["event"] == "emit"]
        assert emitted == list(enumerate(self.outputs)), (
            f"request {self.owner!r}: emissions {emitted} do not match outputs {self.outputs}"
        )


class TransferNotReady(RuntimeError):
    """``TransferManager.read`` was called for a transfer that is not published."""


@dataclass
class TransferRecord:
    """The public state of one transfer attempt; kept after it ends as a tombstone."""

    key: int
    source: str
    room: str
    state: str
    snapshot: tuple[int, ...] = ()
    reason: str | None = None


@dataclass
class _Handles:
    destination: str
    source_pin: int
    destination_pin: int | None


_LIVE = ("in_flight", "ready", "aborted")


class TransferManager:
    """Moves KV rows between owners of one pool, keeping storage until it is provably unused.

    Keys are monotonically increasing ints; every ``begin`` call past argument
    validation consumes one, including calls that fail. Callbacks carry keys,
    never room names, so a stale key cannot touch a newer attempt. Destination
    owners are named ``"<prefix>:<key>"``; the manager owns that namespace.
    """

    def __init__(self, pool: PagedKV, prefix: str = "transfer") -> None:
        """Manage transfers on ``pool``; ``prefix`` names the private destination owners."""
        self.pool = pool
        self.prefix = prefix
        self.records: dict[int, TransferRecord] = {}
        self.rooms: dict[str, int] = {}
        self._handles: dict[int, _Handles] = {}
        self._last_key = 0

    def begin(self, source: str, room: str) -> int | None:
        """Snapshot ``source``, pin it, and reserve a pinned private destination.

        Returns the new key, or None when the room already has a live transfer
        (``reason="room_busy"``) or the destination pages cannot be reserved
        (``reason="no_pages"``); a failed reservation rolls back the source pin
        and every page it allocated. An unknown source raises KeyError and
        consumes no key.
        """
        snapshot = tuple(self.pool.read(source))
        self._last_key += 1
        key = self._last_key
        record = TransferRecord(key, source, room, "rejected", snapshot)
        self.records[key] = record
        if room in self.rooms:
            record.reason = "room_busy"
            return None
        source_pin = self.pool.pin(source)
        destination = f"{self.prefix}:{key}"
        self.pool.create(destination)
        if not self.pool.append(destination, snapshot):
            self.pool.release(destination)
            self.pool.unpin(source_pin)
            record.reason = "no_pages"
            return None
        self._handles[key] = _Handles(destination, source_pin, self.pool.pin(destination))
        record.state = "in_flight"
        self.rooms[room] = key
        return key

    def complete(self, key: int) -> bool:
        """Publish an in-flight transfer and drop its pins; False (no effect) for any other key."""
        if not self._in_state(key, "in_flight"):
            return False
        handles = self._handles[key]
        self._unpin_all(handles)
        self.records[key].state = "ready"
        return True

    def abort(self, key: int, reason: str) -> bool:
        """Stop an in-flight transfer for ``reason`` (one of ABORT_REASONS).

        The destination owner is dropped but both pins stay until
        ``acknowledge_drained``. Returns False, changing nothing, when the key
        is unknown or not in flight (for example already published). An
        unknown reason raises ValueError.
        """
        if reason not in ABORT_REASONS:
            raise ValueError(f"unknown abort reason {reason!r}; expected one of {ABORT_REASONS}")
        if not self._in_state(key, "in_flight"):
            return False
        self.pool.release(self._handles[key].destination)
        record = self.records[key]
        record.state = "aborted"
        record.reason = reason
        return True

    def acknowledge_drained(self, key: int) -> bool:
        """Free an aborted transfer's pinned pages and its room; False (no effect) for any other key."""
        if not self._in_state(key, "aborted"):
            return False
        self._unpin_all(self._handles.pop(key))
        self._end(key, "drained")
        return True

    def release_output(self, key: int) -> bool:
        """Drop a published destination and free its room; False (no effect) for any other key."""
        if not self._in_state(key, "ready"):
            return False
        self.pool.release(self._handles.pop(key).destination)
        self._end(key, "released")
        return True

    def read(self, key: int) -> list[int]:
        """Return a published transfer's rows; raise TransferNotReady before publication or after release."""
        record = self.records.get(key)
        if record is None or record.state != "ready":
            state = "unknown" if record is None else record.state
            raise TransferNotReady(f"transfer {key!r} is {state}, not ready")
        return self.pool.read(self._handles[key].destination)

    def check(self) -> None:
        """Verify the pool, every record, the room table and the published/frozen rows."""
        self.pool.check()
        live = {r.room: k for k, r in self.records.items() if r.state in _LIVE}
        assert self.rooms == live, f"room table {self.rooms} but live transfers {live}"
        assert set(self._handles) == set(live.values()), (
            f"handles held for {sorted(self._handles)} but live transfers are {sorted(live.values())}"
        )
        for key, record in self.records.items():
            handles = self._handles.get(key)
            if handles is None:
                assert f"{self.prefix}:{key}" not in self.pool, (
                    f"transfer {key} is {record.state} but its destination still owns pages"
                )
                continue
            expected = list(record.snapshot)
            pinned = record.state != "ready"
            views = {"destination": self._destination_rows(record.state, handles)}
            if pinned:
                views["source pin"] = self.pool.read_pin(handles.source_pin)
            for name, rows in views.items():
                assert rows == expected, (
                    f"transfer {key} ({record.state}): {name} reads {rows}, snapshot {expected}"
                )
            assert (handles.destination_pin is not None) == pinned, (
                f"transfer {key} ({record.state}) has destination pin {handles.destination_pin}"
            )

    def _destination_rows(self, state: str, handles: _Handles) -> list[int]:
        if state == "aborted":  # the owner is gone; only the pin still holds the pages
            assert handles.destination_pin is not None
            return self.pool.read_pin(handles.destination_pin)
        return self.pool.read(handles.destination)

    def _in_state(self, key: int, state: str) -> bool:
        record = self.records.get(key)
        return record is not None and record.state == state

    def _unpin_all(self, handles: _Handles) -> None:
        self.pool.unpin(handles.source_pin)
        if handles.destination_pin is not None:
            self.pool.unpin(handles.destination_pin)
            handles.destination_pin = None

    def _end(self, key: int, state: str) -> None:
        record = self.records[key]
        record.state = state
        del self.rooms[record.room]


def demo() -> dict[str, Any]:
    """Run the built-in lifecycle and return its deterministic JSON-ready report.

    A request is preempted while a transfer of its first rows is in flight; the
    transfer aborts, the replay succeeds beside four retained pages, and a second
    transfer of the longer history is published, read and released.
    """
    pool = PagedKV(capacity=8, block_size=2)
    request = RecomputeRequest(pool, "r", [10, 11, 12])
    manager = TransferManager(pool)
    trace: list[dict[str, Any]] = []

    def step(op: str, result: Any) -> Any:
        trace.append({"step": len(trace) + 1, "op": op, "result": result, "free_pages": len(pool.free)})
        return result

    step("request.resume()", request.resume())
    step("request.sample(20)", request.sample(20))
    step("request.sample(21)", request.sample(21))
    first = step("manager.begin('r', 'room-a')", manager.begin("r", "room-a"))
    step("request.preempt()", request.preempt())
    step(f"manager.abort({first}, 'cancelled')", manager.abort(first, "cancelled"))
    retained = pool.capacity - len(pool.free)
    step("request.resume()", request.resume())
    step(f"manager.complete({first})", manager.complete(first))
    step(f"manager.acknowledge_drained({first})", manager.acknowledge_drained(first))
    step("request.sample(22)", request.sample(22))
    second = step("manager.begin('r', 'room-a')", manager.begin("r", "room-a"))
    step(f"manager.complete({second})", manager.complete(second))
    received = step(f"manager.read({second})", manager.read(second))
    step(f"manager.release_output({second})", manager.release_output(second))
    step("request.cancel()", request.cancel())
    request.check()
    manager.check()
    return {
        "schema_version": 1,
        "config": {"capacity": pool.capacity, "block_size": pool.block_size, "prompt": list(request.prompt)},
        "trace": trace,
        "request_events": request.events,
        "transfers": {
            str(key): {**asdict(record), "snapshot": list(record.snapshot)} for key, record in manager.records.items()
        },
        "summary": {
            "outputs": request.outputs,
            "received_rows": received,
            "recomputed_rows": request.recomputed_rows,
            "pages_retained_before_first_drain": retained,
            "free_pages_at_end": len(pool.free),
        },
    }


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
    """Command-line entry point: print the demo report, or write it atomically with ``--output``."""
    parser = _Parser(description="Deterministic preemption/recompute and KV-transfer lifecycle report.")
    parser.add_argument("--output", metavar="PATH", help="write the JSON report here instead of stdout")
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
