"""Building transformers' continuous-batching engine on CPU and stepping it one batch at a time.

Everything version-specific lives here, written against transformers 5.23.0 (torch 2.13.0 CPU).
The engine is the one ``generate_batch`` and ``transformers serve --continuous-batching`` run: a
``ContinuousBatchingManager`` and the ``ContinuousBatchProcessor`` it creates, with its
``PagedAttentionCache``, its scheduler (FIFO or prefill-first) and its ``OffloadingManager``
(preemption by soft reset: the victim's blocks are freed and an equivalent request, prompt plus
the tokens it generated, is queued again for recompute).  A step is the manager's own loop body,
``prepare_next_batch()`` then the forward then ``update_batch()``; only the forward is replaced:
it writes one synthetic token per sampled row where the model's sampled ids would go.

The way in is private (``ContinuousBatchingManager._create_batch_processor``,
``ContinuousBatchProcessor.prepare_next_batch / update_batch``, the processor's
``inputs_and_outputs.output_ids`` buffer, the allocator's ``block_table``), so the package pins
transformers 5.23.0.  The model is a tiny seeded Llama whose weights are never used; it gives the
cache its layer and head shapes.  Nothing is downloaded.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

for _name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_HUB_DISABLE_UPDATE_CHECK"):
    os.environ.setdefault(_name, "1")  # everything is local; never reach the Hub

import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM  # noqa: E402
from transformers.generation.configuration_utils import ContinuousBatchingConfig  # noqa: E402
from transformers.generation.continuous_batching.continuous_api import (  # noqa: E402
    ContinuousBatchingManager,
    ContinuousBatchProcessor,
)
from transformers.generation.continuous_batching.requests import GenerationOutput, RequestStatus  # noqa: E402

__all__ = ["EngineSettings", "Engine", "TRANSFORMERS_VERSION", "SYNTHETIC_TOKEN", "MIN_PAGE_SIZE", "finished"]

TRANSFORMERS_VERSION: str = transformers.__version__
# Every synthetic sample is this token; the requests have no end-of-sequence token (eos -1), so
# only max_new_tokens ends a request.
SYNTHETIC_TOKEN = 7
MIN_PAGE_SIZE = 4  # ContinuousBatchingConfig refuses a smaller page_size ("page_size must be at least 4")
MAX_POSITIONS = 4096


@dataclass(frozen=True)
class EngineSettings:
    """The transformers settings one kit config maps to (see the adapter's mapping table)."""

    scheduler_type: str        # "fifo" or "prefill_first" (SCHEDULER_MAPPING)
    num_blocks: int
    page_size: int
    max_batch_tokens: int
    max_requests_per_batch: int


@lru_cache(maxsize=1)
def _tiny_model() -> LlamaForCausalLM:
    """A tiny seeded Llama: only its shapes matter (the forward is replaced), one per process."""
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=MAX_POSITIONS)
    config._attn_implementation = "sdpa"
    return LlamaForCausalLM(config).eval()


class Engine:
    """One fresh manager and batch processor; the calls the adapter's driver makes."""

    def __init__(self, settings: EngineSettings) -> None:
        cb_config = ContinuousBatchingConfig(
            page_size=settings.page_size, num_blocks=settings.num_blocks, max_batch_tokens=settings.max_batch_tokens,
            max_requests_per_batch=settings.max_requests_per_batch, scheduler_type=settings.scheduler_type,
            allow_block_sharing=False,   # no prefix sharing: trace prompts carry no token content
            use_async_batching=False,    # one batch in flight: its update before the next schedule
            use_cuda_graph=False, max_blocks_per_request=0, cpu_offload_space=0.0)
        generation = GenerationConfig(do_sample=False, max_new_tokens=1, eos_token_id=-1)
        self.manager = ContinuousBatchingManager(_tiny_model(), generation, cb_config)
        self.processor: ContinuousBatchProcessor = self.manager._create_batch_processor()
        self.scheduler = self.processor.scheduler
        self.cache = self.processor.cache
        (self.allocator,) = self.cache.cache_allocators.values()  # one full-attention group
        self.capacity = self.cache.num_blocks
        if self.capacity != settings.num_blocks or self.allocator.blocks_per_sector != 1:
            raise RuntimeError(f"transformers sized the cache at {self.capacity} blocks "
                               f"({self.allocator.blocks_per_sector} per sector), not {settings.num_blocks}")
        self.cancelled: list[str] = []  # what the last step's clear_cancelled_requests removed
        clear = self.scheduler.clear_cancelled_requests

        def clear_and_record() -> list[Any]:  # observe, do not change: the engine's own method runs
            states = clear()
            self.cancelled.extend(state.request_id for state in states)
            return states

        self.scheduler.clear_cancelled_requests = clear_and_record

    # -- input -----------------------------------------------------------------

    def add(self, rid: str, prompt: list[int], max_new_tokens: int) -> None:
        """``ContinuousBatchingManager.add_request`` (streamed, so every new token is an output)."""
        self.manager.add_request(prompt, request_id=rid, max_new_tokens=max_new_tokens, streaming=True,
                                 eos_token_id=-1)

    def cancel(self, rid: str) -> None:
        """``ContinuousBatchingManager.cancel_request``: applied at the next ``prepare_next_batch``."""
        self.manager.cancel_request(rid)

    # -- one step ----------------------------------------------------------------

    def prepare(self) -> bool:
        """``prepare_next_batch()``: queues drained, cancels cleared, batch scheduled (blocks allocated,
        requests offloaded when blocks ran out).  True when there is a batch to run."""
        self.cancelled = []
        return self.processor.prepare_next_batch()

    def batch(self) -> list[tuple[str, int, int, int]]:
        """The scheduled batch: (request id, tokens fed, position before, tokens the state knows)."""
        rows = []
        for future in self.processor.inputs_and_outputs.requests_in_batch:
            state = future.state
            known = len(state.initial_tokens) + len(state.generated_tokens)
            rows.append((state.request_id, future.query_length, state.position_offset - future.query_length, known))
        return rows

    def run_batch(self) -> list[GenerationOutput]:
        """The synthetic forward, then ``update_batch()``; the outputs it delivered."""
        self.processor.inputs_and_outputs.output_ids[0, :].fill_(SYNTHETIC_TOKEN)
        self.processor.update_batch()
        outputs = []
        queue = self.manager.output_router.output_queue
        while not queue.empty():
            outputs.append(queue.get_nowait())
        return outputs

    # -- state -------------------------------------------------------------------

    def pending(self) -> bool:
        return self.scheduler.has_pending_requests() or not self.manager.input_queue.empty()

    def active(self) -> list[str]:
        return list(self.scheduler.active_requests)

    def waiting(self) -> list[str]:
        return list(self.scheduler.waiting_requests)

    def tables(self) -> dict[str, list[int]]:
        """Block tables from the allocator, as page ids 0..capacity-1 (block id minus the reserved sectors)."""
        offset = self.cache.pool.num_reserved_sectors
        return {rid: [b - offset for b in blocks] for rid, blocks in self.allocator.block_table.items() if blocks}

    def free_blocks(self) -> int:
        pool = self.cache.pool
        return pool.num_free_sectors * self.allocator.blocks_per_sector + pool.count_free_blocks(self.allocator.index)

    def new_admissions_blocked(self) -> bool:
        return bool(self.scheduler.block_new_requests)


def finished(output: GenerationOutput) -> bool:
    return output.status == RequestStatus.FINISHED
