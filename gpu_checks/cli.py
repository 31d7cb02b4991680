"""``python -m gpu_checks`` / ``cbatch gpu``: every numeric check on the available device.

Runs, per dtype: attention-backend parity, the schedule checks on three
self-generated workloads (mixed, chunked, preemption), preemption vs none,
the bitwise batch-invariance mode with its negative control and the mutant
kill matrix; then decode-step timings against their roofline floor.  Prints a
table (check, dtype, metric, tolerance, verdict, time) and optionally writes
everything as JSON.  Exit status: 0 all passed, 1 a check failed, 2 bad usage.

Schedules come from :mod:`.schedules` (no scheduler implementation needed).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any, Callable, Sequence

__all__ = ["main", "build_parser"]

_DTYPES = ("float64", "float32", "bfloat16")
_QUICK_BUGS = ("cross_row_leak", "decode_position_off_by_one", "read_past_end", "stale_block_table")


def build_parser(prog: str | None = None) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description="Batched-vs-alone logits checks on a seeded transformer.")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                   help="auto: cuda when available, else cpu")
    p.add_argument("--dtype", action="append", choices=_DTYPES,
                   help="repeatable; default bfloat16+float32 on cuda, float64+float32 on cpu "
                        "(bfloat16 on cpu runs as float32)")
    p.add_argument("--preset", choices=("tiny", "gpu-small"), help="parity model; default gpu-small on cuda, tiny on cpu")
    p.add_argument("--json", metavar="PATH", help="write the full results here")
    p.add_argument("--quick", action="store_true", help="smaller workloads, 4 mutants, fewer timings")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1,
                   help="CPU threads for torch (default 1: the tiny model is latency-bound)")
    return p


def _workloads(block_size: int, max_len: int, quick: bool) -> list[tuple[str, list, dict, dict | None]]:
    """(name, trace, report, baseline report) triples from the built-in FCFS planner."""
    from .schedules import boundary_trace, fcfs_schedule

    bs = block_size
    n = 5 if quick else 10
    mixed = boundary_trace(n, bs, 2 * bs, max_len, seed=1)
    chunked = boundary_trace(n, bs, bs - 1, max_len, seed=2, gap=2)
    a, b, c = 3 * bs, bs + 1, 2 * bs - 1
    pre = [{"time": 0, "event": "arrival", "id": rid, "prompt_tokens": p, "output_tokens": o}
           for rid, p, o in (("a", a, bs), ("b", b, 2 * bs), ("c", c, bs // 2), ("d", 5, 3))]
    # "a" mid-prefill one token past a page boundary, and again right after its recompute;
    # "c" after its first decode, on a page boundary; "b" mid-decode
    script = [("a", 1), ("c", 2 * bs), ("b", b + 3), ("a", bs)]
    plan = {"token_budget": 3 * bs + 1, "prefill_chunk": 2 * bs, "max_active": 6, "block_size": bs}
    preempt_plan = {**plan, "prefill_chunk": bs + 1}
    return [
        ("mixed", mixed, fcfs_schedule(mixed, **plan), None),
        ("chunked", chunked, fcfs_schedule(chunked, **{**plan, "token_budget": bs + 1, "prefill_chunk": bs - 1}),
         None),
        ("preempt", pre, fcfs_schedule(pre, preempt=script, **preempt_plan), fcfs_schedule(pre, **preempt_plan)),
    ]


def _resolve(args: argparse.Namespace) -> tuple[str, list[str], list[str]]:
    import torch

    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("error: --device cuda but torch sees no CUDA device")
    notes = []
    dtypes = list(dict.fromkeys(args.dtype or (["bfloat16", "float32"] if device == "cuda" else
                                               ["float64", "float32"])))
    if device == "cpu" and "bfloat16" in dtypes:
        notes.append("bfloat16 asked on CPU: running float32 instead (bf16 parity is a GPU measurement)")
        dtypes = list(dict.fromkeys("float32" if d == "bfloat16" else d for d in dtypes))
    return device, dtypes, notes


def _guarded(name: str, dtype: str, device: str, fn: Callable[[], Any]) -> list[Any]:
    """``fn()``'s results, or one failed result naming the exception (a GPU session must go on)."""
    from .checks import CheckResult

    try:
        out = fn()
    except Exception as exc:  # recorded as a failure, never swallowed
        return [CheckResult(name=name, dtype=dtype, device=device, workload="", passed=False, mode="tolerance",
                            metric=f"error: {type(exc).__name__}: {exc}"[:300], tolerance="-")]
    return out if isinstance(out, list) else [out]


def _run_checks(device: str, dtypes: Sequence[str], preset: str, seed: int, quick: bool) -> list[Any]:
    from .checks import (mutant_kill_matrix, run_attention_parity, run_invariance_checks, run_preemption_check,
                         run_schedule_checks)
    from .engine import BUGS
    from .model import PRESETS

    bs = PRESETS[preset].block_size
    max_len = 5 * bs if preset == "tiny" else 16 * bs
    workloads = _workloads(bs, max_len, quick)
    results = []
    for i, dtype in enumerate(dtypes):
        common = {"dtype": dtype, "device": device, "preset": preset, "seed": seed}

        def run(name: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
            results.extend(_guarded(name, dtype, device, lambda: fn(*args, **kwargs, **common)))

        run("attention_parity", run_attention_parity)
        for name, trace, report, baseline in workloads:
            run(f"schedule_checks[{name}]", run_schedule_checks, trace, report, workload=name)
            if baseline is not None:
                run("preemption_vs_none", run_preemption_check, trace, report, baseline, workload=name)
        name, trace, report, _ = workloads[1]
        run("invariance_checks", run_invariance_checks, trace, report, workload=name)
        if not quick or i == 0:
            name, trace, report, _ = workloads[2]
            run("mutant_kill_matrix", mutant_kill_matrix, trace, report,
                bugs=_QUICK_BUGS if quick else tuple(BUGS), workload=name)
    return results


def _run_perf(device: str, quick: bool) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    from .perf import decode_step_timing, measure_ceilings

    ceilings = measure_ceilings(device)
    if device == "cuda":
        plan = [("gpu-small", 1), ("gpu-small", 64)] + ([] if quick else [("perf-1b", 1), ("perf-1b", 64)])
        dtype, context = "bfloat16", 1024
    else:
        plan = [("tiny", 8)] if quick else [("tiny", 1), ("tiny", 8)]
        dtype, context = "float32", 128
    timings = []
    for preset, batch in plan:
        try:
            timings.append(decode_step_timing(preset, batch, context, device=device, dtype=dtype,
                                              ceilings=ceilings, iters=5 if quick else 10))
        except Exception as exc:  # e.g. out of memory on a smaller GPU: record it, keep going
            timings.append({"preset": preset, "batch": batch, "context": context, "dtype": dtype,
                            "error": f"{type(exc).__name__}: {exc}"[:300]})
    return ceilings, timings


def _verdict(r: Any) -> str:
    if r.skipped:
        return "SKIP"
    if r.mode == "must_fail":
        return "CAUGHT" if r.passed else "MISSED"
    return "PASS" if r.passed else "FAIL"


def _table(results: Sequence[Any]) -> str:
    rows = [("check", "dtype", "metric", "tolerance", "verdict", "time")]
    for r in results:
        rows.append((f"{r.name}[{r.workload}]", r.dtype, r.skipped or r.metric, r.tolerance, _verdict(r),
                     f"{r.seconds:.2f}s"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None, prog: str | None = None) -> int:
    """Entry point of ``python -m gpu_checks`` and ``cbatch gpu``; returns the exit status."""
    args = build_parser(prog).parse_args(argv)
    try:
        import torch
    except ImportError:
        print("error: gpu_checks need torch: pip install 'pytest-cbatch[gpu]'", file=sys.stderr)
        return 2
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS for the bitwise checks
    start = time.perf_counter()
    device, dtypes, notes = _resolve(args)
    preset = args.preset or ("gpu-small" if device == "cuda" else "tiny")
    if device == "cpu":
        torch.set_num_threads(args.threads)
    else:
        # fp32 tolerances assume IEEE fp32 matmuls: TF32 off, recorded below
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False

    from .perf import environment

    env = environment(device)
    print(f"gpu_checks on {device} ({env['device_name']}), torch {env['torch']}"
          + (f", CUDA {env['cuda']}, TF32 matmul={env['tf32_matmul']} cudnn={env['tf32_cudnn']}"
             if device == "cuda" else f", {env['cpu_threads']} threads")
          + f"; preset {preset}, dtypes {', '.join(dtypes)}")
    for note in notes:
        print(f"note: {note}")
    document: dict[str, Any] = {
        "schema_version": 1,
        "settings": {"device": device, "dtypes": dtypes, "preset": preset, "seed": args.seed,
                     "quick": args.quick, "notes": notes},
        "environment": env,
    }
    results = _run_checks(device, dtypes, preset, args.seed, args.quick)
    passed = all(r.passed for r in results)
    document.update(passed=passed, results=[r.as_dict() for r in results])
    _write_json(args.json, document)   # early copy: the timings below can be cut short by a time limit
    print(_table(results))
    ceilings, timings = _run_perf(device, args.quick)
    for t in timings:
        head = f"decode step {t['preset']} {t['dtype']} batch {t['batch']} context {t['context']}"
        if "error" in t:
            print(f"{head}: {t['error']}")
            continue
        print(f"{head}: {t['achieved_ms']:.3f} ms, floor {t['floor_ms']:.4f} ms "
              f"(floor/achieved {t['floor_over_achieved']:.1%}){' overhead-bound' if t['overhead_bound'] else ''}")
    elapsed = time.perf_counter() - start
    print(f"{'PASSED' if passed else 'FAILED'}: {sum(r.passed for r in results)}/{len(results)} checks "
          f"in {elapsed:.1f}s")
    document.update(seconds=round(elapsed, 3), ceilings=ceilings, decode_steps=timings)
    _write_json(args.json, document)
    if args.json:
        print(f"results -> {args.json}")
    return 0 if passed else 1


def _write_json(path: str | None, document: dict[str, Any]) -> None:
    if path:
        with open(path, "w", encoding="utf-8") as fh:
            json.dump(document, fh, indent=2)
            fh.write("\n")
