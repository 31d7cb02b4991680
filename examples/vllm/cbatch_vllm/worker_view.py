"""Each request's KV block table as vLLM's model runner holds it, rebuilt from the scheduler's output alone.

vLLM's scheduler tells its workers about block tables only through ``SchedulerOutput``; the
model runner (``GPUModelRunner._update_states`` in vLLM 0.32.0, which the CPU runner inherits)
keeps one table per request and changes it in this order:

1. ``finished_req_ids``: the request's state is dropped;
2. ``scheduled_new_reqs``: a ``NewRequestData`` starts a table of its ``block_ids``;
3. ``scheduled_cached_reqs``: for a request in ``resumed_req_ids`` its ``new_block_ids`` replace
   the table; for any other, ``new_block_ids`` (when not None) are appended to it, group by group.

A preempted request keeps its stale table in the runner until it is resumed (the runner then
replaces it) but never computes on it meanwhile, so ``WorkerView`` parks a request named in
``preempted_req_ids`` until the scheduler next sends data for it.  A scheduler that forgets to
flag a resumed request therefore shows here as a table that appends the new blocks to the
stale ones: the KV corruption a real runner would compute with.
"""

from __future__ import annotations

from typing import Any

__all__ = ["WorkerView"]


class WorkerView:
    """The model runner's block tables (KV cache groups of block ids) per request."""

    def __init__(self) -> None:
        self._tables: dict[str, list[list[int]]] = {}
        self._parked: set[str] = set()

    def update(self, out: Any) -> None:
        """Apply one ``SchedulerOutput`` the way the model runner does (module docstring)."""
        for rid in out.finished_req_ids:
            self._tables.pop(rid, None)
            self._parked.discard(rid)
        self._parked.update(out.preempted_req_ids or ())
        for new in out.scheduled_new_reqs:
            self._tables[new.req_id] = [list(group) for group in new.block_ids]
            self._parked.discard(new.req_id)
        cached = out.scheduled_cached_reqs
        for rid, new_ids in zip(cached.req_ids, cached.new_block_ids):
            groups = [list(group) for group in new_ids or ()]
            table = self._tables.get(rid)
            if rid in cached.resumed_req_ids or table is None:
                # A runner that never received the request has no table to append to: what it
                # would compute with is the new blocks alone.
                self._tables[rid] = groups
            else:
                for have, more in zip(table, groups):
                    have.extend(more)
            self._parked.discard(rid)

    def tables(self) -> dict[str, list[int]]:
        """The first KV cache group's block ids of every request the runner would compute on
        (known to it and not parked by a preemption), for the requests that hold any."""
        return {rid: list(groups[0]) for rid, groups in self._tables.items()
                if rid not in self._parked and groups and groups[0]}
