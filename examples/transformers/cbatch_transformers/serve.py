"""``transformers serve --continuous-batching`` for the kit's jobs: the tiny seeded model, served from a hub
cache on 127.0.0.1, with one read-only debug route.

``python -m cbatch_transformers.serve --work DIR --port PORT [--num-blocks N --block-size B --max-batch-tokens T]``
writes the tiny model (``model_path.make_tiny_model``, seed 0) into the hub cache layout under ``$HF_HOME``
(``hub/models--cbatch--tiny-llama/{refs/main, snapshots/<rev>/}``), so that ``GET /v1/models`` lists it as
``cbatch/tiny-llama`` (without a hub cache directory that route raises, a finding), then runs transformers'
own ``Serve`` (the class behind ``transformers serve``) in this process.

The server has no ``/metrics``.  ``GET /cbatch/scheduler`` shows what the engine's scheduler holds:
``{"active": {id: tokens generated}, "waiting": [ids], "started": bool}`` (``started`` false and nothing
held before the first request started the engine).  It reads the scheduler's dictionaries without a lock, so a reading taken while a step
runs may be a step old; the abort checks poll it until it settles.
"""

from __future__ import annotations

import argparse
import os
import shutil
import time
from pathlib import Path
from typing import Any

REPO = "cbatch/tiny-llama"
REVISION = "0" * 40


def place_in_hub_cache(model_dir: Path, hf_home: Path, repo: str = REPO) -> str:
    """Copy ``model_dir`` into the hub cache under ``hf_home`` as ``repo`` (revision all zeros); return ``repo``."""
    root = hf_home / "hub" / f"models--{repo.replace('/', '--')}"
    (root / "refs").mkdir(parents=True, exist_ok=True)
    (root / "refs" / "main").write_text(REVISION)
    shutil.copytree(model_dir, root / "snapshots" / REVISION, dirs_exist_ok=True)
    return repo


def scheduler_state(serve: Any) -> dict[str, Any]:
    """What the continuous-batching scheduler of ``serve`` (a transformers ``Serve``) holds now."""
    manager = serve._generation_state._cb_manager          # private: transformers 5.23.0
    cb = getattr(manager, "_cb", None) if manager is not None else None
    processor = getattr(cb, "batch_processor", None) if cb is not None else None
    if processor is None:
        return {"active": {}, "waiting": [], "started": False}
    scheduler = processor.scheduler
    return {"active": {str(rid): len(state.generated_tokens) for rid, state in list(scheduler.active_requests.items())},
            "waiting": sorted(map(str, list(scheduler.waiting_requests))), "started": True}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m cbatch_transformers.serve", description=__doc__.split("\n")[0])
    parser.add_argument("--work", type=Path, required=True, help="a directory for the model")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--num-blocks", type=int, default=64)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--max-batch-tokens", type=int, default=128)
    args = parser.parse_args(argv)
    from .model_path import make_tiny_model

    hf_home = Path(os.environ["HF_HOME"])
    repo = place_in_hub_cache(make_tiny_model(args.work / "model", seed=0), hf_home)
    from transformers.cli.serve import Serve

    serve = Serve(force_model=None, continuous_batching=True, attn_implementation="sdpa", device="cpu",
                  dtype="float32", cb_block_size=args.block_size, cb_num_blocks=args.num_blocks,
                  cb_max_batch_tokens=args.max_batch_tokens, host="127.0.0.1", port=args.port, non_blocking=True)

    async def scheduler() -> dict[str, Any]:
        return scheduler_state(serve)

    serve.server.config.app.add_api_route("/cbatch/scheduler", scheduler, methods=["GET"])
    print(f"serving {repo} on http://127.0.0.1:{args.port}", flush=True)
    try:
        while serve._thread.is_alive():
            time.sleep(0.5)
    finally:
        serve.kill_server()


if __name__ == "__main__":
    main()
