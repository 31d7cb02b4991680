"""pytest-cbatch adapter: vLLM's V1 ``Scheduler`` driven one step per tick.

``simulate(trace, **config) -> report`` (entry point ``vllm`` in
``pytest_cbatch.impls``).  At each tick ``t`` where vLLM has work:

1. trace arrivals at ``t`` go through vLLM's front-end length check (a prompt
   of max_model_len tokens or more is refused there: reported ``rejected``),
   then ``add_request``; cancels at ``t`` are
   ``finish_requests(id, FINISHED_ABORTED)``, which frees the blocks at once
   (``cancelled`` and ``release`` at ``t``) or returns nothing for a request
   that already ended (``cancel_ignored``);
2. ``schedule()``: its ``preempted_req_ids`` become ``preempted`` events,
   requests it moves into ``running`` become ``admit`` events, and the
   ``snapshot`` shows what the workers are told (vLLM allocates a step's
   blocks inside ``schedule()``, so the snapshot shows them): each request's
   block table as the model runner builds it from the ``SchedulerOutput``
   (``worker_view``), the pool's free blocks, and as ``active`` and
   ``queued`` the ids of the requests vLLM holds in ``running`` and elsewhere
   (its waiting queues and ``Scheduler.requests``);
   ``num_scheduled_tokens`` becomes the ``dispatch``;
3. one synthetic sampled token per request that reached the end of its known
   tokens goes through ``update_from_output``; its outputs are the ``token``
   events at ``t + 1`` (``output_index``: the token's position in the
   request's own output token list) and ``finished`` events, and vLLM frees a
   finished request's blocks there (``release`` at ``t + 1``).

When vLLM holds no request the engine does not step, and the clock jumps to
the next trace time.  When the trace is over and vLLM reports no work left, a
last ``snapshot`` at the last event's time shows what vLLM still holds: the
requests it keeps (any is an ended request it never let go of:
``snapshot_counts``) and the blocks its KV cache manager assigns to any
request, free counting only blocks both the free queue and the ref counts give
back (``no_leaked_pages``, ``pages_conserved``).  Settings vLLM cannot express raise
``NotImplementedError`` (the kit skips those workloads with the reason).

Config mapping (kit setting -> vLLM):

=================  ==========================================================
capacity           ``num_blocks = capacity + 1`` (block 0 is the null block);
                   page id = vLLM block id - 1
block_size         ``CacheConfig.block_size``
(derived)          ``max_model_len = capacity * block_size``: vLLM's startup
                   refuses a pool that cannot hold one max_model_len sequence
token_budget       ``max_num_batched_tokens``
max_active         ``max_num_seqs = min(max_active, token_budget)``: vLLM
                   refuses max_num_batched_tokens < max_num_seqs, and the kit's
                   limit is an upper bound
policy serial      ``max_num_seqs = 1``
prefill_chunk      ``long_prefill_token_threshold = min(prefill_chunk,
                   max_model_len)``; vLLM 0.32 lifts it when a single request
                   is running or waiting
release_delay      only 0 (vLLM frees blocks the moment a request ends)
admission          vLLM allocates per scheduled chunk and preempts the newest
                   running request when blocks run out: "optimistic";
                   "reserve" (whole need reserved at admission) is unsupported
=================  ==========================================================

Fixed vLLM settings: synchronous ``Scheduler`` (no async scheduling), FCFS,
chunked prefill on, prefix caching off (trace prompts carry no token content,
and the contract has no notion of rows restored from a cache),
``scheduler_reserve_full_isl`` at its default (True), watermark 0.
"""

from __future__ import annotations

from typing import Any, Sequence

from pytest_cbatch.engine_report import EventLog, engine_report, engine_run_input, pool_tokens, row_phase

from . import engine
from .engine import EngineSettings
from .worker_view import WorkerView

__all__ = ["simulate", "engine_settings", "CBATCH_NATIVE_CONFIG", "CBATCH_ENGINE_LOGGERS"]

# Read by the plugin: a bare ``pytest --cbatch-impl=vllm`` runs every workload that does not test the
# delay at release_delay 0 (vLLM frees a request's blocks the moment it ends), and vLLM's own log
# records below ERROR (its block-size advice, repeated per scheduler) stay out of failure reports.
CBATCH_NATIVE_CONFIG = {"release_delay": 0, "admission": "optimistic"}  # what vLLM does: frees at once, admits optimistically
CBATCH_ENGINE_LOGGERS = ("vllm",)

MAX_MODEL_LEN_LIMIT = 8192  # max_position_embeddings of the shipped tiny llama config


def engine_settings(config: dict[str, Any]) -> EngineSettings:
    """Map a validated kit config to vLLM settings; NotImplementedError names what vLLM cannot do."""
    if config["release_delay"] != 0:
        raise NotImplementedError(
            f"release_delay {config['release_delay']}: vLLM frees a request's blocks the moment it ends "
            "(only release_delay 0)")
    if config.get("admission", "optimistic") != "optimistic":
        raise NotImplementedError(
            "admission 'reserve': vLLM never reserves a request's whole need at admission; it allocates per "
            "scheduled chunk and preempts when blocks run out (only 'optimistic')")
    max_model_len = pool_tokens(config, MAX_MODEL_LEN_LIMIT)
    budget = config["token_budget"]
    seqs = 1 if config["policy"] == "serial" else min(config["max_active"], budget)
    return EngineSettings(num_blocks=config["capacity"] + 1, block_size=config["block_size"],
                          max_model_len=max_model_len, max_num_seqs=seqs, max_num_batched_tokens=budget,
                          long_prefill_token_threshold=min(config["prefill_chunk"], max_model_len))


def simulate(trace: Sequence[dict[str, Any]], *, capacity: int, block_size: int, token_budget: int,
             max_active: int, prefill_chunk: int, release_delay: int, policy: str,
             admission: str | None = None) -> dict[str, Any]:
    """Run ``trace`` through vLLM's scheduler under the kit ``config``; return the report.

    Raises ValueError for an invalid trace or config, NotImplementedError for a
    setting vLLM cannot express, and RuntimeError when vLLM stops making
    progress (a bounded number of steps).
    """
    config, lines = engine_run_input(trace, capacity=capacity, block_size=block_size, token_budget=token_budget,
                                     max_active=max_active, prefill_chunk=prefill_chunk,
                                     release_delay=release_delay, policy=policy, admission=admission)
    settings = engine_settings(config)
    run = _Run(settings, {**config, "admission": "optimistic"}, lines)
    run.drive()
    return run.report()


class _Run:
    """One trace through one fresh scheduler; collects the contract's events."""

    def __init__(self, settings: EngineSettings, config: dict[str, Any], lines: list[dict[str, Any]]) -> None:
        self.settings = settings
        self.config = config
        self.lines = lines
        self.sched = engine.new_scheduler(settings)
        self.worker = WorkerView()
        self.log = EventLog()
        self.arrivals: dict[str, dict[str, Any]] = {line["id"]: line for line in lines if line["event"] == "arrival"}
        self.status: dict[str, str] = {}        # queued, active, finished, cancelled, rejected
        self.held: dict[str, list[int]] = {}    # pages per request as the last snapshot showed them
        self.engine_requests: dict[str, Any] = {}  # vLLM's Request objects, read for their output positions
        self.preempted: set[str] = set()
        total = sum(line["prompt_tokens"] + line["output_tokens"] for line in self.arrivals.values())
        self.step_limit = 50 * total + 1000

    # -- the loop --------------------------------------------------------------

    def drive(self) -> None:
        lines, i, t, steps = self.lines, 0, 0, 0
        while i < len(lines) or self.sched.has_requests():
            if not self.sched.has_requests() and lines[i]["time"] > t:
                t = lines[i]["time"]  # vLLM idles: no step until the next request comes
            while i < len(lines) and lines[i]["time"] == t:
                self._trace_line(lines[i], t)
                i += 1
            if self.sched.has_requests():
                steps += 1
                if steps > self.step_limit:
                    stuck = ", ".join(f"{rid} ({self.status[rid]})" for rid in self.sched.requests)
                    raise RuntimeError(f"vLLM made no end after {self.step_limit} steps; unfinished: {stuck}")
                self._step(t)
            t += 1
        self._snapshot(self.log.events[-1]["time"], engine.held_blocks(self.sched))

    def _trace_line(self, line: dict[str, Any], t: int) -> None:
        rid = line["id"]
        if line["event"] == "arrival":
            self.log.emit(t, "arrival", rid)
            refusal = engine.prompt_refusal(self.sched, line["prompt_tokens"])
            if refusal:
                self.status[rid] = "rejected"
                self.log.emit(t, "rejected", rid, reason=refusal)
                return
            self.status[rid] = "queued"
            request = engine.new_request(rid, len(self.status), line["prompt_tokens"], line["output_tokens"],
                                         self.settings.block_size)
            self.engine_requests[rid] = request
            self.sched.add_request(request)
            return
        pages = engine.held_blocks(self.sched).get(rid)
        ended = engine.abort(self.sched, rid)
        if not ended:
            if self.status[rid] in ("queued", "active"):
                raise RuntimeError(f"vLLM had nothing to abort for {rid!r}, which the adapter saw {self.status[rid]}")
            self.log.emit(t, "cancel_ignored", rid, status=self.status[rid])
            return
        self.status[rid] = "cancelled"
        self.log.emit(t, "cancelled", rid)
        if pages:
            self._release(t, rid)

    def _step(self, t: int) -> None:
        sched = self.sched
        out = sched.schedule()
        waiting_order = {req.request_id: k for k, req in enumerate(sched.waiting)}
        for rid in sorted(out.preempted_req_ids, key=lambda r: waiting_order.get(r, len(waiting_order))):
            self.status[rid] = "queued"
            self.preempted.add(rid)
            self.log.emit(t, "preempted", rid, released_blocks=len(self.held.pop(rid, [])))
        self.worker.update(out)
        tables = self.worker.tables()
        for req in sched.running:
            if self.status[req.request_id] == "queued":
                self.status[req.request_id] = "active"
                self.log.emit(t, "admit", req.request_id, reserved_blocks=len(tables.get(req.request_id, ())))
        self._snapshot(t, tables)
        scheduled = dict(out.num_scheduled_tokens)
        if scheduled:
            self._dispatch(t, scheduled)
        outputs = sched.update_from_output(out, engine.runner_output(sched, scheduled))
        for core_outputs in outputs.values():
            for output in core_outputs.outputs:
                self._output(t + 1, output)

    # -- events ----------------------------------------------------------------

    def _snapshot(self, t: int, tables: dict[str, list[int]]) -> None:
        """A snapshot of vLLM's pool and the requests it holds, with ``tables`` (vLLM block ids
        per request) as its block tables: page id = block id - 1."""
        shown = {rid: [block - 1 for block in table] for rid, table in tables.items() if table}
        self.held = dict(shown)
        free = engine.free_blocks(self.sched)
        allocated = self.config["capacity"] - free
        running, waiting = engine.held_requests(self.sched)
        self.log.emit(t, "snapshot", active=running, queued=waiting, reserved_blocks=allocated, draining_blocks=0,
                      allocated_blocks=allocated, free_blocks=free, admission_headroom=free, block_tables=shown)

    def _dispatch(self, t: int, scheduled: dict[str, int]) -> None:
        rows = []
        for rid, n in scheduled.items():
            req = self.sched.requests[rid]
            before = req.num_computed_tokens - n  # schedule() already advanced num_computed_tokens
            rows.append((rid, row_phase(has_output=bool(req.num_output_tokens), before=before, known=req.num_tokens,
                                        preempted=rid in self.preempted), n))
        self.log.dispatch(t, rows, self.config["token_budget"])

    def _output(self, t: int, output: Any) -> None:
        rid = output.request_id
        for index in engine.output_positions(self.engine_requests[rid], output):
            self.log.emit(t, "token", rid, output_index=index)
        reason = engine.finish_reason(output)
        if reason is not None:
            self.status[rid] = "finished"
            self.log.emit(t, "finished", rid, reason=reason)
            if self.held.get(rid):
                self._release(t, rid)

    def _release(self, t: int, rid: str) -> None:
        self.held.pop(rid, None)
        self.log.emit(t, "release", rid)

    # -- the report ------------------------------------------------------------

    def report(self) -> dict[str, Any]:
        return engine_report(config=self.config, arrivals=self.arrivals, status=self.status, events=self.log.events,
                             dispatches=self.log.dispatches, fed=self.log.fed,
                             free_blocks=engine.free_blocks(self.sched), engine=f"vllm {engine.VLLM_VERSION}")
