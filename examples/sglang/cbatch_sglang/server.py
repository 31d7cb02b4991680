"""SGLang's own OpenAI server on CPU, with only the model worker replaced by the stand-in.

``python -m cbatch_sglang.server --model-path DIR --host 127.0.0.1 --port PORT [SGLang's flags]``
runs ``sglang.srt.entrypoints.http_server.launch_server`` (sglang 0.5.23): SGLang's HTTP front end
and TokenizerManager in this process, its Scheduler and DetokenizerManager in the processes SGLang
spawns.  The one thing changed is the scheduler process's entry function, which SGLang takes as a
parameter (``launch_server(..., run_scheduler_process_func=...)``): :func:`run_scheduler_process`
installs the stand-in model worker of :mod:`cbatch_sglang.engine` on ``Scheduler`` and then runs
SGLang's own ``run_scheduler_process`` (``managers/scheduler.py`` ~6310).  The worker returns one
sampled token id per request per forward (:data:`cbatch_sglang.engine.SYNTHETIC_TOKEN`), which
SGLang's detokenizer turns into text with the model directory's real tokenizer.

Why the model worker cannot be SGLang's on this CPU (see docs/engines/sglang.md, "SGLang's OpenAI
server"): SGLang's CPU path (``SGLANG_USE_CPU_ENGINE=1``) imports the CPU build of ``sgl_kernel``
(``sglang/kernels/ops/kvcache/cache_move.py`` line 10), which no registry ships; without it,
``RotaryEmbedding`` imports ``vllm._custom_ops`` (``layers/rotary_embedding/base.py`` line 138).

SGLang spawns its processes (start method ``spawn``), and each spawned process first re-runs the
main module: running this module as ``-m`` is what puts the triton and torchvision stand-ins in
every SGLang process before SGLang is imported there.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Any

from . import stand_ins

if TYPE_CHECKING:
    from .engine import EngineSettings

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the model directory is local; never reach the Hub
if os.environ.get("SGLANG_USE_CPU_ENGINE") == "1":
    # SGLang's CPU engine needs sgl_kernel's CPU build even with the stand-in worker (its KV pool
    # module imports it); the stand-in path never runs a kernel.
    raise SystemExit("cbatch_sglang.server: unset SGLANG_USE_CPU_ENGINE (it needs the CPU build of sgl_kernel)")
stand_ins.install()

__all__ = ["DEFAULTS", "FIXED_FLAGS", "run_scheduler_process", "stand_in_settings", "server_argv", "main"]

# What the stand-in needs decided that a real worker would size from free memory.  Any of these
# given on the command line wins.
DEFAULTS: dict[str, str] = {"--max-total-tokens": "8192", "--max-running-requests": "32"}
# The stand-in has no device streams or graphs to overlap or capture.
FIXED_FLAGS: tuple[str, ...] = ("--device", "cpu", "--disable-overlap-schedule", "--disable-cuda-graph")


def server_argv(argv: list[str]) -> list[str]:
    """SGLang's command line for the stand-in: ``argv``, the :data:`DEFAULTS` it lacks, the fixed flags.

    Raises ``SystemExit`` when ``argv`` names a device: the stand-in runs on the CPU only.
    """
    given = {arg.split("=", 1)[0] for arg in argv if arg.startswith("--")}
    if "--device" in given:
        raise SystemExit("cbatch_sglang.server sets --device cpu itself: the stand-in worker runs on the CPU only")
    defaults = [item for flag, value in DEFAULTS.items() if flag not in given for item in (flag, value)]
    return [*argv, *defaults, *FIXED_FLAGS]


def stand_in_settings(server_args: Any, context_length: int) -> "EngineSettings":
    """The stand-in's ``EngineSettings``, from the server's arguments as SGLang resolved them."""
    from sglang.srt.arg_groups.overrides import resolving_view

    from .engine import EngineSettings

    resolved = resolving_view(server_args)
    return EngineSettings(
        max_total_tokens=int(resolved.max_total_tokens),
        max_running_requests=int(resolved.max_running_requests),
        chunked_prefill_size=int(resolved.chunked_prefill_size),
        max_prefill_tokens=int(resolved.max_prefill_tokens),
        context_length=context_length,
        schedule_policy=str(resolved.schedule_policy),
        page_size=int(resolved.page_size),
    )


def run_scheduler_process(server_args: Any, port_args: Any, *args: Any, **kwargs: Any) -> None:
    """SGLang's ``run_scheduler_process`` with ``Scheduler.init_tp_model_worker`` building the stand-in.

    Runs in the scheduler process SGLang spawns; the rest of that process is SGLang's.
    """
    from sglang.srt.managers import scheduler as scheduler_module

    from .engine import _StandInRunner, _StandInWorker

    def init_stand_in_worker(scheduler: Any) -> None:
        settings = stand_in_settings(server_args, scheduler.model_config.context_len)
        scheduler.tp_worker = _StandInWorker(_StandInRunner(scheduler.model_config, settings))

    scheduler_module.Scheduler.init_tp_model_worker = init_stand_in_worker
    scheduler_module.run_scheduler_process(server_args, port_args, *args, **kwargs)


def main(argv: list[str] | None = None) -> None:
    """Parse SGLang's flags as ``sglang.launch_server`` does and serve until stopped."""
    from sglang.srt.entrypoints.http_server import launch_server
    from sglang.srt.server_args import prepare_server_args
    from sglang.srt.utils import kill_process_tree

    server_args = prepare_server_args(server_argv(list(sys.argv[1:] if argv is None else argv)))
    server_args.resolve_once()  # as sglang.launch_server.run_server does before launching
    try:
        launch_server(server_args, run_scheduler_process_func=run_scheduler_process)
    finally:
        kill_process_tree(os.getpid(), include_parent=False)


if __name__ == "__main__":
    main()
