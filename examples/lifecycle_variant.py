"""A correct lifecycle implementation that makes the other choice on every freedom the contract leaves.

Written independently of the reference, against the published lifecycle API
(``PagedKV``, ``RecomputeRequest``, ``TransferManager``).  Where the reference
takes the lowest free page, this pool hands out the highest first and reuses
freed pages first-in first-out; transfer keys are integers, its destination
owners and pins are named ``xfer-<key>...``; emit indices count from 1; the
source pin is held until ``release_output()`` rather than dropped at
``complete()``; ``begin()`` reserves the destination's pages empty, as the course
text has it ("reserves private destination pages"), and ``complete()`` copies
the snapshot's rows into them, where the reference writes placeholder rows; calls in the wrong state return False instead of raising
ValueError (where the published text allows either), and ``read`` of an
unknown key raises ValueError rather than KeyError.  It also records an
extension event (``x-sample_blocked``).  The kit's tests hold it to every
lifecycle clause, exactly like the reference::

    pytest --cbatch-impl=pytest_cbatch.examples.lifecycle_variant -k test_lifecycle
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["PagedKV", "RecomputeRequest", "TransferManager"]

REASONS = frozenset({"cancel", "timeout", "producer_failure", "consumer_failure"})


@dataclass
class Page:
    owners: set[Any] = field(default_factory=set)
    pins: set[Any] = field(default_factory=set)
    tokens: list[int] = field(default_factory=list)


class PagedKV:
    """Pages handed out highest id first, freed pages reused in FIFO order."""

    def __init__(self, capacity: int, block_size: int) -> None:
        if type(capacity) is not int or type(block_size) is not int or capacity < 1 or block_size < 1:
            raise ValueError("capacity and block_size must be positive ints")
        self.capacity, self.block_size = capacity, block_size
        self.free: deque[int] = deque(range(capacity - 1, -1, -1))
        self.pages: dict[int, Page] = {}
        self.tables: dict[Any, list[int]] = {}
        self.transfers: dict[Any, tuple[int, ...]] = {}

    def create(self, owner: Any) -> None:
        if owner in self.tables:
            raise ValueError("owner exists")
        self.tables[owner] = []

    def fork(self, source: Any, target: Any) -> None:
        if target in self.tables:
            raise ValueError("target exists")
        shared = list(self.tables[source])
        self.tables[target] = shared
        for page in shared:
            self.pages[page].owners.add(target)

    def read(self, owner: Any) -> list[int]:
        rows: list[int] = []
        for page in self.tables[owner]:
            rows += self.pages[page].tokens
        return rows

    def append(self, owner: Any, token: int) -> None:
        table = self.tables[owner]
        tail = self.pages[table[-1]] if table else None
        if tail is not None and len(tail.tokens) < self.block_size and len(tail.owners) == 1 and not tail.pins:
            tail.tokens.append(token)
            return
        if not self.free:
            raise MemoryError("pool exhausted")
        page = self.free.popleft()
        if tail is not None and len(tail.tokens) < self.block_size:  # a shared or pinned partial tail: copy it
            self.pages[page] = Page({owner}, set(), [*tail.tokens, token])
            tail.owners.remove(owner)
            table[-1] = page
        else:
            self.pages[page] = Page({owner}, set(), [token])
            table.append(page)

    def pin(self, owner: Any, name: Any) -> tuple[int, ...]:
        if name in self.transfers:
            raise ValueError("pin exists")
        held = tuple(self.tables[owner])
        for page in held:
            self.pages[page].pins.add(name)
        self.transfers[name] = held
        return held

    def unpin(self, name: Any) -> None:
        for page in self.transfers.pop(name):
            self.pages[page].pins.remove(name)
            self._maybe_free(page)

    def release(self, owner: Any) -> None:
        for page in self.tables.pop(owner):
            self.pages[page].owners.remove(owner)
            self._maybe_free(page)

    def check(self) -> None:
        assert len(self.free) + len(self.pages) == self.capacity
        assert not set(self.free) & set(self.pages)
        for page_id, page in self.pages.items():
            assert page.owners == {o for o, t in self.tables.items() if page_id in t}
            assert page.pins == {n for n, held in self.transfers.items() if page_id in held}
            assert page.owners or page.pins

    def reserve(self, owner: Any, pages: int) -> None:
        """Give the new ``owner`` ``pages`` empty pages (a transfer's private destination); MemoryError, changing
        nothing, when too few are free."""
        if owner in self.tables:
            raise ValueError("owner exists")
        if pages > len(self.free):
            raise MemoryError("pool exhausted")
        self.tables[owner] = [self.free.popleft() for _ in range(pages)]
        for page in self.tables[owner]:
            self.pages[page] = Page({owner})

    def _maybe_free(self, page: int) -> None:
        if not self.pages[page].owners and not self.pages[page].pins:
            del self.pages[page]
            self.free.append(page)


class RecomputeRequest:
    """Emit indices from 1; resume/sample/preempt in the wrong state return False."""

    def __init__(self, pool: PagedKV, owner: Any, prompt: Sequence[int]) -> None:
        tokens = tuple(prompt) if isinstance(prompt, (list, tuple)) else ()
        if not owner or not tokens or not all(type(t) is int for t in tokens) or owner in pool.tables:
            raise ValueError("bad request")
        self.pool, self.owner, self.prompt = pool, owner, tokens
        self.outputs: list[int] = []
        self.state = "queued"
        self.recomputed_rows = 0
        self.events: list[dict[str, Any]] = []

    @property
    def committed(self) -> tuple[int, ...]:
        return self.prompt + tuple(self.outputs[:-1])

    def resume(self) -> bool:
        if self.state not in ("queued", "preempted") or self.owner in self.pool.tables:
            return False
        rows = self.committed
        if -(-len(rows) // self.pool.block_size) > len(self.pool.free):  # decide before touching the pool
            self.events.append({"event": "resume_blocked", "rows": len(rows)})
            return False
        self.pool.create(self.owner)
        for token in rows:
            self.pool.append(self.owner, token)
        replay = len(rows) if self.state == "preempted" else 0
        self.recomputed_rows += replay
        self.state = "active"
        self.events.append({"event": "resumed", "recomputed_rows": replay})
        return True

    def sample(self, token: int) -> bool | None:
        if self.state != "active":
            return False
        if type(token) is not int:
            raise ValueError("token must be an int")
        if self.outputs:
            try:
                self.pool.append(self.owner, self.outputs[-1])
            except MemoryError:
                self.events.append({"event": "x-sample_blocked"})
                raise
        self.outputs.append(token)
        self.events.append({"event": "emit", "index": len(self.outputs), "token": token})
        return None

    def preempt(self) -> bool | None:
        if self.state != "active":
            return False
        self.pool.release(self.owner)
        self.state = "preempted"
        self.events.append({"event": "preempted", "retained_tokens": len(self.committed)})
        return None

    def cancel(self) -> None:
        if self.state != "cancelled":
            if self.state == "active":
                self.pool.release(self.owner)
            self.state = "cancelled"
            self.events.append({"event": "cancelled"})

    def check(self) -> None:
        if self.state == "active":
            assert self.pool.read(self.owner) == list(self.committed)
        assert [e["token"] for e in self.events if e["event"] == "emit"] == self.outputs


@dataclass
class Record:
    key: int
    room: str
    owner: str
    source_pin: str
    destination_pin: str
    snapshot: tuple[int, ...]
    destination_pages: tuple[int, ...]
    state: str = "in_flight"
    reason: str | None = None


class TransferManager:
    """Integer keys; the source pin is dropped at release_output(); a busy room returns False."""

    def __init__(self, pool: PagedKV) -> None:
        self.pool = pool
        self.generation = 0
        self.records: dict[int, Record] = {}
        self.rooms: dict[str, int] = {}
        self.events: list[dict[str, Any]] = []

    def begin(self, source: Any, room: str) -> int | bool:
        if not isinstance(room, str) or not room.strip():
            raise ValueError("blank room")
        if room in self.rooms:
            return False
        if source not in self.pool.tables:
            raise ValueError("unknown source")
        snapshot = tuple(self.pool.read(source))
        if not snapshot:
            raise ValueError("empty source")
        self.generation += 1
        key = self.generation
        owner, source_pin, destination_pin = f"xfer-{key}", f"xfer-{key}-src", f"xfer-{key}-dst"
        self.pool.reserve(owner, -(-len(snapshot) // self.pool.block_size))
        self.pool.pin(source, source_pin)
        pages = self.pool.pin(owner, destination_pin)
        self.records[key] = Record(key, room, owner, source_pin, destination_pin, snapshot, pages)
        self.rooms[room] = key
        self.events.append({"event": "begin", "key": key})
        return key

    def _in(self, key: Any, state: str) -> Record | None:
        record = self.records.get(key) if isinstance(key, int) else None
        return record if record is not None and record.state == state else None

    def complete(self, key: Any) -> bool:
        record = self._in(key, "in_flight")
        if record is None:
            return False
        size = self.pool.block_size
        for offset, page in enumerate(record.destination_pages):
            self.pool.pages[page].tokens[:] = record.snapshot[offset * size : (offset + 1) * size]
        self.pool.unpin(record.destination_pin)
        record.state = "ready"
        return True

    def abort(self, key: Any, reason: str = "cancel") -> bool:
        if reason not in REASONS:
            raise ValueError("bad reason")
        record = self._in(key, "in_flight")
        if record is None:
            return False
        self.pool.release(record.owner)
        record.state, record.reason = "draining", reason
        return True

    def acknowledge_drained(self, key: Any) -> bool:
        record = self._in(key, "draining")
        if record is None:
            return False
        self.pool.unpin(record.source_pin)
        self.pool.unpin(record.destination_pin)
        record.state = "drained"
        del self.rooms[record.room]
        return True

    def release_output(self, key: Any) -> bool:
        record = self._in(key, "ready")
        if record is None:
            return False
        self.pool.release(record.owner)
        self.pool.unpin(record.source_pin)
        record.state = "released"
        del self.rooms[record.room]
        return True

    def read(self, key: Any) -> list[int]:
        record = self._in(key, "ready")
        if record is None:
            raise ValueError("not published")
        return self.pool.read(record.owner)

    def check(self) -> None:
        self.pool.check()
        live = ("in_flight", "draining", "ready")
        assert self.rooms == {r.room: k for k, r in self.records.items() if r.state in live}
