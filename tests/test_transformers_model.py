"""The real model path of transformers' continuous batching: a tiny seeded Llama and a locally trained
tokenizer, the engine's own batch processor with its real forward, judged with the kit's invariance
verdict (pytest_cbatch.live.invariance): a request's greedy tokens must not depend on what it was
batched with, also when it was preempted and recomputed; logprobs are recorded as bitwise or drift.

Runs only where transformers and the adapter are installed (``.ci/transformers-job`` runs it).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("transformers", reason="transformers is not installed here: build its venv with "
                                           ".ci/transformers-venv and run .ci/transformers-job")
model_path = pytest.importorskip("cbatch_transformers.model_path", reason="the transformers adapter is not "
                                                                         "installed: pip install -e examples/transformers")

from pytest_cbatch.live.invariance import Run, verdict  # noqa: E402

TEXTS = {"t": "the scheduler admits requests in order", "f0": "pages of keys and values",
         "f1": "then recomputes them from their prompt while the cache holds pages",
         "f2": "blocks run out"}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, dict[str, list[int]]]:
    from transformers import AutoTokenizer

    directory = model_path.make_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=0)
    tokenizer = AutoTokenizer.from_pretrained(directory, local_files_only=True)
    prompts = {rid: tokenizer(text)["input_ids"] for rid, text in TEXTS.items()}
    return model_path.load_model(directory), prompts


def test_the_tiny_model_is_made_locally_and_the_same_seed_gives_the_same_files(tmp_path: Path) -> None:
    a = model_path.make_tiny_model(tmp_path / "a", seed=3)
    b = model_path.make_tiny_model(tmp_path / "b", seed=3)
    for name in ("model.safetensors", "tokenizer.json", "config.json"):
        assert (a / name).read_bytes() == (b / name).read_bytes(), name


@pytest.mark.parametrize("scheduler", ["fifo", "prefill_first"])
def test_greedy_tokens_do_not_depend_on_batch_companions_or_preemption(
        tiny: tuple[Any, dict[str, list[int]]], scheduler: str) -> None:
    model, prompts = tiny
    solo = {rid: model_path.generate(model, {rid: ids}, max_new_tokens=12, num_blocks=64, scheduler=scheduler)
            for rid, ids in prompts.items()}
    batched = model_path.generate(model, prompts, max_new_tokens=12, num_blocks=64, scheduler=scheduler)
    # 10 blocks of 4 tokens for four requests of up to 24 tokens: the pool runs dry and preempts
    tight = model_path.generate(model, prompts, max_new_tokens=12, num_blocks=10, max_batch_tokens=16,
                                scheduler=scheduler)
    assert tight.preempted, "the tight pool was meant to preempt and recompute at least one request"
    for run in (batched, tight):
        for rid in prompts:
            base = Run(solo[rid].tokens[rid], solo[rid].logprobs[rid])
            seen = verdict(base, Run(run.tokens[rid], run.logprobs[rid]))
            assert seen["verdict"] in ("bitwise", "drift"), (rid, rid in run.preempted, seen)
            assert len(run.tokens[rid]) == 12


def test_greedy_output_equals_model_generate(tiny: tuple[Any, dict[str, list[int]]]) -> None:
    import torch

    model, prompts = tiny
    ids = prompts["t"]
    out = model_path.generate(model, {"t": ids}, max_new_tokens=12, num_blocks=64)
    with torch.no_grad():
        reference = model.generate(torch.tensor([ids]), max_new_tokens=12, do_sample=False, eos_token_id=-1,
                                   attention_mask=torch.ones(1, len(ids), dtype=torch.long))
    assert out.tokens["t"] == reference[0, len(ids):].tolist()
