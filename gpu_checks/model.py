"""A small Llama-style decoder in plain torch with weights drawn from a seed.

Architecture: token embedding -> L x [RMSNorm -> fused QKV (grouped-query) ->
RoPE (neox, driven only by a ``positions`` tensor) -> attention -> output
projection -> residual -> RMSNorm -> SwiGLU -> residual] -> RMSNorm -> untied
LM head.  Attention is not part of the model: :meth:`Model.forward` calls an
``attend(layer, q, k, v)`` hook, so the dense oracle and the paged engine run
the very same weights and elementwise code and differ only in attention.

Weights are drawn in float64 from a seeded CPU ``torch.Generator`` and then
cast and moved, so CPU and GPU runs hold identical weights (up to the cast).
"""

from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn.functional as F

from .presets import PRESETS, ModelConfig

__all__ = ["ModelConfig", "PRESETS", "Model", "AttendFn", "apply_rope", "DTYPES"]

DTYPES: dict[str, torch.dtype] = {
    "float64": torch.float64,
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
}

AttendFn = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
"""``attend(layer, q [T,H,hd], k [T,KV,hd], v [T,KV,hd]) -> [T,H,hd]``; q and k already rotated."""


def _rope_tables(positions: torch.Tensor, head_dim: int, theta: float,
                 dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    # angles in float64 from the integer positions, so a position's rotation
    # never depends on the batch it is in
    inv_freq = theta ** (-torch.arange(0, head_dim, 2, dtype=torch.float64, device=positions.device) / head_dim)
    angles = positions.to(torch.float64)[:, None] * inv_freq[None, :]
    return angles.cos().to(dtype)[:, None, :], angles.sin().to(dtype)[:, None, :]


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


def apply_rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotate ``x [T, heads, hd]`` by the neox RoPE angles of ``positions [T]``.

    Angles are computed in float64 and cast to ``x.dtype``.
    """
    return _rotate(x, *_rope_tables(positions, x.shape[-1], theta, x.dtype))


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.to(_compute_dtype(x.dtype))
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (xf * weight.to(xf.dtype)).to(x.dtype)


def _linear(x: torch.Tensor, weight: torch.Tensor, splitk: bool) -> torch.Tensor:
    # split-K: same math as one GEMM, other rounding; the engine picks it by
    # batch size to build a deliberately batch-variant negative control.
    if splitk:
        parts = torch.chunk(torch.arange(x.shape[1], device=x.device), 4)
        out = F.linear(x[:, parts[0]], weight[:, parts[0]])
        for idx in parts[1:]:
            out = out + F.linear(x[:, idx], weight[:, idx])
        return out
    return F.linear(x, weight)


class Model:
    """Seeded decoder weights plus the forward pass around an attention hook.

    Build with :meth:`from_seed`.  ``checksum`` is the float64 sum of every
    parameter as drawn (before the cast), recorded in reports.
    """

    def __init__(self, config: ModelConfig, params: dict[str, torch.Tensor], checksum: float) -> None:
        self.config = config
        self.params = params
        self.checksum = checksum
        self.dtype = params["embed"].dtype
        self.device = params["embed"].device

    @classmethod
    def from_seed(
        cls,
        config: ModelConfig,
        seed: int,
        dtype: torch.dtype,
        device: str | torch.device = "cpu",
        *,
        exact: bool = True,
    ) -> "Model":
        """Draw the weights.

        ``exact=True`` draws every tensor in float64 from a CPU generator seeded
        with ``seed`` (identical weights on every device).  ``exact=False``
        draws directly on ``device`` in ``dtype``; only for timing runs of big
        presets, whose numbers are never compared.
        """
        c = config
        if exact:
            gen = torch.Generator().manual_seed(seed)
            draw_dtype, draw_device = torch.float64, "cpu"
        else:
            gen = torch.Generator(device=device).manual_seed(seed)
            draw_dtype, draw_device = dtype, device
        total = 0.0

        def normal(shape: tuple[int, ...], std: float, mean: float = 0.0) -> torch.Tensor:
            nonlocal total
            t = torch.randn(shape, generator=gen, dtype=draw_dtype, device=draw_device) * std + mean
            if exact:
                total += float(t.sum())
            return t.to(dtype=dtype, device=device)

        qkv_rows = (c.n_heads + 2 * c.n_kv_heads) * c.head_dim
        params = {"embed": normal((c.vocab, c.d_model), 1.0)}
        for i in range(c.n_layers):
            params[f"{i}.attn_norm"] = normal((c.d_model,), 0.1, 1.0)
            params[f"{i}.qkv"] = normal((qkv_rows, c.d_model), c.d_model ** -0.5)
            params[f"{i}.out"] = normal((c.d_model, c.n_heads * c.head_dim), (c.n_heads * c.head_dim) ** -0.5)
            params[f"{i}.mlp_norm"] = normal((c.d_model,), 0.1, 1.0)
            params[f"{i}.gate_up"] = normal((2 * c.ffn_dim, c.d_model), c.d_model ** -0.5)
            params[f"{i}.down"] = normal((c.d_model, c.ffn_dim), c.ffn_dim ** -0.5)
        if c.q_gain != 1.0:
            for i in range(c.n_layers):
                params[f"{i}.qkv"][: c.n_heads * c.head_dim] *= c.q_gain
        params["final_norm"] = normal((c.d_model,), 0.1, 1.0)
        # head std 4/sqrt(d): logits have std ~4, decisive margins but real near-ties.
        params["head"] = normal((c.vocab, c.d_model), 4.0 * c.d_model ** -0.5)
        return cls(config, params, total if exact else math.nan)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        attend: AttendFn,
        *,
        splitk: bool = False,
    ) -> torch.Tensor:
        """Logits ``[T, vocab]`` (model dtype) for a flat batch of ``T`` tokens.

        ``positions [T]`` drives RoPE and nothing else; the causal structure
        is entirely ``attend``'s business.  ``splitk`` computes every linear
        layer as a sum of four K-slices (used by the batch-variant negative control).
        """
        c, p = self.config, self.params
        T = input_ids.shape[0]
        q_width, kv_width = c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim
        h = p["embed"][input_ids]
        cos, sin = _rope_tables(positions, c.head_dim, c.rope_theta, self.dtype)
        key_gain = None
        if c.key_gains != (1.0, 1.0):
            gains = torch.tensor(c.key_gains, dtype=self.dtype, device=positions.device)
            key_gain = gains[(positions >= c.key_split).long()][:, None, None]
        for i in range(c.n_layers):
            x = _rms_norm(h, p[f"{i}.attn_norm"], c.norm_eps)
            q, k, v = _linear(x, p[f"{i}.qkv"], splitk).split((q_width, kv_width, kv_width), dim=-1)
            q = _rotate(q.reshape(T, c.n_heads, c.head_dim), cos, sin)
            k = _rotate(k.reshape(T, c.n_kv_heads, c.head_dim), cos, sin)
            if key_gain is not None:
                k = k * key_gain
            attn = attend(i, q, k, v.reshape(T, c.n_kv_heads, c.head_dim))
            h = h + _linear(attn.reshape(T, q_width), p[f"{i}.out"], splitk)
            x = _rms_norm(h, p[f"{i}.mlp_norm"], c.norm_eps)
            gate, up = _linear(x, p[f"{i}.gate_up"], splitk).chunk(2, dim=-1)
            h = h + _linear(F.silu(gate) * up, p[f"{i}.down"], splitk)
        return _linear(_rms_norm(h, p["final_norm"], c.norm_eps), p["head"], splitk)
