"""The real model path: a tiny seeded Llama and a locally trained tokenizer, run through the engine's own
batch processor with its real forward, greedy, one step at a time.

``make_tiny_model(dir, seed)`` writes the model (safetensors, float32) and a byte-level BPE tokenizer
trained with the ``tokenizers`` library on seeded text; nothing is downloaded.  ``generate`` runs
prompts through ``ContinuousBatchProcessor`` (``prepare_next_batch``, the manager's
``_generation_step`` forward, ``update_batch``: the loop ``generate_batch`` runs, stepped here so that
preemptions can be seen) and returns each request's greedy tokens and logprobs, and which requests
were preempted (offloaded, then recomputed).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path

from . import engine as _engine  # noqa: F401  (sets the offline environment first)

import torch  # noqa: E402
from transformers import (  # noqa: E402
    AutoModelForCausalLM,
    GenerationConfig,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
)
from transformers.generation.configuration_utils import ContinuousBatchingConfig  # noqa: E402
from transformers.generation.continuous_batching.continuous_api import ContinuousBatchingManager  # noqa: E402

__all__ = ["make_tiny_model", "load_model", "generate", "Generated"]

WORDS = ("the cache holds pages of keys and values while the scheduler admits requests in order and "
         "preempts the newest when blocks run out then recomputes them from their prompt").split()
CHAT_TEMPLATE = ("{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}<s>assistant:{% endif %}")


def make_tiny_model(directory: str | Path, seed: int = 0) -> Path:
    """Write a seeded tiny ``LlamaForCausalLM`` (float32) and its tokenizer into ``directory``."""
    from tokenizers import Tokenizer, models, pre_tokenizers, decoders, trainers

    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    text = [" ".join(rng.choice(WORDS) for _ in range(24)) for _ in range(200)]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(text, trainers.BpeTrainer(vocab_size=512, special_tokens=["<s>", "</s>", "<pad>"],
                                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>")
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=len(fast), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                         bos_token_id=fast.bos_token_id, eos_token_id=fast.eos_token_id,
                         pad_token_id=fast.pad_token_id, torch_dtype="float32")
    model = LlamaForCausalLM(config)
    model.generation_config = GenerationConfig(do_sample=False, eos_token_id=fast.eos_token_id,
                                               pad_token_id=fast.pad_token_id, max_new_tokens=16)
    model.save_pretrained(out)
    return out


def load_model(directory: str | Path) -> LlamaForCausalLM:
    """The saved model, loaded as a user would (local files only), with SDPA attention."""
    return AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32, attn_implementation="sdpa",
                                                local_files_only=True).eval()


@dataclass
class Generated:
    """Each request's greedy tokens and logprobs, and the requests that were preempted."""

    tokens: dict[str, list[int]] = field(default_factory=dict)
    logprobs: dict[str, list[float]] = field(default_factory=dict)
    preempted: set[str] = field(default_factory=set)


def generate(model: LlamaForCausalLM, prompts: dict[str, list[int]], *, max_new_tokens: int, num_blocks: int,
             page_size: int = 4, max_batch_tokens: int = 64, scheduler: str = "fifo",
             max_steps: int = 10_000) -> Generated:
    """Greedy generation of every prompt through the engine's batch processor, one step at a time."""
    cb = ContinuousBatchingConfig(page_size=page_size, num_blocks=num_blocks, max_batch_tokens=max_batch_tokens,
                                  scheduler_type=scheduler, allow_block_sharing=False, use_async_batching=False,
                                  use_cuda_graph=False, max_blocks_per_request=0, return_logprobs=True,
                                  cpu_offload_space=0.0)
    generation = GenerationConfig(do_sample=False, max_new_tokens=max_new_tokens, eos_token_id=-1)
    manager = ContinuousBatchingManager(model, generation, cb)
    processor = manager._create_batch_processor()
    manager.batch_processor = processor
    for rid, ids in prompts.items():
        manager.add_request(ids, request_id=rid, max_new_tokens=max_new_tokens, eos_token_id=-1)
    result = Generated()
    for _ in range(max_steps):
        active = set(processor.scheduler.active_requests)
        if not processor.prepare_next_batch():
            break
        result.preempted |= active & set(processor.scheduler.waiting_requests)
        manager._generation_step()
        processor.update_batch()
        queue = manager.output_router.output_queue
        while not queue.empty():
            out = queue.get_nowait()
            if out.error is not None:
                raise RuntimeError(f"transformers failed {out.request_id!r}: {out.error}")
            result.tokens[out.request_id] = list(out.generated_tokens)
            result.logprobs[out.request_id] = list(out.logprobs)
    missing = sorted(set(prompts) - set(result.tokens))
    if missing:
        raise RuntimeError(f"transformers did not finish {missing} within {max_steps} steps")
    return result
