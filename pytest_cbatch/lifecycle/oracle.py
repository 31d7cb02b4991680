"""An independent model of a paged KV pool, derived from the published contract alone.

It never imports or mirrors an implementation.  Pages are the oracle's own
ids; a page lives while a table lists it or a pin holds it, so the free count
is recomputed from the holders instead of refcounts.  Rows may be ``None``: a
placeholder for a row of a transfer destination before complete() publishes
it, where the contract leaves open what the page holds (placeholder rows, or
nothing yet); the page counts, its rows are not compared.
"""

from __future__ import annotations

import itertools
from collections.abc import Hashable
from dataclasses import dataclass

__all__ = ["PoolOracle", "PoolState", "pages_for"]


def pages_for(rows: int, block_size: int) -> int:
    """Pages that ``rows`` fresh rows fill."""
    return -(-rows // block_size)


@dataclass(frozen=True)
class PoolState:
    """The oracle's pool at one moment, as a picture draws it: ``pages`` lists each live page's owners, pins
    (each sorted by ``repr``) and row count, in page order; ``tables`` each owner's page count.  Names the
    implementation chose (a transfer's destination owner and pins) are here only once the machine accepted
    them as plain data."""

    capacity: int
    pages: tuple[tuple[tuple[Hashable, ...], tuple[Hashable, ...], int], ...]
    tables: tuple[tuple[Hashable, int], ...]

    def free(self) -> int:
        return self.capacity - len(self.pages)


class PoolOracle:
    """Owners, pins and page contents of a pool of ``capacity`` pages of ``block_size`` rows."""

    def __init__(self, capacity: int, block_size: int) -> None:
        self.capacity = capacity
        self.block_size = block_size
        self.tables: dict[Hashable, list[int]] = {}
        self.pins: dict[Hashable, tuple[int, ...]] = {}
        self.rows: dict[int, list[int | None]] = {}  # live pages only
        self._mint = itertools.count()

    def free(self) -> int:
        return self.capacity - len(self.rows)

    def history(self, owner: Hashable) -> list[int | None]:
        return [row for page in self.tables[owner] for row in self.rows[page]]

    def pinned_rows(self, name: Hashable) -> list[int | None]:
        return [row for page in self.pins[name] for row in self.rows[page]]

    def owners_of(self, page: int) -> set[Hashable]:
        return {owner for owner, table in self.tables.items() if page in table}

    def pins_of(self, page: int) -> set[Hashable]:
        return {name for name, pages in self.pins.items() if page in pages}

    def has_placeholders(self, owner: Hashable) -> bool:
        return any(row is None for row in self.history(owner))

    def copy(self) -> PoolOracle:
        """A copy to read (a snapshot): later operations on this pool leave it as it was."""
        out = PoolOracle(self.capacity, self.block_size)
        out.tables = {owner: list(table) for owner, table in self.tables.items()}
        out.pins = dict(self.pins)
        out.rows = {page: list(rows) for page, rows in self.rows.items()}
        return out

    def state(self) -> PoolState:
        """The pool as it is now (``PoolState``)."""
        pages = tuple((tuple(sorted(self.owners_of(page), key=repr)), tuple(sorted(self.pins_of(page), key=repr)),
                       len(rows)) for page, rows in sorted(self.rows.items()))
        return PoolState(self.capacity, pages, tuple((owner, len(table)) for owner, table in self.tables.items()))

    # ------------------------------------------------------------ operations

    def create(self, owner: Hashable) -> None:
        self.tables[owner] = []

    def release(self, owner: Hashable) -> None:
        self._collect(self.tables.pop(owner))

    def fork(self, source: Hashable, target: Hashable) -> None:
        self.tables[target] = list(self.tables[source])

    def pin(self, owner: Hashable, name: Hashable) -> None:
        self.pins[name] = tuple(self.tables[owner])

    def unpin(self, name: Hashable) -> None:
        self._collect(self.pins.pop(name))

    def needs_page(self, owner: Hashable) -> bool:
        """Whether appending to ``owner`` takes a page: no tail, a full tail, or a tail someone else sees."""
        table = self.tables[owner]
        if not table or len(self.rows[table[-1]]) == self.block_size:
            return True
        return self._shared(table[-1])

    def copies_tail(self, owner: Hashable) -> bool:
        """Whether appending to ``owner`` copies a shared or pinned partial tail first."""
        table = self.tables[owner]
        return bool(table) and len(self.rows[table[-1]]) < self.block_size and self._shared(table[-1])

    def append(self, owner: Hashable, row: int | None) -> bool:
        """Write one row; False and no change when it needs a page and none is free."""
        if self.needs_page(owner) and not self.free():
            return False
        table = self.tables[owner]
        if table and len(self.rows[table[-1]]) < self.block_size:
            if self._shared(table[-1]):
                copy = next(self._mint)
                self.rows[copy] = list(self.rows[table[-1]])
                table[-1] = copy
            self.rows[table[-1]].append(row)
        else:
            page = next(self._mint)
            self.rows[page] = [row]
            table.append(page)
        return True

    def publish(self, owner: Hashable, rows: list[int]) -> None:
        """Overwrite the owner's placeholder rows, in order, with ``rows``."""
        offset = 0
        for page in self.tables[owner]:
            count = len(self.rows[page])
            self.rows[page] = list(rows[offset : offset + count])
            offset += count

    def _shared(self, page: int) -> bool:
        holders = sum(page in table for table in self.tables.values())
        return holders > 1 or any(page in pages for pages in self.pins.values())

    def _collect(self, pages: list[int] | tuple[int, ...]) -> None:
        for page in set(pages):
            if not self.owners_of(page) and not self.pins_of(page):
                del self.rows[page]
