"""The snapshots' block tables as changes: what each snapshot changed, and each one's page census.

A large report's snapshots list millions of page ids, nearly all repeated
from the snapshot before; the pool clauses need only what changed and a few
counts, so the tables are read once, here, for all of them.  Nothing here
judges the report.
"""

from __future__ import annotations

from itertools import compress
from operator import ne
from typing import Any, Mapping, Sequence

__all__ = ["BlockTables"]


class BlockTables:
    """Facts about the block tables of the snapshots at ``snapshots`` (event indices, in order).

    ``changed[i]``: the ids whose table in snapshot ``i`` differs from their
    table in the snapshot before (or that it did not show), in table order.
    ``census[i]``: ``(pages listed, distinct pages, listings outside
    0..capacity-1)`` over all of snapshot ``i``'s tables.  ``oversized[i]``:
    how many of its tables list more pages than ``limits`` gives their id (none
    without ``limits``).
    ``last_holding[id]``: the last snapshot whose table for ``id`` holds a page.
    """

    def __init__(self, events: Sequence[dict[str, Any]], snapshots: Sequence[int], capacity: int,
                 limits: Mapping[str, int] | None = None):
        self.changed: dict[int, list[str]] = {}
        self.census: dict[int, tuple[int, int, int]] = {}
        self.oversized: dict[int, int] = {}
        self.last_holding: dict[str, int] = {}
        self._listed: dict[Any, int] = {}   # page -> how many tables list it
        self._capacity = capacity
        self._total = self._repeats = self._outside = 0
        over, limits = 0, limits or {}
        before: dict[str, list[Any]] = {}
        last = -1   # the snapshot before
        for i in snapshots:
            tables = events[i]["block_tables"]
            # Most tables are as the snapshot before showed them: compared in C, looked at only when changed.
            changed = self.changed[i] = list(compress(tables, map(ne, map(before.get, tables), tables.values())))
            new = 0   # ids this snapshot shows and the one before did not
            for rid in changed:
                table, old = tables[rid], before.get(rid)
                new += old is None
                if old and table[:len(old)] == old:   # the common change: pages appended
                    self._count(table[len(old):], 1)
                else:
                    self._count(old or (), -1)
                    self._count(table, 1)
                if old and not table:   # it held pages until the snapshot before
                    self.last_holding[rid] = last
                limit = limits.get(rid)
                if limit is not None:
                    over += (len(table) > limit) - (old is not None and len(old) > limit)
            if len(before) > len(tables) - new:   # some id the snapshot before showed is gone
                for rid in before.keys() - tables.keys():
                    gone = before[rid]
                    self._count(gone, -1)
                    if gone:
                        self.last_holding[rid] = last
                    limit = limits.get(rid)
                    over -= limit is not None and len(gone) > limit
            self.census[i] = (self._total, self._total - self._repeats, self._outside)
            self.oversized[i] = over
            before, last = tables, i
        for rid, table in before.items():   # still held in the last snapshot
            if table:
                self.last_holding[rid] = last

    def _count(self, pages: Sequence[Any], step: int) -> None:
        """Add (``step`` 1) or remove (-1) one listing of each page."""
        listed, capacity = self._listed, self._capacity
        repeats = outside = 0   # summed here, stored once: this runs for every page listed
        if step > 0:
            for page in pages:
                n = listed.get(page, 0)
                repeats += n > 0
                listed[page] = n + 1
                if not 0 <= page < capacity:
                    outside += 1
        else:
            for page in pages:
                n = listed.get(page, 0)
                repeats -= n > 1
                if n > 1:
                    listed[page] = n - 1
                else:
                    del listed[page]
                if not 0 <= page < capacity:
                    outside -= 1
        self._repeats += repeats
        self._outside += outside
        self._total += step * len(pages)
