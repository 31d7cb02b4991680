"""The seeded decoder: presets, deterministic weights, RoPE, the dense oracle."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="gpu_checks need torch")

from pytest_cbatch.gpu_checks.model import PRESETS, Model, ModelConfig, apply_rope  # noqa: E402
from pytest_cbatch.gpu_checks.oracle import dense_attention, dense_records  # noqa: E402
from pytest_cbatch.gpu_checks.streams import Streams  # noqa: E402


@pytest.mark.parametrize("preset,low,high", [("tiny", 3.0e6, 3.5e6), ("gpu-small", 0.9e8, 1.1e8),
                                             ("perf-1b", 1.0e9, 1.2e9)])
def test_preset_sizes(preset: str, low: float, high: float) -> None:
    assert low < PRESETS[preset].n_params < high


def test_config_rejects_bad_shapes() -> None:
    with pytest.raises(ValueError):
        ModelConfig(vocab=8, d_model=8, n_layers=1, n_heads=3, n_kv_heads=2, head_dim=4, ffn_dim=8)
    with pytest.raises(ValueError):
        ModelConfig(vocab=8, d_model=8, n_layers=1, n_heads=2, n_kv_heads=1, head_dim=3, ffn_dim=8)


def test_weights_depend_only_on_the_seed() -> None:
    cfg = PRESETS["tiny"]
    a = Model.from_seed(cfg, 3, torch.float64)
    b = Model.from_seed(cfg, 3, torch.float64)
    c = Model.from_seed(cfg, 4, torch.float64)
    low = Model.from_seed(cfg, 3, torch.float32)
    assert a.checksum == b.checksum == low.checksum != c.checksum
    assert all(torch.equal(a.params[k], b.params[k]) for k in a.params)
    assert torch.equal(low.params["head"], a.params["head"].float())


def test_rope_scores_depend_on_relative_position_only() -> None:
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, 2, 32, generator=g, dtype=torch.float64), torch.randn(1, 2, 32, generator=g,
                                                                               dtype=torch.float64)

    def score(pq: int, pk: int) -> torch.Tensor:
        return (apply_rope(q, torch.tensor([pq]), 1e4) * apply_rope(k, torch.tensor([pk]), 1e4)).sum(-1)

    assert torch.allclose(score(7, 3), score(107, 103), atol=1e-12)
    assert not torch.allclose(score(7, 3), score(7, 4), atol=1e-3)


def test_dense_attention_is_causal() -> None:
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(5, 4, 8, generator=g, dtype=torch.float64) for _ in range(3))
    k, v = k[:, :2], v[:, :2]
    full = dense_attention(0, q, k, v)
    prefix = dense_attention(0, q[:3], k[:3], v[:3])
    assert torch.allclose(full[:3], prefix, atol=1e-14)


def test_logits_scale_and_oracle_shape() -> None:
    model = Model.from_seed(PRESETS["tiny"], 0, torch.float64)
    streams = Streams.from_trace([{"time": 0, "event": "arrival", "id": "x", "prompt_tokens": 20,
                                   "output_tokens": 5}], model.config.vocab, seed=0)
    rec = dense_records(model, streams, ["x"])
    assert rec.logits.shape == (24, 512) and rec.position == list(range(24))
    assert 3.0 < float(rec.logits.std()) < 5.0  # designed for std ~4: decisive margins, real near-ties


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cpu_and_cuda_hold_identical_weights() -> None:
    cpu = Model.from_seed(PRESETS["tiny"], 0, torch.bfloat16)
    gpu = Model.from_seed(PRESETS["tiny"], 0, torch.bfloat16, "cuda")
    assert all(torch.equal(cpu.params[k], gpu.params[k].cpu()) for k in cpu.params)
