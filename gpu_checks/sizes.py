"""The paged engine's size parameters and the boundaries a workload must reach around them.

A kernel or a scheduler usually breaks at a size edge: the last slot of a
page, one key past a split-KV partition, the first position past a table, a
batch one row wider than a padding bucket.  :data:`SPLIT_KV_PARTITION` and the
other constants here are the engine's own sizes (``paged``/``engine`` import
them from here); :func:`size_parameters` lists every size a run depends on,
with what it measures, and :func:`boundaries_reached` replays a report and
says which of ``n - 1``, ``n``, ``n + 1`` it reached for each.  Workloads are
built from these parameters (``schedules.boundary_workload``), never from a
hand-written list of lengths.  No torch here: ``--dry-run`` and ``--help``
work without it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping

__all__ = ["SPLIT_KV_PARTITION", "ROPE_TABLE_POSITIONS", "BLOCK_TABLE_PAGES", "PAD_TO", "DECODE_GRAPH_ROWS",
           "MEASURES", "SizeParameter", "size_parameters", "boundaries_reached", "key_intervals"]

SPLIT_KV_PARTITION = 512      # keys per split-KV partition; decode rows past it go through the split-KV kernel
ROPE_TABLE_POSITIONS = 1024   # rope_table_capped: a cos/sin table sized for max_position_embeddings = 1024
BLOCK_TABLE_PAGES = 64        # block_table_truncated / stale_block_table_past_64: 1,024 tokens at 16-token pages
PAD_TO = 8                    # the flat batch is padded to a multiple of this (a CUDA-graph bucket)
DECODE_GRAPH_ROWS = 8         # decode_block_table_mod_8: decode rows per captured graph

MEASURES = {
    "decode_keys": "keys of a one-query (decode) row",
    "positions": "positions fed",
    "row_pages": "pages a one-query row reads",
    "prompt_len": "prompt lengths (whole chunks, one token past a chunk)",
    "step_tokens": "real tokens of one step (before padding)",
    "decode_rows": "decode rows of one step",
}


@dataclass(frozen=True)
class SizeParameter:
    """One size ``value`` of the engine, the quantity it bounds (a key of ``MEASURES``) and where it lives."""

    name: str
    value: int
    measure: str
    source: str

    @property
    def targets(self) -> tuple[int, int, int]:
        """``n - 1, n, n + 1``."""
        return self.value - 1, self.value, self.value + 1


def size_parameters(block_size: int, prefill_chunk: int) -> tuple[SizeParameter, ...]:
    """Every size parameter a run on pages of ``block_size`` with chunks of ``prefill_chunk`` depends on."""
    return (
        SizeParameter("page_size", block_size, "decode_keys", "EngineConfig.block_size"),
        SizeParameter("split_kv_partition", SPLIT_KV_PARTITION, "decode_keys",
                      "paged.SPLIT_KV_PARTITION (also the 512-key switch from SDPA to the split-KV kernel)"),
        SizeParameter("two_partitions", 2 * SPLIT_KV_PARTITION, "decode_keys",
                      "2 x paged.SPLIT_KV_PARTITION (the 1,024-key threshold of a third partition)"),
        SizeParameter("rope_table", ROPE_TABLE_POSITIONS, "positions", "engine.ROPE_TABLE_POSITIONS"),
        SizeParameter("block_table_width", BLOCK_TABLE_PAGES, "row_pages", "engine.BLOCK_TABLE_PAGES"),
        SizeParameter("prefill_chunk", prefill_chunk, "prompt_len", "the scheduler's prefill_chunk"),
        SizeParameter("batch_padding", PAD_TO, "step_tokens", "EngineConfig.pad_to"),
        SizeParameter("decode_graph_rows", DECODE_GRAPH_ROWS, "decode_rows", "engine.DECODE_GRAPH_ROWS"),
    )


def key_intervals(params: Iterable[SizeParameter], block_size: int) -> list[tuple[int, int]]:
    """Key counts ``[lo, hi]`` one decoding request must pass through to reach every key-like target
    (decode keys, positions, row pages) of ``params``, merged where they overlap or nearly touch."""
    spans = []
    for p in params:
        lo, _, hi = p.targets
        if p.measure == "decode_keys":
            spans.append((lo, hi))
        elif p.measure == "positions":            # position q is fed by a row of q + 1 keys
            spans.append((lo + 1, hi + 1))
        elif p.measure == "row_pages":            # the last key count with n - 1 pages, the first with n + 1
            spans.append((lo * block_size, p.value * block_size + 1))
    merged: list[list[int]] = []
    for lo, hi in sorted(spans):
        if merged and lo <= merged[-1][1] + 2 * block_size:
            merged[-1][1] = max(merged[-1][1], hi)
        else:
            merged.append([lo, hi])
    return [(lo, hi) for lo, hi in merged]


def boundaries_reached(trace: Iterable[Mapping[str, Any]], report: Mapping[str, Any],
                       params: Iterable[SizeParameter], block_size: int) -> dict[str, dict[int, bool]]:
    """``{parameter name: {target: reached}}`` for ``report`` run on ``trace``.

    Replays the dispatch rows (a preemption resets the request's computed
    count): a one-query row of ``k`` keys reaches ``decode_keys == k`` and
    ``row_pages == ceil(k / block_size)``; every row reaches the positions it
    feeds; each step reaches its token count and its count of decode rows;
    a prompt reaches ``prompt_len`` when the trace has it and the report fed it.
    """
    seen: dict[str, set[int]] = {m: set() for m in MEASURES}
    prompts = {str(x["id"]): int(x["prompt_tokens"]) for x in trace if x.get("event") == "arrival"}
    computed: dict[str, int] = {}
    for event in report["events"]:
        if event.get("event") == "preempted":
            computed[str(event["id"])] = 0
        if event.get("event") != "dispatch":
            continue
        work = event["work"]
        seen["step_tokens"].add(sum(w["input_tokens"] for w in work))
        seen["decode_rows"].add(sum(w["phase"] == "decode" for w in work))
        for w in work:
            rid, n = str(w["id"]), w["input_tokens"]
            start = computed.get(rid, 0)
            seen["positions"].update(range(start, start + n))
            if n == 1:
                seen["decode_keys"].add(start + 1)
                seen["row_pages"].add(-(-(start + 1) // block_size))
            if start + n >= prompts.get(rid, 0) > start:
                seen["prompt_len"].add(prompts[rid])
            computed[rid] = start + n
    return {p.name: {t: t in seen[p.measure] for t in p.targets} for p in params}
