"""Environment record, measured ceilings and decode-step time against its floor.

The floor of a decode step follows the roofline: it must at least read every
weight and the KV of every sequence once and do its FLOPs, so
``floor = max(flops / peak_flops, bytes / peak_bandwidth)``.  Peaks are
measured here (one large matmul, one large copy) and, on known GPUs, also
taken from the datasheet.  Eager PyTorch on a small model is launch-bound,
hence the ``overhead_bound`` flag (achieved > 20 x floor).
"""

from __future__ import annotations

import math
import platform
import statistics
import subprocess
import time
from typing import Any, Callable

import torch

from .engine import paged_forward
from .model import DTYPES, PRESETS, Model
from .paged import KVCache, RowSpec, build_metadata

__all__ = ["DATASHEETS", "environment", "measure_ceilings", "decode_step_timing"]

# substring of the device name -> (dense bf16 FLOP/s, memory bytes/s); first match wins
DATASHEETS: tuple[tuple[str, float, float], ...] = (
    ("H200", 989e12, 4.8e12),
    ("H100 PCIe", 756e12, 2.0e12),
    ("H100", 989e12, 3.35e12),
)


def environment(device: str) -> dict[str, Any]:
    """Versions (torch, CUDA, cuDNN, driver), device name and TF32 state (which decides fp32 matmul
    precision on CUDA)."""
    env: dict[str, Any] = {
        "device": device,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "cpu_threads": torch.get_num_threads(),
    }
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        env.update({
            "device_name": props.name,
            "sm_count": props.multi_processor_count,
            "memory_gib": round(props.total_memory / 2**30, 1),
            "cuda": torch.version.cuda,
            "tf32_matmul": torch.backends.cuda.matmul.allow_tf32,
            "tf32_cudnn": torch.backends.cudnn.allow_tf32,
            "fp32_matmul_precision": getattr(torch.backends.cuda.matmul, "fp32_precision", None),
            "capability": ".".join(map(str, torch.cuda.get_device_capability(0))),
            "cudnn": torch.backends.cudnn.version(),
            "driver": _driver_version(),
        })
    else:
        env["device_name"] = platform.processor() or platform.machine()
    return env


def _driver_version() -> str | None:
    """The NVIDIA driver version from ``nvidia-smi`` (torch does not expose it); None if unavailable."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return out.strip().splitlines()[0] if out.strip() else None


def _median_seconds(fn: Callable[[], Any], device: str, iters: int, warmup: int) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        if device == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measure_ceilings(device: str) -> dict[str, Any]:
    """Measured matmul FLOP/s and copy bandwidth (read + write bytes), plus datasheet peaks."""
    cuda = device == "cuda"
    n, dtype = (8192, torch.bfloat16) if cuda else (1024, torch.float32)
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    mm = _median_seconds(lambda: a @ b, device, iters=10 if cuda else 3, warmup=2)
    src = torch.empty((2**30 if cuda else 2**26) // 4, device=device, dtype=torch.float32)
    dst = torch.empty_like(src)
    cp = _median_seconds(lambda: dst.copy_(src), device, iters=10 if cuda else 3, warmup=2)
    out: dict[str, Any] = {
        "matmul": f"{n}^3 {str(dtype).removeprefix('torch.')}",
        "matmul_flops": 2 * n**3 / mm,
        "copy_bytes_per_s": 2 * src.numel() * 4 / cp,
    }
    if cuda:
        name = torch.cuda.get_device_name(0)
        sheet = next(((f, bw) for key, f, bw in DATASHEETS if key in name), None)
        if sheet:
            out["datasheet_flops"], out["datasheet_bytes_per_s"] = sheet
    return out


def decode_step_timing(preset: str, batch: int, context: int, *, device: str, dtype: str,
                       ceilings: dict[str, Any], seed: int = 0, iters: int = 10) -> dict[str, Any]:
    """Median time of one decode step (``batch`` rows, each with ``context`` cached tokens).

    Weights are drawn on the device (``exact=False``): only the time matters.
    """
    cfg = PRESETS[preset]
    torch_dtype = DTYPES[dtype]
    model = Model.from_seed(cfg, seed, torch_dtype, device, exact=False)
    bs = cfg.block_size
    pages = -(-(context + 1) // bs)
    cache = KVCache(cfg.n_layers, 1 + batch * pages, bs, cfg.n_kv_heads, cfg.head_dim, torch_dtype, device,
                    poison=0.0)
    rows = [RowSpec(context, 1, tuple(range(1 + i * pages, 1 + (i + 1) * pages))) for i in range(batch)]
    meta = build_metadata(rows, bs, device)
    ids = torch.randint(0, cfg.vocab, (batch,), device=device)
    seconds = _median_seconds(lambda: paged_forward(model, cache, meta, ids), device, iters=iters, warmup=3)

    elt = torch.finfo(torch_dtype).bits // 8
    kv_row = cfg.n_layers * 2 * cfg.n_kv_heads * cfg.head_dim * elt      # bytes of one token's KV
    body = cfg.n_params - 2 * cfg.vocab * cfg.d_model                    # minus embedding and head
    head = cfg.vocab * cfg.d_model
    nbytes = elt * (body + head) + batch * (context + 1) * kv_row + batch * kv_row
    flops = 2 * (body + head) * batch + 4 * cfg.n_layers * cfg.n_heads * cfg.head_dim * batch * (context + 1)
    floor = max(flops / ceilings["matmul_flops"], nbytes / ceilings["copy_bytes_per_s"])
    out = {
        "preset": preset, "dtype": dtype, "batch": batch, "context": context,
        "achieved_ms": seconds * 1e3, "floor_ms": floor * 1e3, "floor_over_achieved": floor / seconds,
        "bytes": nbytes, "flops": flops, "achieved_gb_per_s": nbytes / seconds / 1e9,
        "achieved_tflops": flops / seconds / 1e12, "tokens_per_s": batch / seconds,
        "overhead_bound": seconds > 20 * floor,
    }
    if "datasheet_bytes_per_s" in ceilings:
        sheet = max(flops / ceilings["datasheet_flops"], nbytes / ceilings["datasheet_bytes_per_s"])
        out["datasheet_floor_ms"] = sheet * 1e3
    return {k: (round(v, 6) if isinstance(v, float) and math.isfinite(v) else v) for k, v in out.items()}
