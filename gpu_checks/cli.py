"""``python -m gpu_checks`` / ``cbatch gpu``: every numeric check on the available device.

Runs one profile (:mod:`.profiles`; ``--profile gpu`` is the default on CUDA,
``cpu`` elsewhere), per dtype: attention-kernel parity at normal and large
scores, the schedule checks on short and long-context workloads,
preemption vs none, the bitwise batch-invariance mode with its negative
control and the mutant kill matrix; then decode-step timings against their
roofline floor.  Prints a table (check, dtype, metric, tolerance, verdict,
time) and optionally writes everything as JSON.  ``--dry-run`` prints the
plan and its size estimate and runs nothing.  A stage that would start after
the profile's time budget is recorded as not run (and fails the run), so a
time-limited GPU session always ends with its JSON written.  Exit status: 0
all passed, 1 a check failed or was not run, 2 bad usage.

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


def build_parser(prog: str | None = None) -> argparse.ArgumentParser:
    """The command's options (``prog``: ``python -m gpu_checks`` or ``cbatch gpu``)."""
    p = argparse.ArgumentParser(
        prog=prog, description="Batched-vs-alone logits checks on a seeded transformer with a paged KV cache: "
                               "attention kernels, the schedule checks on short, long-context and boundary "
                               "workloads, preemption, batch invariance, the mutant kill matrix, decode timings.",
        epilog="Exit status: 0 every check passed, 1 a check failed or was not run, 2 bad usage or no torch. "
               "Needs torch, except for --help and --dry-run.")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                   help="where to run (default: auto = cuda when torch sees a CUDA device, else cpu)")
    p.add_argument("--dtype", action="append", choices=_DTYPES,
                   help="dtype to check, repeatable (default: the profile's: bfloat16 + float32 for gpu, "
                        "float64 + float32 for cpu; bfloat16 on cpu runs as float32)")
    p.add_argument("--profile", choices=("cpu", "gpu"),
                   help="what to run and at which sizes (default: gpu on cuda, cpu otherwise)")
    p.add_argument("--json", metavar="PATH", help="write every result, the environment and the timings here "
                                                  "(default: no file)")
    p.add_argument("--quick", action="store_true",
                   help="smaller workloads, 4 short-workload mutants, no long-context kill matrices and "
                        "no regime stages (bounds, partition leads, long-preemption page reuse), 2 timings "
                        "(default: off)")
    p.add_argument("--dry-run", action="store_true",
                   help="print the plan and its size estimate (steps, positions, GiB, seconds); run nothing "
                        "(default: off; works without torch)")
    p.add_argument("--budget", type=float, metavar="SECONDS",
                   help="start no stage after this many seconds of wall time, keeping the timings' reserve "
                        "(default: the profile's, 360 s for gpu, 600 s for cpu)")
    p.add_argument("--seed", type=int, default=0, help="seed of the weights and token streams (default: 0)")
    p.add_argument("--threads", type=int, default=1,
                   help="CPU threads for torch's timings on cpu (default: 1; the small models are latency-bound); "
                        "the checks always compute on one thread, so their figures are the same on every machine")
    return p


def _torch_cuda() -> bool | None:
    """Whether torch sees a CUDA device; None when torch is not installed."""
    try:
        import torch
    except ImportError:
        return None
    return bool(torch.cuda.is_available())


def _resolve(args: argparse.Namespace, profile_dtypes: Callable[[str], Sequence[str]]) -> tuple[str, list[str],
                                                                                             list[str]]:
    """(device, dtypes, notes); ``profile_dtypes(device)`` gives the default dtypes on ``device``."""
    cuda = _torch_cuda()
    notes = []
    device = args.device
    if device == "auto":
        device = "cuda" if cuda else "cpu"
        if cuda is None:
            notes.append("torch is not installed: --device auto plans for cpu")
    if device == "cuda" and not cuda and not args.dry_run:
        raise SystemExit("error: --device cuda but torch sees no CUDA device")
    dtypes = list(dict.fromkeys(args.dtype or profile_dtypes(device)))
    if device == "cpu" and "bfloat16" in dtypes and not args.dry_run:
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


def _stage_call(stage: Any, built: Any, common: dict[str, Any]) -> tuple[str, Callable[[], Any]]:
    """(label, thunk) running one stage of the plan."""
    from .attention import run_attention_parity
    from .checks import mutant_kill_matrix, run_invariance_checks, run_preemption_check, run_schedule_checks

    if stage.kind == "attention":
        name = "attention_large_scores" if stage.q_gain != 1.0 else "attention_parity"
        return name, lambda: run_attention_parity(preset=stage.preset, q_gain=stage.q_gain,
                                                  magnitude=stage.magnitude, **common)
    trace, report, baseline, bs = built.workloads[stage.workload]
    kw = {**common, "preset": stage.preset, "block_size": bs, "workload": stage.workload}
    if stage.kind == "schedule":
        checks = {"checks": stage.checks} if stage.checks else {}
        return f"schedule_checks[{stage.workload}]", lambda: run_schedule_checks(trace, report, **checks, **kw)
    if stage.kind == "preemption":
        return "preemption_vs_none", lambda: run_preemption_check(trace, report, baseline, **kw)
    if stage.kind == "invariance":
        return "invariance_checks", lambda: run_invariance_checks(trace, report, **kw)
    checks = {"checks": stage.checks} if stage.checks else {}
    return "mutant_kill_matrix", lambda: mutant_kill_matrix(trace, report, bugs=stage.bugs, **checks, **kw)


def _run_checks(built: Any, device: str, dtypes: Sequence[str], seed: int, deadline: float) -> list[Any]:
    from .checks import CheckResult

    results: list[Any] = []
    for dtype in dtypes:
        for stage in built.stages:
            if dtype not in stage.runs_in(tuple(dtypes)):
                continue
            name, thunk = _stage_call(stage, built, {"dtype": dtype, "device": device, "seed": seed})
            if time.perf_counter() > deadline:
                results.append(CheckResult(name=name, dtype=dtype, device=device, workload=stage.workload,
                                           passed=False, mode="not_run", metric="not run: time budget spent",
                                           tolerance="-"))
                continue
            results.extend(_guarded(name, dtype, device, thunk))
    return results


def _run_perf(device: str, built: Any, quick: bool, deadline: float) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    from .perf import decode_step_timing, measure_ceilings

    ceilings = measure_ceilings(device)
    plan = built.profile.timings[:2] if quick else built.profile.timings
    dtype = built.profile.timing_dtype
    timings = []
    for preset, batch, context in plan:
        head = {"preset": preset, "batch": batch, "context": context, "dtype": dtype}
        if time.perf_counter() > deadline:
            timings.append({**head, "error": "not run: time budget spent"})
            continue
        try:
            timings.append(decode_step_timing(preset, batch, context, device=device, dtype=dtype,
                                              ceilings=ceilings, iters=5 if quick else 10))
        except Exception as exc:  # e.g. out of memory on a smaller GPU: record it, keep going
            timings.append({**head, "error": f"{type(exc).__name__}: {exc}"[:300]})
    return ceilings, timings


def _verdict(r: Any) -> str:
    if r.mode == "not_run":
        return "NOT RUN"
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


def _dry_run(built: Any, dtypes: Sequence[str]) -> int:
    from .profiles import estimate

    size = estimate(built, tuple(dtypes))
    print(f"profile {built.profile.name}: {len(built.stages)} stages x dtypes {', '.join(dtypes)}")
    for stage in built.stages:
        what = stage.bugs or stage.checks or (
            (f"q_gain {stage.q_gain:g}",) if stage.kind == "attention" else (f"all {stage.kind} checks",))
        only = f" [{', '.join(stage.dtypes)} only]" if stage.dtypes else ""
        print(f"  {stage.kind:<10} {stage.workload or '-':<13} {stage.preset:<13} {', '.join(what)}{only}")
    for name, (trace, report, _, bs) in sorted(built.workloads.items()):
        lens = [line["prompt_tokens"] for line in trace if line["event"] == "arrival"]
        steps = sum(1 for e in report["events"] if e.get("event") == "dispatch")
        print(f"  workload {name}: {len(lens)} requests, longest prompt {max(lens)}, {steps} steps, page {bs}")
    for preset, batch, context in built.profile.timings:
        print(f"  decode timing {preset} batch {batch} context {context} {built.profile.timing_dtype}")
    print(f"estimate: {size['engine_steps']} engine steps, {size['positions']} positions, "
          f"float64 oracle {size['oracle_tflop']} TFLOP, peak memory {size['peak_gib']} GiB, "
          f"about {size['estimated_seconds']} s (budget {size['budget_s']:g} s)")
    return 0


def main(argv: Sequence[str] | None = None, prog: str | None = None) -> int:
    """Entry point of ``python -m gpu_checks`` and ``cbatch gpu``; returns the exit status."""
    args = build_parser(prog).parse_args(argv)
    from .profiles import PROFILES, build

    start = time.perf_counter()

    def profile_of(device: str) -> Any:
        return PROFILES[args.profile or ("gpu" if device == "cuda" else "cpu")]

    device, dtypes, notes = _resolve(args, lambda d: profile_of(d).dtypes)
    profile = profile_of(device)
    built = build(profile, quick=args.quick)
    if args.dry_run:
        for note in notes:
            print(f"note: {note}")
        return _dry_run(built, dtypes)
    try:
        import torch
    except ImportError:
        print("error: gpu_checks need torch: pip install 'pytest-cbatch[gpu]'", file=sys.stderr)
        return 2
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS for the bitwise checks
    end = start + (args.budget if args.budget is not None else profile.budget_s)
    checks_deadline = end - profile.checks_reserve_s()
    if device == "cpu":
        torch.set_num_threads(args.threads)
    else:
        # fp32 tolerances assume IEEE fp32 matmuls: TF32 off, recorded below
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False

    from .perf import environment

    env = environment(device)
    print(f"gpu_checks on {device} ({env['device_name']}), torch {env['torch']}"
          + (f", CUDA {env['cuda']}, driver {env.get('driver')}, TF32 matmul={env['tf32_matmul']} "
             f"cudnn={env['tf32_cudnn']}" if device == "cuda" else f", {env['cpu_threads']} threads")
          + f"; profile {profile.name}, dtypes {', '.join(dtypes)}")
    for note in notes:
        print(f"note: {note}")
    document: dict[str, Any] = {
        "schema_version": 1,
        "settings": {"device": device, "dtypes": dtypes, "profile": profile.name, "preset": profile.preset,
                     "seed": args.seed, "quick": args.quick, "budget_s": round(end - start, 3),
                     "notes": notes},
        "environment": env,
    }
    results = _run_checks(built, device, dtypes, args.seed, checks_deadline)
    passed = all(r.passed for r in results)
    document.update(passed=passed, results=[r.as_dict() for r in results])
    _write_json(args.json, document)   # early copy: the timings below can be cut short by a time limit
    print(_table(results))
    ceilings, timings = _run_perf(device, built, args.quick, end)
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
