"""SGLang's real ``Scheduler`` on CPU, with a stand-in model worker, stepped one loop pass at a time.

Written against sglang 0.5.23 (line numbers below are of that version).  The Scheduler is built
by its own ``__init__`` (``managers/scheduler.py`` ~465), after ``publish`` as
``run_scheduler_process`` (~6310) does it: parallel groups (gloo, one rank), IPC channels, the
KV cache builder, the schedule policy, the result processors are all SGLang's.  Only
``init_tp_model_worker`` (~1018), which would load a model, is replaced: the stand-in worker
holds SGLang's own ``ReqToTokenPool`` and ``TokenToKVPoolAllocator`` (no KV tensors) and its
``forward_batch_generation`` returns one sampled token id per request, as
``TpModelWorker.forward_batch_generation`` (``managers/tp_worker.py`` ~622) does.

One :meth:`Engine.step` is one pass of ``Scheduler.event_loop_normal`` (~2026) without the
socket read: ``get_next_batch_to_run`` (prefill admission through ``get_new_batch_prefill`` or
decode through ``update_running_batch``, retraction included), ``run_batch``,
``process_batch_result``.  Requests enter through ``handle_generate_request`` and leave through
``abort_request``, the handlers the socket read would call; what the scheduler sends to the
tokenizer and detokenizer is captured instead of sent.
"""

from __future__ import annotations

import atexit
import os
from array import array
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the model dir is local; never reach the Hub

from . import stand_ins  # noqa: E402

stand_ins.install()

import sglang  # noqa: E402
import torch  # noqa: E402
import zmq  # noqa: E402
from sglang.srt.distributed import parallel_state  # noqa: E402
from sglang.srt.managers import scheduler as scheduler_module  # noqa: E402
from sglang.srt.managers.io_struct import AbortReq, GenerateReqInput, TokenizedGenerateReqInput  # noqa: E402
from sglang.srt.managers.tokenizer_manager import TokenizerManager  # noqa: E402
from sglang.srt.managers.tp_worker import TpModelWorker  # noqa: E402
from sglang.srt.managers.utils import GenerationBatchResult, compute_num_reserved_tokens  # noqa: E402
from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator  # noqa: E402
from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator  # noqa: E402
from sglang.srt.mem_cache.memory_pool import ReqToTokenPool  # noqa: E402
from sglang.srt.model_executor.model_runner_components.ngram_embedding_manager import (  # noqa: E402
    NgramEmbeddingManager,
)
from sglang.srt.runtime_context import get_serving  # noqa: E402
from sglang.srt.sampling.sampling_params import SamplingParams  # noqa: E402
from sglang.srt.server_args import PortArgs, ServerArgs  # noqa: E402

__all__ = ["EngineSettings", "Engine", "StepRecord", "SGLANG_VERSION", "SYNTHETIC_TOKEN"]

SGLANG_VERSION: str = sglang.__version__
MODEL_DIR = Path(__file__).parent / "model"
# Every synthetic sample: not the tiny config's eos_token_id (50256), so only max_new_tokens ends a request.
SYNTHETIC_TOKEN = 1000
Scheduler = scheduler_module.Scheduler


@dataclass(frozen=True)
class EngineSettings:
    """The SGLang settings one run uses."""

    max_total_tokens: int          # KV slots in the pool (a multiple of page_size)
    max_running_requests: int      # also the ReqToTokenPool's rows
    chunked_prefill_size: int      # the longest prefill chunk
    max_prefill_tokens: int        # the token budget of one prefill batch
    context_length: int            # the longest sequence a request may reach
    schedule_policy: str = "fcfs"
    page_size: int = 1             # KV slots per page; above 1 SGLang's paged allocator hands out whole pages


@dataclass
class StepRecord:
    """What one loop pass did, read from SGLang's own objects."""

    mode: str | None                                  # "EXTEND", "DECODE" or None (no batch)
    rows: list[tuple[str, int, int]]                  # (rid, tokens fed, tokens already in KV before)
    outputs: list[Any] = field(default_factory=list)  # BatchTokenIDOutput messages
    aborts: list[Any] = field(default_factory=list)   # AbortReq messages sent to the tokenizer


class _StandInRunner:
    """The parts of ``ModelRunner`` the scheduler reads: SGLang's own pools, no model."""

    def __init__(self, model_config: Any, settings: EngineSettings) -> None:
        tokens, rows = settings.max_total_tokens, settings.max_running_requests
        self.model_config = model_config
        self.device = "cpu"
        self.model = SimpleNamespace()
        self.req_to_token_pool = ReqToTokenPool(rows, model_config.context_len + 4, "cpu", False)
        # The allocator hands out slot indices; the KV tensors it would index are never made.
        self.token_to_kv_pool = SimpleNamespace(size=tokens, dtype=torch.float16, device="cpu",
                                                post_capture_active=False)
        if settings.page_size == 1:
            self.token_to_kv_pool_allocator = TokenToKVPoolAllocator(tokens, torch.float16, "cpu",
                                                                     self.token_to_kv_pool, False)
        else:
            self.token_to_kv_pool_allocator = PagedTokenToKVPoolAllocator(
                tokens, settings.page_size, torch.float16, "cpu", self.token_to_kv_pool, False)
        self.memory_pool_config = SimpleNamespace()  # pools exist: init_target_memory_pool returns early
        self.attn_backend = SimpleNamespace()
        self.canary_manager = None
        self.prefill_aware_swa = False
        self.sliding_window_size = None
        self.is_hybrid_swa = False
        self.mtp_draft_device_pools = None
        self.mtp_draft_mamba_pools = None
        self.forward_stream = torch.cpu.Stream()
        self.logical_max_total_num_tokens = tokens
        self.effective_logical_max_total_num_tokens = tokens
        self.max_running_requests = rows
        self.ngram_embedding_manager = NgramEmbeddingManager.from_model(
            model=self.model, model_config=model_config, req_to_token_pool=self.req_to_token_pool,
            max_running_requests=rows, device="cpu")

    def prewarm_sampling(self) -> None:
        """No sampler to warm."""


class _StandInWorker:
    """``TpModelWorker`` without a model: one synthetic sampled token per request per forward."""

    is_hybrid_swa = False
    sliding_window_size = None
    weight_load_time = 0.0
    graph_time_usage = None
    dllm_algorithm = None
    random_seed = 0
    device = "cpu"

    def __init__(self, runner: _StandInRunner) -> None:
        self.model_runner = runner
        self.model_config = runner.model_config

    def init_attention_backends(self) -> None:
        """No attention backend."""

    def init_cuda_graphs(self) -> None:
        """No graphs."""

    def get_worker_info(self) -> tuple:
        return TpModelWorker.get_worker_info(self)  # SGLang's own sizing from the stand-in pools

    def get_memory_pool(self) -> tuple[ReqToTokenPool, TokenToKVPoolAllocator]:
        return self.model_runner.req_to_token_pool, self.model_runner.token_to_kv_pool_allocator

    def get_pad_input_ids_func(self) -> None:
        return None

    def get_tokens_per_layer_info(self) -> tuple[int, None]:
        return self.model_runner.logical_max_total_num_tokens, None

    def forward_batch_generation(self, batch: Any, **_: Any) -> GenerationBatchResult:
        n = len(batch.reqs)
        return GenerationBatchResult(logits_output=None, can_run_cuda_graph=False,
                                     next_token_ids=torch.full((n,), SYNTHETIC_TOKEN, dtype=torch.int64))


_PENDING_SETTINGS: list[EngineSettings] = []


def batch_rows(batch: Any) -> list[tuple[str, int, int]]:
    """A ``ScheduleBatch``'s rows as (rid, tokens fed, tokens already in KV before), from its own
    ``extend_lens`` / ``prefix_lens`` (extend) or ``seq_lens`` (decode: one token each)."""
    if batch.forward_mode.is_extend():
        return [(r.rid, int(n), int(p)) for r, n, p in zip(batch.reqs, batch.extend_lens, batch.prefix_lens)]
    return [(r.rid, 1, int(s) - 1) for r, s in zip(batch.reqs, batch.seq_lens_cpu.tolist())]


def _end_thread() -> bool:
    raise SystemExit  # ends the calling thread quietly (threading ignores SystemExit)


@atexit.register
def _close_the_live_engine() -> None:
    """The last Engine of a process is closed at exit too (its /dev/shm file would outlive it)."""
    if Engine._live is not None:
        Engine._live.close()


def _tear_down() -> None:
    parallel_state.destroy_model_parallel()
    parallel_state.destroy_distributed_environment()


def _init_stand_in_worker(self: Any) -> None:
    self.tp_worker = _StandInWorker(_StandInRunner(self.model_config, _PENDING_SETTINGS[-1]))


class Engine:
    """One fresh SGLang ``Scheduler``; several may be built in turn in one process, not at once."""

    _live: "Engine | None" = None

    def __init__(self, settings: EngineSettings) -> None:
        if Engine._live is not None:
            Engine._live.close()
        self.settings = settings
        args = ServerArgs(
            model_path=str(MODEL_DIR), device="cpu", skip_tokenizer_init=True, load_format="dummy",
            disable_overlap_schedule=True, disable_radix_cache=True, disable_cuda_graph=True,
            page_size=settings.page_size,
            schedule_policy=settings.schedule_policy, context_length=settings.context_length,
            max_total_tokens=settings.max_total_tokens, max_running_requests=settings.max_running_requests,
            chunked_prefill_size=settings.chunked_prefill_size, max_prefill_tokens=settings.max_prefill_tokens)
        scheduler_module.publish(args, role="scheduler", ranks=scheduler_module.SpawnRanks(
            world_rank=scheduler_module.spawn_world_rank(args, tp_rank=0, pp_rank=0),
            dp_rank=scheduler_module.resolve_spawn_dp_rank(None), gpu_id=0))
        _PENDING_SETTINGS.append(settings)
        original = Scheduler.init_tp_model_worker
        Scheduler.init_tp_model_worker = _init_stand_in_worker
        try:
            self.sched = Scheduler(args, PortArgs.init_new(args))
        except BaseException:
            # A constructor stopped midway (an error, a time limit's interrupt) has built SGLang's
            # process-wide parallel groups; without this no later Engine could build its own.
            _tear_down()
            raise
        finally:
            Scheduler.init_tp_model_worker = original
            _PENDING_SETTINGS.pop()
        self._outputs: list[Any] = []
        self._aborts: list[Any] = []
        self.sched.output_streamer.send_to_detokenizer.send_output = self._capture_output
        self.sched.ipc_channels.send_to_tokenizer.send_output = self._capture_abort
        Engine._live = self

    def _capture_output(self, output: Any, *_: Any, **__: Any) -> None:
        self._outputs.append(output)

    def _capture_abort(self, output: Any, *_: Any, **__: Any) -> None:
        self._aborts.append(output)

    def close(self) -> None:
        """Give back what the Scheduler holds outside Python objects (its ZMQ context with its sockets
        and I/O threads, its load-snapshot file in /dev/shm) and tear down SGLang's process-wide
        parallel state so the next Engine can build its own: a run builds hundreds of engines."""
        channels = self.sched.ipc_channels
        sockets = [getattr(s, "socket", s) for s in (channels.recv_from_tokenizer, channels.recv_from_rpc,
                                                      channels.send_to_tokenizer, channels.send_to_detokenizer,
                                                      channels.send_metrics_from_scheduler)]
        for context in {id(s.context): s.context for s in sockets if isinstance(s, zmq.Socket)}.values():
            context.destroy(linger=0)
        writer = self.sched.load_snapshot_writer
        if writer is not None:
            writer.close()
            Path(getattr(writer, "path", "")).unlink(missing_ok=True)
        # SGLang's watchdog threads never end and their callbacks hold the Scheduler (and through it its
        # gloo groups and their sockets); they go idle with nothing of it, and end at their next look.
        for dog in (getattr(self.sched, "watchdog", None), getattr(self.sched, "soft_watchdog", None)):
            if dog is not None:
                dog.is_active, dog.get_counter, dog.dump_info = _end_thread, int, None
        _tear_down()
        Engine._live = None

    # -- requests ----------------------------------------------------------------

    def add(self, rid: str, prompt: list[int], max_new_tokens: int, *, ignore_eos: bool = True) -> None:
        """``handle_generate_request`` with a tokenized prompt.

        The synthetic token is never the eos token, so a request ends at ``max_new_tokens`` either
        way; ``ignore_eos`` decides how SGLang budgets it.  With it, SGLang reserves the whole
        remaining output of every running request when admitting (``PrefillAdder``, ratio 1.0 for
        "fixed-length requests"); without it, only ``new_token_ratio`` of it, and decode may run
        out of slots and retract.
        """
        params = SamplingParams(max_new_tokens=max_new_tokens, ignore_eos=ignore_eos)
        params.normalize(None)
        self.sched.handle_generate_request(TokenizedGenerateReqInput(
            rid=rid, input_text=None, input_ids=array("q", prompt), input_embeds=None, mm_inputs=None,
            token_type_ids=None, sampling_params=params, return_logprob=False, logprob_start_len=-1,
            top_logprobs_num=0, token_ids_logprob=None, stream=True))

    def front_end_refusal(self, prompt_len: int, max_new_tokens: int) -> str | None:
        """What SGLang's front end says to a request before it reaches the scheduler: the message of
        ``TokenizerManager._validate_one_request`` (prompt, and prompt plus ``max_new_tokens``,
        against the context length), or None when it passes.  Run on a ``TokenizerManager`` whose
        ``__init__`` did not run, holding only the fields that method reads, with SGLang's own values."""
        # A TokenizerManager's __init__ starts the server's sockets and tokenizer: only the fields read here.
        front = TokenizerManager.__new__(TokenizerManager)
        front.model_config, front.context_len = self.sched.model_config, self.sched.model_config.context_len
        front.num_reserved_tokens = compute_num_reserved_tokens()
        front.allow_auto_truncate, front.validate_total_tokens = get_serving().allow_auto_truncate, True
        request = GenerateReqInput(input_ids=[SYNTHETIC_TOKEN] * prompt_len,
                                   sampling_params={"max_new_tokens": max_new_tokens})
        try:
            TokenizerManager._validate_one_request(front, request, list(request.input_ids))
        except ValueError as exc:
            return str(exc)
        return None

    def abort(self, rid: str) -> None:
        """``abort_request(AbortReq(rid))``, as a client disconnect reaches the scheduler."""
        self.sched.abort_request(AbortReq(rid=rid))

    # -- the loop ------------------------------------------------------------------

    def step(self) -> StepRecord:
        """One pass of ``event_loop_normal`` less the socket read."""
        return self.run(self.schedule())

    def schedule(self) -> Any:
        """The first half of a loop pass: ``get_next_batch_to_run`` (admission, chunking, KV
        allocation, retraction); returns the batch to run, or None.  The pool as it leaves it is
        what the step's forward reads."""
        sched = self.sched
        plan = sched.get_next_batch_to_run(running_batch=sched.running_batch, last_batch=sched.last_batch)
        sched.running_batch = plan.running_batch
        return plan.batch_to_run

    def run(self, batch: Any) -> StepRecord:
        """The second half: ``run_batch`` and ``process_batch_result`` for ``batch`` (from
        :meth:`schedule`), or ``on_idle`` without one; what SGLang sent out meanwhile."""
        sched = self.sched
        rows: list[tuple[str, int, int]] = []
        if batch:
            rows = batch_rows(batch)
            result = sched.run_batch(batch)
            sched.process_batch_result(batch, result)
        else:
            sched.on_idle()
        sched.last_batch = batch
        outputs, aborts = self.sent()
        record = StepRecord(mode=batch.forward_mode.name if batch else None, rows=rows, outputs=outputs, aborts=aborts)
        return record

    def sent(self) -> tuple[list[Any], list[Any]]:
        """What SGLang sent since the last look: ``BatchTokenIDOutput`` messages to the detokenizer
        and ``AbortReq`` messages to the tokenizer."""
        outputs, aborts = self._outputs, self._aborts
        self._outputs, self._aborts = [], []
        return outputs, aborts

    # -- state -----------------------------------------------------------------------

    def free_slots(self) -> int:
        return int(self.sched.token_to_kv_pool_allocator.available_size())

    def waiting(self) -> list[str]:
        return [r.rid for r in self.sched.waiting_queue]

    def running(self) -> list[str]:
        return [r.rid for r in self.sched.running_batch.reqs]

    def pages(self, batch: Any = None) -> dict[str, list[int]]:
        """Each request holding KV rows: its page ids in logical order, read from SGLang's
        ``req_to_token`` table (slot // page_size; page 0 is the allocator's padding page).
        ``batch``: the one :meth:`schedule` returned, whose requests may be in no queue yet."""
        reqs = list(batch.reqs if batch else []) + list(self.sched.running_batch.reqs) + list(self.sched.waiting_queue)
        if self.sched.chunked_req is not None:
            reqs.append(self.sched.chunked_req)
        if self.sched.last_batch is not None:
            reqs.extend(self.sched.last_batch.reqs)
        tables: dict[str, list[int]] = {}
        for req in reqs:
            if req.rid not in tables and req.kv.req_pool_idx is not None:
                tables[req.rid] = self.table(req)
        return tables

    def table(self, req: Any) -> list[int]:
        """``req``'s page ids in logical order ([] when it holds no KV row): its slots are
        ``[0, kv_allocated_len)`` of its ``req_to_token`` row, and a slot's page is slot // page_size."""
        row = req.kv.req_pool_idx
        if row is None:
            return []
        held = int(req.kv.kv_allocated_len)
        slots = self.sched.req_to_token_pool.req_to_token[int(row)][:held].tolist()
        return list(dict.fromkeys(slot // self.settings.page_size for slot in slots))

    def waiting_req(self, rid: str) -> Any:
        """SGLang's ``Req`` for ``rid`` in ``waiting_queue``, or None."""
        return next((req for req in self.sched.waiting_queue if req.rid == rid), None)

    def chunked(self) -> str | None:
        req = self.sched.chunked_req
        return None if req is None else req.rid

    def idle(self) -> bool:
        """No request waiting, running, mid-chunk or in the last batch's results."""
        return self.sched.is_fully_idle()
