"""Execute a scheduler's report step by step on the model with a paged KV cache.

:func:`run_schedule` walks a report's ``events``.  Each ``dispatch`` is one
model step whose rows feed positions ``[num_computed, num_computed +
input_tokens)`` of their request's teacher-forced stream, where
``num_computed`` counts the rows fed in the request's current incarnation.
``preempted`` frees the request's pages and resets ``num_computed`` to 0 (the
report's ``recompute`` rows rebuild it).  Pages are freed at ``release`` when
the report has one for the request, else at ``finished``/``cancelled``.

The engine keeps its own pages (it never uses the scheduler's page numbers):
a shuffled free list with page 0 reserved as the null page, every free page
poisoned with a large finite value, and an ``"ample"`` (2x the peak) or
``"tight"`` (exactly the peak, so freed pages are reused at once) pool.

``BUGS`` (from :mod:`.bugs`) names the injectable faults; pass a subset as
``EngineConfig(bugs=...)`` to check that the checks catch them.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable, Iterable, Mapping, Sequence

import torch
import torch.nn.functional as F

from .bugs import BUG_REGIMES, BUGS
from .model import Model, apply_rope
from .paged import BACKENDS, BlockAllocator, KVCache, Metadata, PagedAttention, RowSpec, build_metadata
from .sizes import BLOCK_TABLE_PAGES, DECODE_GRAPH_ROWS, PAD_TO, ROPE_TABLE_POSITIONS
from .streams import Records, Streams

__all__ = ["BUGS", "BUG_REGIMES", "NUMERICS", "EngineConfig", "ScheduleError", "run_schedule", "peak_pages",
           "paged_forward", "ROPE_TABLE_POSITIONS", "BLOCK_TABLE_PAGES", "DECODE_GRAPH_ROWS"]

NUMERICS = ("default", "batch_invariant", "batch_variant")
SPLITK_BELOW = 8  # batch_variant: steps with fewer real tokens use split-K linears


class ScheduleError(ValueError):
    """The report asks for something a token stream cannot do (unknown id, past the end...)."""


@dataclass(frozen=True)
class EngineConfig:
    """How the engine runs a schedule.

    * ``pool``: ``"ample"`` (twice the peak page demand) or ``"tight"`` (the peak).
    * ``backend``: paged attention backend, ``"sdpa"`` or the ``"loop"`` reference.
    * ``numerics``: ``"default"`` (one batched forward per step),
      ``"batch_invariant"`` (every token runs as its own one-token step, so its
      arithmetic cannot depend on the batch) or ``"batch_variant"`` (split-K
      linears when a step has fewer than 8 tokens: the negative control).
    * ``row_order``: ``"given"`` or ``"reversed"`` rows within every step.
    * ``pad_to``: pad the flat batch to a multiple (padding tokens write slot -1).
    * ``poison``: value of every K/V element of a free or never-written page.
      Keep it finite: the ``"sdpa"`` backend multiplies masked (zero) weights
      by whatever the gathered pages hold, and ``0 * nan`` is NaN.
    * ``bugs``: names from ``BUGS`` to inject.
    """

    block_size: int = 16
    pool: str = "ample"
    backend: str = "sdpa"
    numerics: str = "default"
    row_order: str = "given"
    pad_to: int = PAD_TO
    poison: float = 100.0
    placement_seed: int = 0
    bugs: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        object.__setattr__(self, "bugs", frozenset(self.bugs))  # hashable: runs are cached by config
        choices = {"pool": ("ample", "tight"), "backend": BACKENDS, "numerics": NUMERICS,
                   "row_order": ("given", "reversed")}
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, got {getattr(self, name)!r}")
        unknown = set(self.bugs) - set(BUGS)
        if unknown:
            raise ValueError(f"unknown bugs: {sorted(unknown)}")
        if self.block_size < 1 or self.pad_to < 1:
            raise ValueError("block_size and pad_to must be positive")


@dataclass(frozen=True)
class _Row:
    rid: str
    phase: str            # "prefill", "decode" or "recompute" as the report says
    start: int            # num_computed before the row
    n: int
    label: str            # phase plus chunk index, for reports
    blocks: tuple[int, ...]


class _Ledger:
    """Per-request bookkeeping of a run: fed counts, pages, chunk counters."""

    def __init__(self, streams: Streams, block_size: int, allocator: BlockAllocator,
                 bugs: frozenset[str] = frozenset(), on_free: Callable[[list[int]], None] = lambda b: None) -> None:
        self.streams = streams
        self.bs = block_size
        self.allocator = allocator
        self.bugs = bugs
        self.on_free = on_free
        self.computed: dict[str, int] = {}
        self.pages: dict[str, list[int]] = {}
        self.chunks: dict[str, int] = {}
        self.stale: dict[str, list[int]] = {}   # stale_block_table_past_64: freed ids kept past the cleared columns
        self.ended: set[str] = set()
        self.allocations = 0
        self.peak = 0

    def plan(self, work: Sequence[Mapping[str, Any]]) -> list[_Row]:
        """Validate one dispatch's rows and give them the pages they need."""
        rows: list[_Row] = []
        seen: set[str] = set()
        for item in work:
            rid, phase, n = (_field(item, name, "dispatch row") for name in ("id", "phase", "input_tokens"))
            rid, phase = str(rid), str(phase)
            if rid not in self.streams.tokens:
                raise ScheduleError(f"dispatch row for unknown request {rid!r}")
            if rid in self.ended or rid in seen:
                raise ScheduleError(f"request {rid!r} dispatched after it ended or twice in one step")
            if not isinstance(n, int) or isinstance(n, bool) or n < 1:
                raise ScheduleError(f"request {rid!r}: input_tokens must be a positive integer, got {n!r}")
            start = self.computed.get(rid, 0)
            if start + n > self.streams.fed_len(rid):
                raise ScheduleError(f"request {rid!r} feeds positions [{start}, {start + n}) but only "
                                    f"{self.streams.fed_len(rid)} can be fed")
            seen.add(rid)
            pages = self.pages.setdefault(rid, [])
            while len(pages) * self.bs < start + n:
                stale = self.stale.get(rid, [])
                column = len(pages) - BLOCK_TABLE_PAGES
                pages.append(stale[column] if 0 <= column < len(stale) else self._allocate(rid))
            k = self.chunks.get(rid, 0)
            label = phase if phase == "decode" else f"{phase}#{k}"
            rows.append(_Row(rid, phase, start, n, label, tuple(pages)))
        self.peak = max(self.peak, sum(map(len, self.pages.values())))
        return rows

    def _allocate(self, rid: str) -> int:
        self.allocations += 1
        if "double_allocation" in self.bugs and self.allocations % 3 == 0:
            taken = [p for other, ps in self.pages.items() if other != rid for p in ps]
            if taken:
                return taken[-1]
        return self.allocator.allocate()

    def advance(self, rows: Sequence[_Row]) -> None:
        for row in rows:
            self.computed[row.rid] = row.start + row.n
            if row.phase != "decode":
                self.chunks[row.rid] = self.chunks.get(row.rid, 0) + 1

    def preempt(self, rid: str) -> None:
        self.computed[rid] = 0
        self.chunks[rid] = 0
        if "stale_block_table" in self.bugs:
            self._release(list(self.pages.get(rid, [])))
            return
        pages = self.pages.pop(rid, [])
        if "stale_block_table_past_64" in self.bugs:
            self.stale[rid] = pages[BLOCK_TABLE_PAGES:]
        self._release(pages)

    def end(self, rid: str) -> None:
        self.ended.add(rid)
        self.stale.pop(rid, None)
        self._release(self.pages.pop(rid, []))

    def _release(self, pages: list[int]) -> None:
        self.allocator.release(pages)
        self.on_free(pages)


def _field(item: Any, name: str, what: str) -> Any:
    """``item[name]``, or a ScheduleError saying which field of which record is missing."""
    if not isinstance(item, Mapping) or name not in item:
        raise ScheduleError(f"{what} without the field {name!r}: {item!r}"[:300])
    return item[name]


def _replay(events: Sequence[Mapping[str, Any]], ledger: _Ledger,
            on_step: Callable[[int, list[_Row]], None], reverse_rows: bool = False) -> None:
    release_ids = {e.get("id") for e in events if e.get("event") == "release"}
    step = 0
    for event in events:
        kind = event.get("event")
        if kind == "dispatch":
            work = _field(event, "work", "dispatch event")
            if not isinstance(work, list):
                raise ScheduleError(f"dispatch event whose work is not a list: {work!r}"[:300])
            rows = ledger.plan(work[::-1] if reverse_rows else work)
            on_step(step, rows)
            ledger.advance(rows)
            step += 1
        elif kind == "preempted":
            ledger.preempt(str(_field(event, "id", "preempted event")))
        elif kind == "release" or (kind in ("finished", "cancelled") and event.get("id") not in release_ids):
            ledger.end(str(_field(event, "id", f"{kind} event")))


def peak_pages(streams: Streams, events: Sequence[Mapping[str, Any]], block_size: int) -> int:
    """Most pages live at once when ``events`` run on a clean engine (validates the schedule).

    The pool is sized from the streams (the kit's trace: every request's positions at once, the most a
    clean engine can hold), never from the report's numbers, which the judged code wrote; a row asking for
    more than its stream holds is a ScheduleError before a page is allocated for it."""
    upper = 1 + sum(-(-streams.fed_len(rid) // block_size) for rid in streams.tokens)
    ledger = _Ledger(streams, block_size, BlockAllocator(upper + 1, seed=0))
    _replay(events, ledger, lambda step, rows: None)
    return ledger.peak


_METADATA_BUGS = frozenset({"positions_restart", "decode_position_off_by_one", "cross_row_leak",
                            "slot_mapping_off_by_one", "seq_lens_exclude_chunk", "read_past_end",
                            "wrong_block_table_row", "rope_table_capped", "block_table_truncated",
                            "decode_block_table_mod_8"})


def _inject(meta: Metadata, rows: Sequence[_Row], bugs: frozenset[str], num_slots: int) -> Metadata:
    """Apply the metadata-level bugs to a correct ``meta`` (attention, RoPE and write inputs)."""
    if not bugs & _METADATA_BUGS:
        return meta
    dev = meta.positions.device
    T = meta.num_actual_tokens
    n = torch.tensor([r.n for r in rows], device=dev)
    changes: dict[str, torch.Tensor] = {}
    positions = meta.positions.clone()
    if "positions_restart" in bugs:
        positions[:T] -= torch.tensor([r.start for r in rows], device=dev).repeat_interleave(n)
    if "decode_position_off_by_one" in bugs:
        positions[:T] -= torch.tensor([r.phase == "decode" for r in rows], device=dev).long().repeat_interleave(n)
    if "rope_table_capped" in bugs:
        positions = positions.clamp(max=ROPE_TABLE_POSITIONS - 1)
    changes["positions"] = positions
    if "cross_row_leak" in bugs and len(rows) > 1:
        qsl = meta.query_start_loc.clone()
        qsl[1:-1] -= 1
        changes["query_start_loc"] = qsl
    if "slot_mapping_off_by_one" in bugs:
        slots = meta.slot_mapping.clone()
        real = slots >= 0
        slots[real] = (slots[real] + 1) % num_slots   # wraps instead of indexing out of the cache
        changes["slot_mapping"] = slots
    seq_lens = meta.seq_lens
    block_table = meta.block_table
    if "seq_lens_exclude_chunk" in bugs:
        seq_lens = seq_lens - n.to(seq_lens.dtype)
    if "read_past_end" in bugs:
        seq_lens = seq_lens + 1
        block_table = F.pad(block_table, (0, 1))   # the slot past the end may lie in an unlisted page
    if "wrong_block_table_row" in bugs and len(rows) > 1:
        block_table = block_table.roll(1, dims=0)
    if "block_table_truncated" in bugs:
        block_table = block_table.clone()
        block_table[:, BLOCK_TABLE_PAGES:] = 0
    decode = [i for i, r in enumerate(rows) if r.phase == "decode"]
    if "decode_block_table_mod_8" in bugs and len(decode) > DECODE_GRAPH_ROWS:
        block_table = block_table.clone()
        block_table[decode[DECODE_GRAPH_ROWS:]] = block_table[[decode[k % DECODE_GRAPH_ROWS]
                                                               for k in range(DECODE_GRAPH_ROWS, len(decode))]]
    changes["seq_lens"] = seq_lens
    changes["block_table"] = block_table
    return replace(meta, **changes)


_MERGE_BUGS = {"split_kv_merge_unscaled": "unscaled", "split_kv_merge_first_max": "first_max",
               "split_kv_merge_last_max": "last_max"}


@torch.no_grad()
def paged_forward(model: Model, cache: KVCache, meta: Metadata, input_ids: torch.Tensor, *,
                  backend: str = "sdpa", bugs: frozenset[str] = frozenset(), splitk: bool = False) -> torch.Tensor:
    """One engine step: logits ``[T_pad, vocab]`` of the flat batch described by ``meta``.

    ``input_ids`` holds the ``T`` real tokens (padding is added here).  Each
    layer writes the step's K/V at ``meta.slot_mapping`` and then runs paged
    attention over the cache; ``bugs`` may hold the attention-level faults
    ``rope_k_offset``, ``top_left_mask``, ``attention_before_write``,
    ``split_kv_merge_unscaled``, ``split_kv_merge_first_max``, ``split_kv_merge_last_max``,
    ``split_kv_drops_single_key`` and ``softmax_without_max``.
    """
    T = meta.num_actual_tokens
    ids = F.pad(input_ids.to(model.device), (0, meta.positions.numel() - T))
    merge = next((m for bug, m in _MERGE_BUGS.items() if bug in bugs), "rescaled")
    attention = PagedAttention(meta, backend=backend, align="top_left" if "top_left_mask" in bugs else "bottom_right",
                               merge=merge, softmax="naive" if "softmax_without_max" in bugs else "stable",
                               count="one_short" if "split_kv_drops_single_key" in bugs else "exact")
    late_write = "attention_before_write" in bugs
    k_shift = torch.full_like(meta.positions, -1) if "rope_k_offset" in bugs else None
    written = (meta.slot_mapping >= 0).nonzero().squeeze(1)   # slot -1 (padding) is never written
    slots = meta.slot_mapping[written]

    def attend(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        if k_shift is not None:
            k = apply_rope(k, k_shift, model.config.rope_theta)  # rope(rope(k, p), -1) = rope(k, p - 1)
        if not late_write:
            cache.write(layer, k[written], v[written], slots)
        out = attention(q[:T], *cache.layer(layer))
        if late_write:
            cache.write(layer, k[written], v[written], slots)
        return F.pad(out, (0, 0, 0, 0, 0, q.shape[0] - T))

    return model.forward(ids, meta.positions, attend, splitk=splitk)


class _Executor:
    """Runs the rows of each step through the model and collects their logits."""

    def __init__(self, model: Model, streams: Streams, config: EngineConfig, cache: KVCache) -> None:
        self.model = model
        self.streams = streams
        self.config = config
        self.cache = cache
        self.records = Records(logits=torch.empty(0))
        self.parts: list[torch.Tensor] = []
        self.num_slots = cache.data.shape[2] * config.block_size

    def step(self, step: int, rows: list[_Row]) -> None:
        if self.config.numerics == "batch_invariant":
            for row in rows:
                for j in range(row.n):
                    self._forward(step, [replace(row, start=row.start + j, n=1)], chunk_start=j == 0)
        else:
            self._forward(step, rows, chunk_start=True)

    def _forward(self, step: int, rows: list[_Row], chunk_start: bool) -> None:
        cfg, model = self.config, self.model
        specs = [RowSpec(r.start, r.n, r.blocks) for r in rows]
        meta = _inject(build_metadata(specs, cfg.block_size, model.device, cfg.pad_to), rows, cfg.bugs,
                       self.num_slots)
        T = meta.num_actual_tokens
        ids = torch.cat([self.streams.tokens[r.rid][r.start:r.start + r.n] for r in rows])
        splitk = cfg.numerics == "batch_variant" and T < SPLITK_BELOW
        logits = paged_forward(model, self.cache, meta, ids, backend=cfg.backend, bugs=cfg.bugs, splitk=splitk)
        self.parts.append(logits[:T])
        rec = self.records
        for r in rows:
            rec.request += [r.rid] * r.n
            rec.position += range(r.start, r.start + r.n)
            rec.step += [step] * r.n
            rec.phase += [r.label] * r.n
            first = chunk_start and r.phase != "decode" and r.start > 0
            rec.chunk_start += [first] + [False] * (r.n - 1)

    def finish(self) -> Records:
        vocab = self.model.config.vocab
        self.records.logits = torch.cat(self.parts) if self.parts else torch.empty(0, vocab)
        return self.records


def run_schedule(model: Model, streams: Streams, events: Iterable[Mapping[str, Any]],
                 config: EngineConfig = EngineConfig()) -> Records:
    """Run every dispatch of ``events`` on ``model``; return the logits of every fed position.

    Raises :class:`ScheduleError` when the report cannot be executed on the
    streams (see :class:`_Ledger.plan`).  Deterministic for a given input.
    """
    events = list(events)
    peak = peak_pages(streams, events, config.block_size)
    num_blocks = 1 + max(1, peak if config.pool == "tight" else 2 * peak)
    c = model.config
    cache = KVCache(c.n_layers, num_blocks, config.block_size, c.n_kv_heads, c.head_dim, model.dtype,
                    model.device, config.poison)
    ledger = _Ledger(streams, config.block_size, BlockAllocator(num_blocks, config.placement_seed),
                     config.bugs, on_free=cache.poison_blocks)
    executor = _Executor(model, streams, config, cache)
    _replay(events, ledger, executor.step, reverse_rows=config.row_order == "reversed")
    return executor.finish()
