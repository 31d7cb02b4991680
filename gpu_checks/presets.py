"""Model shapes (``ModelConfig``) and the named presets (``PRESETS``); no torch needed."""

from __future__ import annotations

from dataclasses import dataclass, replace

from .sizes import SPLIT_KV_PARTITION

__all__ = ["ModelConfig", "PRESETS", "LEAD_KEY_GAIN"]

LEAD_KEY_GAIN = 0.125
"""Key gain of the quiet side of the ``*-hot-late``/``*-hot-early`` presets (a power of two: exact in every
dtype).  At ``q_gain = 32`` the loud side's scores peak near 130-170, the quiet side's near 20: a lead
above 100 at some decode, past float32's 88.7 and far below float64's 709."""


@dataclass(frozen=True)
class ModelConfig:
    """Shape of the decoder.  ``block_size`` is the default KV page size for engines.

    ``q_gain`` multiplies the query rows of every QKV weight after drawing
    (the same random numbers, so attention scores scale by exactly ``q_gain``
    when it is a power of two): it pushes scores into the range where a naive
    ``exp`` overflows in float32 and bfloat16 (scores above ~88.7).
    ``key_gains = (before, after)`` multiplies every key at a position below
    ``key_split`` by ``before`` and every later key by ``after`` (after RoPE,
    in the model, so the dense oracle and the engine see the same keys): with
    ``key_split`` at a split-KV partition boundary it makes one partition's
    maximum score lead the others' by a chosen factor.
    """

    vocab: int
    d_model: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    ffn_dim: int
    block_size: int = 16
    rope_theta: float = 1e4
    norm_eps: float = 1e-5
    q_gain: float = 1.0
    key_split: int = 0
    key_gains: tuple[float, float] = (1.0, 1.0)

    def __post_init__(self) -> None:
        if self.n_heads % self.n_kv_heads:
            raise ValueError("n_heads must be a multiple of n_kv_heads")
        if self.head_dim % 2:
            raise ValueError("head_dim must be even for RoPE")

    @property
    def n_params(self) -> int:
        """Parameter count (embedding, body, norms and head)."""
        qkv = (self.n_heads + 2 * self.n_kv_heads) * self.head_dim * self.d_model
        out = self.n_heads * self.head_dim * self.d_model
        mlp = 3 * self.d_model * self.ffn_dim
        body = self.n_layers * (qkv + out + mlp + 2 * self.d_model)
        return 2 * self.vocab * self.d_model + body + self.d_model


def _leads(hot: ModelConfig) -> dict[str, ModelConfig]:
    """The ``late`` (keys past the first partition loud) and ``early`` (first partition loud) twins."""
    quiet = LEAD_KEY_GAIN
    return {"late": replace(hot, key_split=SPLIT_KV_PARTITION, key_gains=(quiet, 1.0)),
            "early": replace(hot, key_split=SPLIT_KV_PARTITION, key_gains=(1.0, quiet))}


_TINY = ModelConfig(vocab=512, d_model=256, n_layers=4, n_heads=8, n_kv_heads=2, head_dim=32, ffn_dim=704)
_GPU_SMALL = ModelConfig(vocab=4096, d_model=1024, n_layers=8, n_heads=16, n_kv_heads=4, head_dim=64, ffn_dim=2816)
_NARROW = ModelConfig(vocab=256, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16, ffn_dim=176)

PRESETS: dict[str, ModelConfig] = {
    # CI on CPU (fp64/fp32), ~3.2 M parameters.
    "tiny": _TINY,
    # parity on H100/H200 (bf16 + fp32), ~99 M parameters.
    "gpu-small": _GPU_SMALL,
    # the same weights with queries x32, for large scores on the GPU.
    "gpu-small-hot": replace(_GPU_SMALL, q_gain=32.0),
    # timing only, ~1.1 B parameters (2.2 GB in bf16).
    "perf-1b": ModelConfig(vocab=32000, d_model=2048, n_layers=16, n_heads=32, n_kv_heads=8, head_dim=64,
                           ffn_dim=8192),
    # long contexts on CPU (1,000+ positions, 70+ pages in seconds), ~0.1 M parameters.
    "narrow": _NARROW,
    # the same weights with queries x32: attention scores past the float32 overflow range of a naive exp.
    "narrow-hot": replace(_NARROW, q_gain=32.0),
    # hot, and the keys of one side of the first split-KV partition boundary x1/8: a later partition's max
    # leads the first's by > 100 (late), or the first leads the later ones by > 100 (early).
    **{f"narrow-hot-{side}": cfg for side, cfg in _leads(replace(_NARROW, q_gain=32.0)).items()},
}
