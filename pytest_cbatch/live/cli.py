"""``cbatch serve``, ``cbatch load`` and ``cbatch invariance`` (exit 2 on bad input or an unusable server)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Sequence

from . import LiveError, MissingExtra

__all__ = ["serve_main", "load_main", "invariance_main"]


def _server_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--base-url", help="http://HOST:PORT[/v1] (default: from --host and --port)")
    parser.add_argument("--host", default="127.0.0.1", help="server host (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000, help="server port (default 8000)")
    parser.add_argument("--model", help="model id, as the server knows it (default: the one /v1/models lists; "
                                         "needed when it lists none or several)")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds per request (default 60)")
    parser.add_argument("--seed", type=int, default=0, help="prompt seed (default 0)")


def _base_url(args: argparse.Namespace) -> str:
    return args.base_url or f"http://{args.host}:{args.port}"


def _length_args(parser: argparse.ArgumentParser, *, input_len: int, output_len: int = 16) -> None:
    parser.add_argument("--input-len", type=int, default=input_len, metavar="WORDS",
                        help=f"prompt length per request, in words (default {input_len})")
    parser.add_argument("--output-len", type=int, default=output_len, metavar="TOKENS",
                        help=f"max_tokens per request (default {output_len})")


def serve_main(argv: Sequence[str]) -> int:
    """``cbatch serve``: the embedded OpenAI-compatible server, until interrupted."""
    from ..reference.scheduler_sim import CONFIG_CHOICES
    from .backends import BACKENDS
    from .sampling import NUMERICS
    from .engine import SERVE_DEFAULTS

    parser = argparse.ArgumentParser(prog="cbatch serve", description="Serve the reference scheduler over "
                                     "OpenAI-compatible HTTP (completions, chat, models, health, metrics).")
    parser.add_argument("--host", default="127.0.0.1", help="default 127.0.0.1 (loopback only)")
    parser.add_argument("--port", type=int, default=8000, help="default 8000; 0 picks a free port")
    parser.add_argument("--tick-ms", type=float, default=10.0,
                        help="wall-clock length of one tick, in milliseconds (default 10)")
    parser.add_argument("--backend", choices=BACKENDS, default="synthetic", help="default synthetic")
    parser.add_argument("--numerics", choices=NUMERICS, default="batch_invariant",
                        help="tiny backend only (default batch_invariant)")
    parser.add_argument("--seed", type=int, default=0, help="model weights seed (tiny backend)")
    parser.add_argument("--model", help="the model id to serve (default from the backend)")
    for name in ("capacity", "block_size", "token_budget", "max_active", "prefill_chunk", "release_delay"):
        parser.add_argument("--" + name.replace("_", "-"), dest=name, type=int, metavar="N",
                            default=SERVE_DEFAULTS[name], help=f"default {SERVE_DEFAULTS[name]}")
    parser.add_argument("--policy", choices=CONFIG_CHOICES["policy"], default=SERVE_DEFAULTS["policy"],
                        help=f"default {SERVE_DEFAULTS['policy']}")
    parser.add_argument("--admission", choices=CONFIG_CHOICES["admission"], default=SERVE_DEFAULTS["admission"],
                        help=f"default {SERVE_DEFAULTS['admission']}")
    args = parser.parse_args(list(argv))
    if args.tick_ms < 0:
        parser.error("--tick-ms must be nonnegative")
    config = {k: getattr(args, k) for k in SERVE_DEFAULTS}
    try:
        from .server import create_server, serve_forever

        server = create_server(backend=args.backend, numerics=args.numerics, tick_ms=args.tick_ms,
                               seed=args.seed, model=args.model, **config)
    except (ValueError, MissingExtra) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2

    def ready(port: int) -> None:
        print(f"cbatch serve: {server.model} ({args.backend}) on http://{args.host}:{port}/v1, tick "
              f"{args.tick_ms:g} ms, {json.dumps(config)}", flush=True)

    try:
        serve_forever(server, args.host, args.port, on_ready=ready)
    except OSError as exc:
        print(f"error: cannot listen on {args.host}:{args.port}: {exc}", file=sys.stderr)
        return 2
    return 0


def _slo(items: Sequence[str] | None) -> dict[str, float] | None:
    if not items:
        return None
    out = {}
    for item in items:
        name, _, value = item.partition(":")
        if name not in ("ttft", "tpot", "e2el"):
            raise ValueError(f"--goodput {item!r}: expected ttft:MS, tpot:MS or e2el:MS")
        out[name] = float(value)
    return out


def load_main(argv: Sequence[str]) -> int:
    """``cbatch load``: the load sweep; exit 0 when it ran, 2 on bad input or an unusable server."""
    from .load import LoadOptions, format_table, run_sweep

    parser = argparse.ArgumentParser(prog="cbatch load", description="Closed- or open-loop load sweep with vLLM "
                                     "bench serve's metric definitions.")
    _server_args(parser)
    levels = parser.add_mutually_exclusive_group()
    levels.add_argument("--concurrency", type=int, nargs="+", metavar="N",
                        help="closed loop: requests held in flight, one level per value (default 1 2 4 8)")
    levels.add_argument("--request-rate", type=float, nargs="+", metavar="RPS",
                        help="open loop: arrivals per second, one level per value (inf: all at once)")
    parser.add_argument("--burstiness", type=float, default=1.0,
                        help="gamma shape of open-loop gaps (default 1: Poisson)")
    parser.add_argument("--max-concurrency", type=int, metavar="N",
                        help="open loop: at most this many requests run at once (default: no cap)")
    parser.add_argument("--requests-per-level", type=int, default=64, metavar="N",
                        help="requests measured per level (default 64)")
    parser.add_argument("--warmup", type=int, default=4, metavar="N",
                        help="requests per level sent before measuring, not counted (default 4)")
    _length_args(parser, input_len=32)
    parser.add_argument("--ignore-eos", action=argparse.BooleanOptionalAction, default=True,
                        help="ask the server to generate exactly --output-len tokens (default: yes)")
    parser.add_argument("--num-prompts", type=int, help="cycle this many distinct prompts (default: all distinct)")
    parser.add_argument("--knee-threshold", type=float, default=0.5,
                        help="knee: first level whose throughput gain is below this fraction of linear (0.5)")
    parser.add_argument("--api", choices=("completions", "chat"), default="completions",
                        help="which OpenAI endpoint (default completions)")
    parser.add_argument("--goodput", nargs="+", metavar="NAME:MS", help="SLOs for goodput, e.g. ttft:500 tpot:50")
    parser.add_argument("--json", metavar="PATH", help="write the results (rewritten after every level)")
    parser.add_argument("--plot", metavar="PNG", help="plot throughput and latency percentiles (needs matplotlib)")
    args = parser.parse_args(list(argv))
    mode = "open" if args.request_rate else "closed"
    values = args.request_rate or args.concurrency or [1, 2, 4, 8]
    for name in ("requests_per_level", "input_len", "output_len"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if min(values) <= 0 or args.warmup < 0 or args.burstiness <= 0 or (args.num_prompts or 1) < 1:
        parser.error("levels, --burstiness and --num-prompts must be positive and --warmup nonnegative")
    try:
        opts = LoadOptions(
            base_url=_base_url(args), levels=[float(v) for v in values], mode=mode,
            requests_per_level=args.requests_per_level, warmup=args.warmup, input_len=args.input_len,
            output_len=args.output_len, ignore_eos=args.ignore_eos, num_prompts=args.num_prompts,
            knee_threshold=args.knee_threshold, api=args.api, model=args.model, timeout=args.timeout,
            seed=args.seed, burstiness=args.burstiness, max_concurrency=args.max_concurrency,
            slo_ms=_slo(args.goodput),
        )
        if args.plot:
            from .plot import plot_sweep  # fail on a missing matplotlib before the sweep, not after
        results = run_sweep(opts, out_json=args.json)
        print(format_table(results, mode))
        if args.plot:
            plot_sweep(results, args.plot, mode=mode, title=f"cbatch load {opts.base_url}")
    except (LiveError, MissingExtra, ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    from .plot import knee_interval

    interval = knee_interval(results)
    print(f"knee: between {interval[0]:g} and {interval[1]:g} ({interval[1]:g} gained less than "
          f"--knee-threshold of linear)" if interval else "knee: none (every level scaled within --knee-threshold)")
    return 0


def invariance_main(argv: Sequence[str]) -> int:
    """``cbatch invariance``: exit 0, or 1 when not bitwise under ``--require-bitwise``, 2 on bad input."""
    from .invariance import format_report, run_invariance

    parser = argparse.ArgumentParser(prog="cbatch invariance", description="Batch-invariance sweep over HTTP: "
                                     "one prompt at batch sizes 1, 2, 4, ... compared with the batch of one.")
    _server_args(parser)
    parser.add_argument("--max-batch", type=int, default=8, metavar="N",
                        help="largest batch size; sizes 1, 2, 4, ... up to N (default 8)")
    _length_args(parser, input_len=16)
    parser.add_argument("--json", metavar="PATH", help="write the verdicts as JSON")
    parser.add_argument("--require-bitwise", action="store_true", help="exit 1 unless bitwise at every size")
    args = parser.parse_args(list(argv))
    try:
        doc = run_invariance(_base_url(args), args.max_batch, input_len=args.input_len, output_len=args.output_len,
                             seed=args.seed, model=args.model, timeout=args.timeout)
        if args.json:
            with open(args.json, "w", encoding="utf-8") as fh:
                json.dump(doc, fh, indent=2)
                fh.write("\n")
    except (LiveError, MissingExtra, ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(format_report(doc))
    return 1 if args.require_bitwise and not doc["bitwise"] else 0
