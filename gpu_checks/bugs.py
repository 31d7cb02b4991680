"""The injectable engine faults (``BUGS``) and the regime each one needs to show (``BUG_REGIMES``).

Pass a subset as ``EngineConfig(bugs=...)`` to prove the checks catch them.
No torch here, so a plan can be printed (``--dry-run``) without it.
"""

from __future__ import annotations

from .sizes import BLOCK_TABLE_PAGES, DECODE_GRAPH_ROWS, ROPE_TABLE_POSITIONS, SPLIT_KV_PARTITION

__all__ = ["BUGS", "BUG_REGIMES", "REGIMES"]

BUGS: dict[str, str] = {
    "cross_row_leak": "query_start_loc boundaries one token early: each row's first query is the previous "
                      "request's last token, attending the wrong request's KV",
    "positions_restart": "positions restart at 0 in every chunk (arange(q_len), not num_computed + arange)",
    "rope_k_offset": "keys rotated at position - 1 while queries use the position (RoPE offset on K)",
    "decode_position_off_by_one": "decode tokens get position - 1 (RoPE input only)",
    "slot_mapping_off_by_one": "every token writes its KV one slot further than it reads it",
    "seq_lens_exclude_chunk": "seq_lens = num_computed: the step's own tokens are not attended",
    "wrong_block_table_row": "row i reads row i-1's block table (row/request mix-up)",
    "top_left_mask": "causal mask aligned top-left instead of bottom-right",
    "read_past_end": "seq_lens one too long: reads one slot past the last written one (stale or next page)",
    "stale_block_table": "after a preemption the request keeps its freed page ids and recomputes into them",
    "attention_before_write": "attention runs before the step's KV is written to the cache",
    "double_allocation": "every third page allocation hands out a page another live request holds",
    "split_kv_merge_unscaled": f"the split-KV decode kernel sums its {SPLIT_KV_PARTITION}-key partitions without "
                               "rescaling them to a common max (only wrong past 512 keys)",
    "rope_table_capped": f"RoPE reads a cos/sin table of {ROPE_TABLE_POSITIONS} positions: later positions "
                         "get the last entry's rotation",
    "block_table_truncated": f"the attention block table holds {BLOCK_TABLE_PAGES} pages per request: later "
                             "entries stay the null page (writes still land in the right pages)",
    "softmax_without_max": "the decode kernel takes exp(score) without subtracting the max: overflows to "
                           "inf/NaN once scores pass ~88.7 in float32/bfloat16",
    "split_kv_drops_single_key": f"the split-KV kernel counts its partitions as ceil((seq_len - 1) / "
                                 f"{SPLIT_KV_PARTITION}): a decode one key past a partition boundary "
                                 "(seq_len % 512 == 1) drops its newest key",
    "split_kv_merge_first_max": "the split-KV merge rescales every partition to the first partition's max, not "
                                "the common one: exp overflows once a later partition leads by > 88.7 (float32)",
    "split_kv_merge_last_max": "the split-KV merge rescales every partition to the last partition's max: exp "
                               "overflows once an earlier partition leads the last by > 88.7 (float32)",
    "decode_block_table_mod_8": f"decode rows index the block table modulo {DECODE_GRAPH_ROWS} (a buffer sized "
                                "for one graph bucket): the 9th decode row of a step reads the 1st's pages",
    "stale_block_table_past_64": f"a preemption clears the request's block table row only up to column "
                                 f"{BLOCK_TABLE_PAGES}: after re-admission, columns past it still name the "
                                 "freed pages, which other requests get again",
}

REGIMES: dict[str, str] = {
    "short": "any workload",
    "long_context": "past 512 keys, 1,024 positions or 64 pages",
    "large_scores": "attention scores past 88.7 (a q_gain preset), float32/bfloat16",
    "partition_boundary": "a decode at seq_len % 512 == 1 (513, 1,025, ... keys)",
    "later_partition_leads": "a later split-KV partition's max score leading the first's by > 88.7, float32",
    "first_partition_leads": "an earlier split-KV partition's max score leading the last's by > 88.7, float32",
    "wide_decode": f"a step with more than {DECODE_GRAPH_ROWS} decode rows",
    "long_preemption": f"a preemption of a request holding more than {BLOCK_TABLE_PAGES} pages",
}

# Where each bug shows (see REGIMES); "short" bugs show on any workload.
BUG_REGIMES: dict[str, str] = {
    **{bug: "short" for bug in BUGS},
    "split_kv_merge_unscaled": "long_context",
    "rope_table_capped": "long_context",
    "block_table_truncated": "long_context",
    "softmax_without_max": "large_scores",
    "split_kv_drops_single_key": "partition_boundary",
    "split_kv_merge_first_max": "later_partition_leads",
    "split_kv_merge_last_max": "first_partition_leads",
    "decode_block_table_mod_8": "wide_decode",
    "stale_block_table_past_64": "long_preemption",
}
