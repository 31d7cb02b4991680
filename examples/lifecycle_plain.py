"""A second correct lifecycle implementation: plain data everywhere the published text shows no form.

Written independently of the reference and of ``lifecycle_variant``, against
the published lifecycle API (``PagedKV``, ``RecomputeRequest``,
``TransferManager``).  It makes the other choice on the freedoms the first
variant leaves as the reference has them: pages and transfer records are plain
dicts (``pool.pages[id]["tokens"]``, ``manager.records[key]["state"]``);
``pool.free`` is a set; ``release()`` returns the page ids it freed, and of an
unknown owner does nothing and returns ``[]``; transfer keys are tuples and the
destination owners and pins carry names of its own; terminal records are
dropped rather than kept as tombstones; a busy room makes ``begin()`` return
None; every request event carries extra fields (``owner``, ``seq``) and
``preempted{retained_tokens}`` counts prompt and every output, the pending
sample included.  The kit's tests hold it to every lifecycle clause::

    pytest --cbatch-impl=pytest_cbatch.examples.lifecycle_plain -k test_lifecycle
"""

from __future__ import annotations

import itertools
from collections.abc import Hashable, Sequence
from typing import Any

__all__ = ["PagedKV", "RecomputeRequest", "TransferManager"]

_REASONS = ("cancel", "timeout", "producer_failure", "consumer_failure")


class PagedKV:
    """Pages are dicts of owners, pins and tokens; the free pool is an unordered set."""

    def __init__(self, capacity: int, block_size: int) -> None:
        if not (isinstance(capacity, int) and isinstance(block_size, int) and capacity > 0 and block_size > 0):
            raise ValueError("capacity and block_size must be positive integers")
        self.capacity, self.block_size = capacity, block_size
        self.free: set[int] = set(range(capacity))
        self.pages: dict[int, dict[str, Any]] = {}
        self.tables: dict[Hashable, list[int]] = {}
        self.transfers: dict[Hashable, list[int]] = {}

    def _take(self, tokens: list[int], owner: Hashable) -> int:
        if not self.free:
            raise MemoryError("no free page")
        page = min(self.free)
        self.free.discard(page)
        self.pages[page] = {"owners": {owner}, "pins": set(), "tokens": tokens}
        return page

    def _drop(self, page: int) -> bool:
        entry = self.pages[page]
        if entry["owners"] or entry["pins"]:
            return False
        del self.pages[page]
        self.free.add(page)
        return True

    def create(self, owner: Hashable) -> None:
        if owner in self.tables:
            raise ValueError(f"{owner!r} already has a table")
        self.tables[owner] = []

    def read(self, owner: Hashable) -> list[int]:
        return [token for page in self.tables[owner] for token in self.pages[page]["tokens"]]

    def fork(self, source: Hashable, target: Hashable) -> None:
        pages = list(self.tables[source])
        if target in self.tables:
            raise ValueError(f"{target!r} already has a table")
        for page in pages:
            self.pages[page]["owners"].add(target)
        self.tables[target] = pages

    def append(self, owner: Hashable, token: int) -> None:
        table = self.tables[owner]
        if table and len(self.pages[table[-1]]["tokens"]) < self.block_size:
            tail = self.pages[table[-1]]
            if tail["owners"] == {owner} and not tail["pins"]:
                tail["tokens"].append(token)
                return
            copy = self._take([*tail["tokens"], token], owner)  # shared or pinned: copy before writing
            tail["owners"].discard(owner)
            table[-1] = copy
            return
        table.append(self._take([token], owner))

    def pin(self, owner: Hashable, name: Hashable) -> list[int]:
        pages = list(self.tables[owner])
        if name in self.transfers:
            raise ValueError(f"pin {name!r} exists")
        for page in pages:
            self.pages[page]["pins"].add(name)
        self.transfers[name] = pages
        return list(pages)

    def unpin(self, name: Hashable) -> list[int]:
        pages = self.transfers.pop(name)
        for page in pages:
            self.pages[page]["pins"].discard(name)
        return [page for page in dict.fromkeys(pages) if self._drop(page)]

    def release(self, owner: Hashable) -> list[int]:
        """Drop the owner's table; return the pages that became free ([] for an unknown owner)."""
        if owner not in self.tables:
            return []
        pages = self.tables.pop(owner)
        for page in pages:
            self.pages[page]["owners"].discard(owner)
        return [page for page in dict.fromkeys(pages) if self._drop(page)]

    def check(self) -> None:
        assert not self.free & set(self.pages) and len(self.free) + len(self.pages) == self.capacity
        for page, entry in self.pages.items():
            assert entry["owners"] == {o for o, t in self.tables.items() if page in t}
            assert entry["pins"] == {n for n, held in self.transfers.items() if page in held}


class RecomputeRequest:
    """Events carry the owner and a sequence number besides the fields the contract names."""

    def __init__(self, pool: PagedKV, owner: Hashable, prompt: Sequence[int]) -> None:
        prompt = list(prompt) if isinstance(prompt, (list, tuple)) else []
        if owner in ("", None) or not prompt or any(not isinstance(t, int) or isinstance(t, bool) for t in prompt):
            raise ValueError("a request needs an owner name and a non-empty prompt of ints")
        if owner in pool.tables:
            raise ValueError(f"{owner!r} already has a table")
        self.pool, self.owner, self.prompt = pool, owner, prompt
        self.outputs: list[int] = []
        self.state = "queued"
        self.recomputed_rows = 0
        self.events: list[dict[str, Any]] = []
        self._seq = itertools.count()

    @property
    def committed(self) -> list[int]:
        return self.prompt + self.outputs[:-1]

    def _log(self, kind: str, **fields: Any) -> None:
        self.events.append({"event": kind, **fields, "owner": self.owner, "seq": next(self._seq)})

    def _only(self, *states: str) -> None:
        if self.state not in states:
            raise ValueError(f"request {self.owner!r} is {self.state}")

    def resume(self) -> bool:
        self._only("queued", "preempted")
        if self.owner in self.pool.tables:
            raise ValueError(f"{self.owner!r} is taken in the pool")
        rows = self.committed
        self.pool.create(self.owner)
        written = 0
        try:
            for written, token in enumerate(rows, start=1):
                self.pool.append(self.owner, token)
        except MemoryError:
            self.pool.release(self.owner)
            self._log("resume_blocked", rows=len(rows), written=written - 1)
            return False
        rebuilt = len(rows) if self.state == "preempted" else 0
        self.recomputed_rows += rebuilt
        self.state = "active"
        self._log("resumed", recomputed_rows=rebuilt)
        return True

    def sample(self, token: int) -> None:
        self._only("active")
        if not isinstance(token, int) or isinstance(token, bool):
            raise ValueError("a sampled token is an int")
        if self.outputs:
            self.pool.append(self.owner, self.outputs[-1])
        self.outputs.append(token)
        self._log("emit", index=len(self.outputs) - 1, token=token)

    def preempt(self) -> None:
        self._only("active")
        self.pool.release(self.owner)
        self.state = "preempted"
        self._log("preempted", retained_tokens=len(self.prompt) + len(self.outputs))

    def cancel(self) -> None:
        """Idempotent: only the first call releases, changes the state and records."""
        before, self.state = self.state, "cancelled"
        if before != "cancelled":
            if before == "active":
                self.pool.release(self.owner)
            self._log("cancelled")

    def check(self) -> None:
        self.pool.check()
        if self.state == "active":
            assert self.pool.read(self.owner) == self.committed


class TransferManager:
    """Records are dicts, dropped once the transfer ends; keys are ``("transfer", n)`` tuples."""

    def __init__(self, pool: PagedKV) -> None:
        self.pool = pool
        self.generation = 0
        self.records: dict[tuple[str, int], dict[str, Any]] = {}
        self.rooms: dict[str, tuple[str, int]] = {}

    def begin(self, source: Hashable, room: str) -> tuple[str, int] | None:
        if not isinstance(room, str) or not room.strip():
            raise ValueError("a room is a non-blank string")
        if room in self.rooms:
            return None
        snapshot = tuple(self.pool.read(source))
        if not snapshot:
            raise ValueError(f"source {source!r} is empty")
        self.generation += 1
        key = ("transfer", self.generation)
        destination, source_pin, destination_pin = ("dst", key), ("pin-src", key), ("pin-dst", key)
        self.pool.pin(source, source_pin)
        self.pool.create(destination)
        try:
            for _ in snapshot:
                self.pool.append(destination, 0)
        except MemoryError:
            self.pool.release(destination)
            self.pool.unpin(source_pin)
            raise
        self.pool.pin(destination, destination_pin)
        self.records[key] = {"room": room, "snapshot": snapshot, "reason": None, "state": "in_flight",
                             "destination": destination, "pins": (source_pin, destination_pin)}
        self.rooms[room] = key
        return key

    def _record(self, key: Any, state: str) -> dict[str, Any] | None:
        record = self.records.get(key)
        return record if record is not None and record["state"] == state else None

    def _end(self, key: tuple[str, int]) -> None:
        del self.rooms[self.records.pop(key)["room"]]

    def complete(self, key: Any) -> bool:
        record = self._record(key, "in_flight")
        if record is None:
            return False
        rows = list(record["snapshot"])
        for page in self.pool.tables[record["destination"]]:
            tokens = self.pool.pages[page]["tokens"]
            tokens[:], rows = rows[: len(tokens)], rows[len(tokens):]
        for pin in record["pins"]:
            self.pool.unpin(pin)
        record["state"] = "ready"
        return True

    def abort(self, key: Any, reason: str = "cancel") -> bool:
        if reason not in _REASONS:
            raise ValueError(f"unknown abort reason {reason!r}")
        record = self._record(key, "in_flight")
        if record is None:
            return False
        self.pool.release(record["destination"])
        record.update(state="draining", reason=reason)
        return True

    def acknowledge_drained(self, key: Any) -> bool:
        record = self._record(key, "draining")
        if record is None:
            return False
        for pin in record["pins"]:
            self.pool.unpin(pin)
        self._end(key)
        return True

    def release_output(self, key: Any) -> bool:
        record = self._record(key, "ready")
        if record is None:
            return False
        self.pool.release(record["destination"])
        self._end(key)
        return True

    def read(self, key: Any) -> list[int]:
        record = self.records.get(key)
        if record is None and self._issued(key):
            raise ValueError(f"transfer {key!r} has ended")
        if record is None:
            raise KeyError(key)
        if record["state"] != "ready":
            raise ValueError(f"transfer {key!r} is {record['state']}")
        return self.pool.read(record["destination"])

    def _issued(self, key: Any) -> bool:
        """Whether begin() returned ``key`` (records of ended transfers are not kept)."""
        return (isinstance(key, tuple) and len(key) == 2 and key[0] == "transfer" and isinstance(key[1], int)
                and 0 < key[1] <= self.generation)

    def check(self) -> None:
        self.pool.check()
        assert self.rooms == {record["room"]: key for key, record in self.records.items()}
