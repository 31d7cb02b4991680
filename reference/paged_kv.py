"""Paged KV allocator that stores token values per row (standard library only).

The pool has ``capacity`` pages of ``block_size`` rows. Each owner (a string)
has a logical page table; reading it returns the owner's token rows in order.
Pages are reference-counted so that ``fork`` shares every page of one owner,
including a partially filled tail, with another owner. ``pin`` freezes the
current view of an owner: pinned pages stay allocated after every owner has
released them, until the pin is removed.

Contracts:

* ``append`` is failure-atomic. It either allocates every page it needs and
  writes every row, or changes nothing and returns False.
* Only an unshared, unpinned tail page is written in place. Appending into a
  partial tail that is shared (refcount > 1) or pinned first copies the tail
  into a fresh private page (synchronous copy-on-write), so no other owner's
  rows and no pinned view ever change. The copy needs a free page of its own.
* A page is free exactly when no table references it and no pin holds it.
  Freed pages join the back of a FIFO free list, which starts as
  ``0..capacity-1``, so every run with the same operations is reproducible.

Invalid arguments raise ValueError (bad values, duplicate owners) or KeyError
(unknown owner or pin id). ``check()`` verifies every internal invariant.
"""

from __future__ import annotations

import json
from collections import Counter, deque
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["PagedKV"]


def _positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return value


@dataclass(frozen=True)
class _Pin:
    pages: tuple[int, ...]
    length: int


class PagedKV:
    """A fixed pool of refcounted pages holding token rows for named owners."""

    def __init__(self, capacity: int, block_size: int) -> None:
        """Create a pool of ``capacity`` empty pages of ``block_size`` rows each."""
        self.capacity = _positive_int("capacity", capacity)
        self.block_size = _positive_int("block_size", block_size)
        self._free: deque[int] = deque(range(capacity))
        self._rows: list[list[int]] = [[] for _ in range(capacity)]
        self._refs = [0] * capacity
        self._pin_counts = [0] * capacity
        self._tables: dict[str, list[int]] = {}
        self._pins: dict[int, _Pin] = {}
        self._next_pin_id = 1

    @property
    def free(self) -> tuple[int, ...]:
        """Free page ids in allocation order (a snapshot; mutate the pool through its methods)."""
        return tuple(self._free)

    def __contains__(self, owner: object) -> bool:
        return owner in self._tables

    def __repr__(self) -> str:
        return (
            f"PagedKV(capacity={self.capacity}, block_size={self.block_size}, "
            f"free={len(self._free)}, owners={len(self._tables)}, pins={len(self._pins)})"
        )

    # ----------------------------------------------------------------- owners

    def create(self, owner: str) -> None:
        """Register ``owner`` with an empty page table; a live duplicate raises ValueError."""
        if not isinstance(owner, str):
            raise ValueError(f"owner must be a str, got {owner!r}")
        if owner in self._tables:
            raise ValueError(f"owner {owner!r} already exists")
        self._tables[owner] = []

    def release(self, owner: str) -> None:
        """Drop ``owner`` and its page references; unreferenced, unpinned pages become free."""
        for page in self._tables.pop(self._known(owner)):
            self._refs[page] -= 1
            self._free_if_unused(page)

    def fork(self, src: str, dst: str) -> None:
        """Create ``dst`` sharing every page of ``src``, partial tail included; allocates nothing."""
        table = self._tables[self._known(src)]
        self.create(dst)
        self._tables[dst] = list(table)
        for page in table:
            self._refs[page] += 1

    def read(self, owner: str) -> list[int]:
        """Return the owner's logical token rows."""
        return self._concat(self._tables[self._known(owner)])

    def append(self, owner: str, tokens: Iterable[int]) -> bool:
        """Append token rows to ``owner``; return False and change nothing if pages run out."""
        table = self._tables[self._known(owner)]
        rows = list(tokens)
        for token in rows:
            if isinstance(token, bool) or not isinstance(token, int):
                raise ValueError(f"tokens must be ints, got {token!r}")
        if not rows:
            return True
        tail = table[-1] if table else None
        space = self.block_size - len(self._rows[tail]) if tail is not None else 0
        copy_tail = space > 0 and (self._refs[tail] > 1 or self._pin_counts[tail] > 0)
        overflow = max(0, len(rows) - space)
        needed = -(-overflow // self.block_size) + int(copy_tail)
        if needed > len(self._free):
            return False
        if copy_tail:
            copy = self._allocate(list(self._rows[tail]))
            table[-1] = copy
            self._refs[tail] -= 1  # still shared or pinned, so never freed here
            tail = copy
        if space:
            self._rows[tail].extend(rows[:space])
        for start in range(min(space, len(rows)), len(rows), self.block_size):
            table.append(self._allocate(rows[start : start + self.block_size]))
        return True

    # ------------------------------------------------------------------- pins

    def pin(self, owner: str) -> int:
        """Pin the owner's current pages and freeze that view; return a new pin id."""
        table = self._tables[self._known(owner)]
        pin_id = self._next_pin_id
        self._next_pin_id += 1
        length = sum(len(self._rows[page]) for page in table)
        self._pins[pin_id] = _Pin(tuple(table), length)
        for page in table:
            self._pin_counts[page] += 1
        return pin_id

    def unpin(self, pin_id: int) -> None:
        """Remove a pin; pages that no table references become free."""
        for page in self._pins.pop(self._known_pin(pin_id)).pages:
            self._pin_counts[page] -= 1
            self._free_if_unused(page)

    def read_pin(self, pin_id: int) -> list[int]:
        """Return the token rows frozen by a pin."""
        return self._concat(self._pins[self._known_pin(pin_id)].pages)

    # -------------------------------------------------------------- invariants

    def check(self) -> None:
        """Verify every allocator invariant; raise AssertionError naming the first violation."""
        capacity = self.capacity
        free = list(self._free)
        doubled = sorted(page for page, count in Counter(free).items() if count > 1)
        assert not doubled, f"free list holds pages {doubled} more than once"
        outside = sorted(page for page in free if not 0 <= page < capacity)
        assert not outside, f"free list holds ids {outside} outside 0..{capacity - 1}"
        refs: Counter[int] = Counter()
        for owner, table in self._tables.items():
            repeated = sorted(page for page, count in Counter(table).items() if count > 1)
            assert not repeated, f"owner {owner!r} references pages {repeated} twice"
            refs.update(table)
            self._check_fill(f"owner {owner!r}", table)
        pins: Counter[int] = Counter()
        for pin_id, pin in self._pins.items():
            pins.update(pin.pages)
            self._check_fill(f"pin {pin_id}", list(pin.pages))
            held = sum(len(self._rows[page]) for page in pin.pages)
            assert held == pin.length, (
                f"pin {pin_id} froze {pin.length} rows but its pages hold {held}"
            )
        free_set = set(free)
        for page in range(capacity):
            assert self._refs[page] == refs[page], (
                f"page {page}: refcount {self._refs[page]} but {refs[page]} table references"
            )
            assert self._pin_counts[page] == pins[page], (
                f"page {page}: pin count {self._pin_counts[page]} but {pins[page]} pins hold it"
            )
            used = refs[page] > 0 or pins[page] > 0
            assert used != (page in free_set), (
                f"page {page} is {'both used and free' if used else 'neither used nor free'}"
            )
            if not used:
                assert not self._rows[page], f"free page {page} still holds rows {self._rows[page]}"

    # ---------------------------------------------------------------- helpers

    def _check_fill(self, label: str, pages: list[int]) -> None:
        for index, page in enumerate(pages):
            fill = len(self._rows[page])
            if index < len(pages) - 1:
                assert fill == self.block_size, (
                    f"{label}: non-tail page {page} holds {fill} of {self.block_size} rows"
                )
            else:
                assert 1 <= fill <= self.block_size, (
                    f"{label}: tail page {page} holds {fill} rows, outside 1..{self.block_size}"
                )

    def _known(self, owner: str) -> str:
        if owner not in self._tables:
            raise KeyError(f"unknown owner {owner!r}")
        return owner

    def _known_pin(self, pin_id: int) -> int:
        if pin_id not in self._pins:
            raise KeyError(f"unknown pin id {pin_id!r}")
        return pin_id

    def _allocate(self, rows: list[int]) -> int:
        page = self._free.popleft()
        self._rows[page] = rows
        self._refs[page] = 1
        return page

    def _free_if_unused(self, page: int) -> None:
        if self._refs[page] == 0 and self._pin_counts[page] == 0:
            self._rows[page] = []
            self._free.append(page)

    def _concat(self, pages: Iterable[int]) -> list[int]:
        return [token for page in pages for token in self._rows[page]]


def _demo() -> dict[str, object]:
    """Share a partial tail, pin it, and copy it on write; report what each view reads."""
    pool = PagedKV(capacity=4, block_size=2)
    pool.create("a")
    pool.append("a", [1, 2, 3])
    pool.fork("a", "b")
    pin_id = pool.pin("a")
    pool.append("b", [4])
    report = {
        "a": pool.read("a"),
        "b": pool.read("b"),
        "pin": pool.read_pin(pin_id),
        "free_pages": len(pool.free),
    }
    pool.release("a")
    pool.release("b")
    pool.unpin(pin_id)
    pool.check()
    report["free_pages_after_cleanup"] = len(pool.free)
    return report


if __name__ == "__main__":
    print(json.dumps(_demo()))
