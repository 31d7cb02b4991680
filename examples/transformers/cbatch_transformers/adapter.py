"""pytest-cbatch adapter: transformers' continuous-batching engine driven one batch per tick.

Two implementations (entry points in ``pytest_cbatch.impls``): ``transformers-fifo``
(``FIFOScheduler``: decoding requests first, safety margin 0.15) and
``transformers-prefill-first`` (``PrefillFirstScheduler``: split prefills first, margin 0).
At each tick ``t`` where the engine has work:

1. trace arrivals at ``t`` are ``add_request`` (streamed, ``max_new_tokens = output_tokens``, no
   eos); cancels are ``cancel_request`` for a request still queued or running, else
   ``cancel_ignored`` at once;
2. ``prepare_next_batch()``, the manager's own step: it drains the queues, clears the cancels
   (``clear_cancelled_requests`` frees their blocks: ``cancelled`` and ``release`` at ``t``),
   schedules the batch (blocks allocated there) and, when blocks run out, offloads requests
   (soft reset on CPU: ``preempted``, then recompute once readmitted).  Requests that entered
   ``active_requests`` are ``admit`` events; the pool as it left it is the ``snapshot``; the
   scheduled batch is the ``dispatch`` (phase ``prefill``, ``decode`` for a row feeding only the
   newest sampled token, ``recompute`` for a preempted request rebuilding its rows);
3. the synthetic forward and ``update_batch()``: its outputs are the ``token`` and ``finished``
   events at ``t + 1``, where the engine also frees a finished request's blocks (``release``).

When the engine holds no request, or schedules nothing while requests wait (the manager then
waits for new input), the clock jumps to the next trace time; with no trace line left that is a
stall and the run raises.  An exception from the engine's step propagates (``completes``).

Config mapping (kit setting -> transformers):

=================  ==========================================================
capacity           ``ContinuousBatchingConfig.num_blocks`` (one block per cache
                   sector for the tiny model); page id = block id - 2 (the
                   pool's reserved sectors)
block_size         ``page_size``; at least 4 (the engine refuses smaller)
token_budget       ``max_batch_tokens``
max_active         ``max_requests_per_batch`` (a per-batch limit)
policy serial      ``max_requests_per_batch = 1``
prefill_chunk      no such setting: a prefill row takes whatever budget is left,
                   so only prefill_chunk >= token_budget runs (binding nothing)
release_delay      only 0 (the engine frees blocks when a request ends)
admission          blocks allocated per scheduled chunk, preemption when they run
                   out: "optimistic"; "reserve" is unsupported
=================  ==========================================================

Fixed: synchronous batching (no async double buffering), no prefix sharing, no CPU offload space
(soft reset: on CPU the pinned swap pool cannot be made), no CUDA graphs, each scheduler's own
safety margin.  A bare run uses the native settings below (``CBATCH_NATIVE_CONFIG``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from pytest_cbatch.engine_report import EventLog, engine_report, engine_run_input, engine_step, row_phase

from .engine import MIN_PAGE_SIZE, TRANSFORMERS_VERSION, Engine, EngineSettings, finished

__all__ = ["FIFO", "PREFILL_FIRST", "Adapter", "engine_settings", "simulate"]

# A prefill_chunk no workload reaches: the engine has no per-row limit (see the mapping table).
UNBOUNDED_CHUNK = 1 << 16


def engine_settings(config: dict[str, Any], scheduler_type: str) -> EngineSettings:
    """Map a validated kit config to transformers settings; NotImplementedError names what it cannot do."""
    if config["release_delay"] != 0:
        raise NotImplementedError(f"release_delay {config['release_delay']}: transformers frees a request's blocks "
                                  "the moment it ends (only release_delay 0)")
    if config.get("admission", "optimistic") != "optimistic":
        raise NotImplementedError("admission 'reserve': transformers allocates blocks per scheduled chunk and "
                                  "preempts when they run out (only 'optimistic')")
    if config["block_size"] < MIN_PAGE_SIZE:
        raise NotImplementedError(f"block_size {config['block_size']}: transformers' page_size must be at least "
                                  f"{MIN_PAGE_SIZE}")
    if config["prefill_chunk"] < config["token_budget"]:
        raise NotImplementedError(f"prefill_chunk {config['prefill_chunk']} < token_budget {config['token_budget']}: "
                                  "transformers has no per-row prefill limit (a prefill row takes whatever token "
                                  "budget is left)")
    per_batch = 1 if config["policy"] == "serial" else config["max_active"]
    return EngineSettings(scheduler_type=scheduler_type, num_blocks=config["capacity"],
                          page_size=config["block_size"], max_batch_tokens=config["token_budget"],
                          max_requests_per_batch=per_batch)


def simulate(trace: Sequence[dict[str, Any]], *, scheduler_type: str, capacity: int, block_size: int,
             token_budget: int, max_active: int, prefill_chunk: int, release_delay: int, policy: str,
             admission: str | None = None) -> dict[str, Any]:
    """Run ``trace`` through transformers' engine with scheduler ``scheduler_type``; return the report.

    Raises ValueError for an invalid trace or config, NotImplementedError for a setting
    transformers cannot express, RuntimeError when the engine stalls or its step fails.
    """
    config, lines = engine_run_input(trace, capacity=capacity, block_size=block_size, token_budget=token_budget,
                                     max_active=max_active, prefill_chunk=prefill_chunk,
                                     release_delay=release_delay, policy=policy, admission=admission)
    run = _Run(Engine(engine_settings(config, scheduler_type)), {**config, "admission": "optimistic"}, lines,
               scheduler_type)
    run.drive()
    return run.report()


@dataclass(frozen=True)
class Adapter:
    """One scheduler of the engine as a kit implementation (what an entry point names)."""

    scheduler_type: str
    # Read by the plugin: a bare run uses these for every workload that does not test them, and
    # transformers' own log records below ERROR stay out of failure reports.
    CBATCH_NATIVE_CONFIG = {"release_delay": 0, "prefill_chunk": UNBOUNDED_CHUNK, "admission": "optimistic"}
    CBATCH_ENGINE_LOGGERS = ("transformers",)

    def simulate(self, trace: Sequence[dict[str, Any]], *, capacity: int, block_size: int, token_budget: int,
                 max_active: int, prefill_chunk: int, release_delay: int, policy: str,
                 admission: str | None = None) -> dict[str, Any]:
        """``simulate`` with this adapter's scheduler."""
        return simulate(trace, scheduler_type=self.scheduler_type, capacity=capacity, block_size=block_size,
                        token_budget=token_budget, max_active=max_active, prefill_chunk=prefill_chunk,
                        release_delay=release_delay, policy=policy, admission=admission)


FIFO = Adapter("fifo")
PREFILL_FIRST = Adapter("prefill_first")


def _prompt(index: int, length: int) -> list[int]:
    """Token ids for a prompt, distinct per request, inside the tiny model's vocabulary."""
    return [(16 + 37 * index + k) % 500 + 8 for k in range(length)]


class _Run:
    """One trace through one fresh engine; collects the contract's events."""

    def __init__(self, engine: Engine, config: dict[str, Any], lines: list[dict[str, Any]],
                 scheduler_type: str) -> None:
        self.engine = engine
        self.config = config
        self.lines = lines
        self.scheduler_type = scheduler_type
        self.log = EventLog()
        self.arrivals = {line["id"]: line for line in lines if line["event"] == "arrival"}
        self.status: dict[str, str] = {}        # queued, active, finished, cancelled
        self.held: dict[str, list[int]] = {}    # pages per request as the last snapshot showed them
        self.emitted: dict[str, int] = {}
        self.preempted: set[str] = set()
        self.cancels: list[str] = []            # cancels sent this tick, in trace order
        total = sum(line["prompt_tokens"] + line["output_tokens"] for line in self.arrivals.values())
        self.step_limit = 50 * total + 1000

    def drive(self) -> None:
        lines, i, t, steps = self.lines, 0, 0, 0
        while i < len(lines) or self.engine.pending():
            if not self.engine.pending() and lines[i]["time"] > t:
                t = lines[i]["time"]  # idle: the manager waits for new requests
            while i < len(lines) and lines[i]["time"] == t:
                self._trace_line(lines[i], t)
                i += 1
            steps += 1
            if steps > self.step_limit:
                raise RuntimeError(f"transformers made no end after {self.step_limit} steps; unfinished: "
                                   f"{self._unfinished()}")
            if not self._step(t) and self.engine.pending():
                if i == len(lines):
                    raise RuntimeError(f"transformers stalled at tick {t}: it schedules nothing while requests wait "
                                       f"(block_new_requests={self.engine.new_admissions_blocked()}); unfinished: "
                                       f"{self._unfinished()}")
                t = lines[i]["time"]  # nothing runs until the next trace line
                continue
            t += 1

    def _unfinished(self) -> str:
        return ", ".join(f"{rid} ({s})" for rid, s in self.status.items() if s in ("queued", "active"))

    def _trace_line(self, line: dict[str, Any], t: int) -> None:
        rid = line["id"]
        if line["event"] == "arrival":
            self.log.emit(t, "arrival", rid)
            self.status[rid] = "queued"
            self.engine.add(rid, _prompt(len(self.status), line["prompt_tokens"]), line["output_tokens"])
        elif self.status[rid] in ("queued", "active"):
            self.engine.cancel(rid)
            self.cancels.append(rid)
        else:
            self.log.emit(t, "cancel_ignored", rid, status=self.status[rid])

    def _step(self, t: int) -> bool:
        """One ``prepare_next_batch`` and, if it scheduled a batch, its forward and update."""
        engine = self.engine
        before = set(engine.active())
        with engine_step("transformers' prepare_next_batch", t, self._unfinished):
            ready = engine.prepare()
        sent, self.cancels = self.cancels, []
        for rid in sent:
            if self.status[rid] == "cancelled":  # a repeated cancel in one tick: the engine cancels once
                self.log.emit(t, "cancel_ignored", rid, status="cancelled")
                continue
            if rid not in engine.cancelled:
                raise RuntimeError(f"transformers did not cancel {rid!r} ({self.status[rid]}) at tick {t}")
            self.status[rid] = "cancelled"
            self.log.emit(t, "cancelled", rid)
            if self.held.pop(rid, None):
                self.log.emit(t, "release", rid)
        active, waiting = engine.active(), engine.waiting()
        for rid in sorted(before & set(waiting), key=waiting.index):
            self.status[rid] = "queued"
            self.preempted.add(rid)
            self.log.emit(t, "preempted", rid, released_blocks=len(self.held.pop(rid, [])))
        for rid in active:
            if self.status[rid] == "queued":
                self.status[rid] = "active"
                self.log.emit(t, "admit", rid, reserved_blocks=len(engine.tables().get(rid, [])))
        self._answer_lost_cancels(t)
        self._snapshot(t, len(active), len(waiting))
        if not ready:
            return False
        self._dispatch(t, engine.batch())
        for output in engine.run_batch():
            self._output(t + 1, output)
        return True

    def _answer_lost_cancels(self, t: int) -> None:
        """A cancel sent for a request the engine no longer holds is a driver bug, never silence."""
        holding = set(self.engine.active()) | set(self.engine.waiting())
        for rid, status in self.status.items():
            if status in ("queued", "active") and rid not in holding and self.engine.manager.input_queue.empty():
                raise RuntimeError(f"transformers dropped {rid!r} ({status}) with no output and no cancel")

    def _snapshot(self, t: int, active: int, queued: int) -> None:
        tables = self.engine.tables()
        self.held = dict(tables)
        free = self.engine.free_blocks()
        allocated = self.engine.capacity - free
        self.log.emit(t, "snapshot", active=active, queued=queued, reserved_blocks=allocated, draining_blocks=0,
                      allocated_blocks=allocated, free_blocks=free, admission_headroom=free, block_tables=tables)

    def _dispatch(self, t: int, batch: list[tuple[str, int, int, int]]) -> None:
        rows = [(rid, row_phase(has_output=bool(self.emitted.get(rid)), before=before, known=known,
                                preempted=rid in self.preempted), n) for rid, n, before, known in batch]
        self.log.dispatch(t, rows, self.config["token_budget"])

    def _output(self, t: int, output: Any) -> None:
        rid = output.request_id
        if output.error is not None:
            raise RuntimeError(f"transformers failed {rid!r}: {output.error}")
        for index in range(self.emitted.get(rid, 0) + 1, len(output.generated_tokens) + 1):
            self.emitted[rid] = index
            self.log.emit(t, "token", rid, output_index=index)
        if finished(output):
            self.status[rid] = "finished"
            self.log.emit(t, "finished", rid, reason="length")
            if self.held.pop(rid, None):
                self.log.emit(t, "release", rid)

    def report(self) -> dict[str, Any]:
        return engine_report(config=self.config, arrivals=self.arrivals, status=self.status, events=self.log.events,
                             dispatches=self.log.dispatches, fed=self.log.fed, free_blocks=self.engine.free_blocks(),
                             engine=f"transformers {TRANSFORMERS_VERSION} ({self.scheduler_type})")
