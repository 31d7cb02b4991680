"""A tiny Llama made on the spot, for serving with vLLM's own OpenAI server offline.

:func:`make_tiny_model` writes a directory ``vllm serve`` (or
``python -m vllm.entrypoints.openai.api_server --model DIR``) loads without any
download: a seeded, randomly initialised ``LlamaForCausalLM`` in float32
(hidden 128, intermediate 256, 2 layers, 4 heads, 2 KV heads,
``max_position_embeddings`` 32768) saved as safetensors (about 2.2 MB), its
``generation_config.json``, and a byte-level BPE tokenizer of vocabulary 1024
trained with ``tokenizers`` on seeded generated text and saved through
``PreTrainedTokenizerFast`` with ``<s>`` (bos), ``</s>`` (eos) and ``<pad>``.

Same seed, same files: the training text, the BPE merges and the weights all
derive from ``seed`` alone.  The weights are random, so the text it generates
is noise; what it serves is real vLLM scheduling, batching, streaming and
numerics.  transformers, tokenizers and torch come with vLLM.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

__all__ = ["TINY_LLAMA", "VOCAB_SIZE", "SPECIAL_TOKENS", "make_tiny_model"]

VOCAB_SIZE = 1024
SPECIAL_TOKENS = {"bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>"}
# The architecture; token ids of the special tokens are added from the tokenizer.
TINY_LLAMA = {
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    # Rotary positions have no weights, so a long context costs nothing; the abort check
    # serves it with --max-model-len 32768, for streams that cannot finish while it watches.
    "max_position_embeddings": 32768,
    "vocab_size": VOCAB_SIZE,
}
_WORDS = ("the", "a", "request", "token", "batch", "page", "cache", "queue", "prefill", "decode", "stream",
          "server", "model", "step", "block", "run", "wait", "free", "send", "read", "and", "of", "to", "in")


def _training_text(seed: int, lines: int = 2000) -> list[str]:
    """Seeded text shaped like the kit's prompts (three-digit integer words) and plain words."""
    rng = random.Random(f"tiny-model/{seed}")
    out = []
    for _ in range(lines):
        words = [str(rng.randrange(100, 1000)) if rng.random() < 0.6 else rng.choice(_WORDS)
                 for _ in range(rng.randrange(4, 24))]
        out.append(" ".join(words))
    return out


def _tokenizer(seed: int) -> Any:
    """The seeded byte-level BPE, as a transformers PreTrainedTokenizerFast."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, special_tokens=list(SPECIAL_TOKENS.values()),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    bpe.train_from_iterator(_training_text(seed), trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=bpe, **SPECIAL_TOKENS)


def make_tiny_model(directory: str | Path, seed: int = 0) -> Path:
    """Write the tiny model and tokenizer into ``directory`` (created if missing) and return its path.

    Deterministic in ``seed``.  Needs torch, transformers and tokenizers
    (all installed with vLLM); reads nothing from the network.
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    tokenizer = _tokenizer(seed)
    if len(tokenizer) != VOCAB_SIZE:
        raise RuntimeError(f"the BPE trainer made a vocabulary of {len(tokenizer)}, expected {VOCAB_SIZE}: "
                           f"the training text is too small for that many merges")
    tokenizer.save_pretrained(path)
    config = LlamaConfig(**TINY_LLAMA, bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id, torch_dtype="float32", tie_word_embeddings=False)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).to(torch.float32)
    model.save_pretrained(path, safe_serialization=True)
    if not (path / "generation_config.json").exists():
        model.generation_config.save_pretrained(path)
    return path


def main(argv: list[str] | None = None) -> int:
    """``python -m cbatch_vllm.tiny_model DIR [--seed N]``: write the model and print its directory."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m cbatch_vllm.tiny_model", description=__doc__.split("\n")[0])
    parser.add_argument("directory")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    print(make_tiny_model(args.directory, args.seed))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
