"""pytest-cbatch adapter: SGLang's own ``Scheduler`` driven one loop pass per tick.

Two implementations (entry points in ``pytest_cbatch.impls``), one scheduler, two kinds of request:

- ``sglang``: every request with ``ignore_eos`` (SGLang's "fixed-length" requests): ``PrefillAdder``
  reserves each running request's whole remaining output at admission, so decode never runs out
  of pages and nothing is retracted (the kit's ``reserve`` admission);
- ``sglang-retract``: requests without ``ignore_eos``: running requests are budgeted at
  ``new_token_ratio`` of their remaining output, and when decode runs out of pages
  ``update_running_batch`` retracts requests (the kit's ``optimistic`` admission, preemption by
  recompute).

The synthetic token is never the eos token, so either way a request ends at its length.  At each
tick ``t`` where SGLang holds a request:

1. trace arrivals at ``t`` first meet SGLang's front-end length check
   (``TokenizerManager._validate_one_request``: refused there, ``rejected``), then
   ``handle_generate_request``; cancels are ``abort_request``: a request still in
   ``waiting_queue`` is answered at once (``cancelled``), one being prefilled in chunks when the
   next pass drops it (``cancelled`` and ``release`` at ``t``), a running one when its abort
   finish comes out of the batch it still runs (``cancelled`` at ``t + 1``); a cancel for a
   request that has ended is ``cancel_ignored``;
2. ``get_next_batch_to_run`` (admission by ``PrefillAdder``, chunking, KV allocation,
   retraction): requests it took out of ``waiting_queue`` are ``admit``, running requests it put
   back (``is_retracted``) are ``preempted``; the pool as it left it is the ``snapshot`` (page
   tables from ``req_to_token``, free pages from the allocator); the batch's own
   ``extend_lens`` / ``prefix_lens`` (or one token per decode row) is the ``dispatch``;
3. ``run_batch`` and ``process_batch_result``: the ``BatchTokenIDOutput`` messages give the
   ``token`` events and the ends at ``t + 1`` (finish reason ``length``: ``finished``; ``abort``:
   ``cancelled`` after a trace cancel, else ``rejected``, SGLang's refusal), and a request whose
   pages SGLang took back there is ``release`` at ``t + 1``.

When SGLang holds no request the clock jumps to the next trace time.  When it schedules nothing
while requests wait and no trace line is left, the run raises (a stall, ``completes``).

Config mapping (kit setting -> SGLang ``ServerArgs``):

=================  ==========================================================
capacity           ``max_total_tokens = capacity * block_size``; page id =
                   SGLang page - 1 (page 0 is the allocator's padding page)
block_size         ``page_size``
(derived)          ``context_length = capacity * block_size``: SGLang's own
                   advice when the pool is smaller than the context ("Lower
                   --context-length"); at most the tiny model's 8192
token_budget       ``max_prefill_tokens``, and ``chunked_prefill_size`` at most
                   token_budget: SGLang's chunk budget is per batch (each
                   request added takes its tokens from it), while
                   max_prefill_tokens only stops adding once spent (a request
                   may overrun it); decode batches are bounded by
                   ``max_running_requests`` only
max_active         ``max_running_requests = min(max_active, token_budget)``:
                   a decode batch feeds one token per running request, and the
                   kit's limit is an upper bound
policy serial      ``max_running_requests = 1``
prefill_chunk      ``chunked_prefill_size = min(prefill_chunk, token_budget)``;
                   without ignore_eos at least block_size (SGLang cuts a chunk
                   down to whole pages there: a smaller one is never taken)
release_delay      only 0 (SGLang frees a request's pages when it ends)
admission          ``sglang``: reserve; ``sglang-retract``: optimistic
=================  ==========================================================

Fixed: ``schedule_policy="fcfs"``, radix cache off (trace prompts carry no token content),
overlap scheduling off, no CUDA graphs.  A bare run uses the native settings below
(``CBATCH_NATIVE_CONFIG``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from pytest_cbatch.engine_report import EventLog, engine_report, engine_run_input, engine_step, pool_tokens, row_phase

from .engine import SGLANG_VERSION, Engine, EngineSettings, batch_rows

__all__ = ["SGLANG", "SGLANG_RETRACT", "Adapter", "engine_settings", "simulate"]

CONTEXT_LENGTH_LIMIT = 8192  # max_position_embeddings of the shipped tiny config
# A loop pass that schedules nothing changes nothing SGLang's admission reads; after this many in a
# row with no trace line left, the run is a stall.
IDLE_PASSES_LIMIT = 64
NATIVE_CHUNK = 8192  # SGLang's chunked_prefill_size is in the thousands on a real server


def engine_settings(config: dict[str, Any], *, ignore_eos: bool) -> EngineSettings:
    """Map a validated kit config to SGLang settings; NotImplementedError names what it cannot do."""
    if config["release_delay"] != 0:
        raise NotImplementedError(f"release_delay {config['release_delay']}: SGLang frees a request's pages the "
                                  "moment it ends (only release_delay 0)")
    admission = config.get("admission")
    if ignore_eos and admission == "optimistic":
        raise NotImplementedError("admission 'optimistic': with ignore_eos SGLang reserves every running request's "
                                  "whole remaining output at admission and never retracts (sglang-retract admits "
                                  "optimistically)")
    if not ignore_eos and admission == "reserve":
        raise NotImplementedError("admission 'reserve': without ignore_eos SGLang budgets running requests at "
                                  "new_token_ratio of their remaining output and retracts when decode runs out "
                                  "(the sglang implementation reserves)")
    tokens = pool_tokens(config, CONTEXT_LENGTH_LIMIT)
    chunk = min(config["prefill_chunk"], config["token_budget"])
    if not ignore_eos and chunk < config["block_size"]:
        raise NotImplementedError(
            f"a prefill chunk of {chunk} (min(prefill_chunk, token_budget)) below block_size {config['block_size']}: "
            "without ignore_eos SGLang cuts a chunk down to whole pages (schedule_policy.py, "
            "_select_prefill_admission: 'extend_len = chunk_tokens_limit // self.page_size * self.page_size') and "
            "never admits a prompt longer than the chunk")
    running = 1 if config["policy"] == "serial" else min(config["max_active"], config["token_budget"])
    return EngineSettings(max_total_tokens=tokens, max_running_requests=running,
                          chunked_prefill_size=chunk, max_prefill_tokens=config["token_budget"],
                          context_length=tokens, page_size=config["block_size"])


def simulate(trace: Sequence[dict[str, Any]], *, ignore_eos: bool, capacity: int, block_size: int,
             token_budget: int, max_active: int, prefill_chunk: int, release_delay: int, policy: str,
             admission: str | None = None) -> dict[str, Any]:
    """Run ``trace`` through SGLang's scheduler, every request with ``ignore_eos`` or none; the report.

    Raises ValueError for an invalid trace or config, NotImplementedError for a setting SGLang
    cannot express, RuntimeError when SGLang stalls or makes no end.
    """
    config, lines = engine_run_input(trace, capacity=capacity, block_size=block_size, token_budget=token_budget,
                                     max_active=max_active, prefill_chunk=prefill_chunk,
                                     release_delay=release_delay, policy=policy, admission=admission)
    settings = engine_settings(config, ignore_eos=ignore_eos)
    recorded = dict(config) if ignore_eos else {**config, "admission": "optimistic"}
    run = _Run(Engine(settings), recorded, lines, ignore_eos)
    run.drive()
    return run.report()


@dataclass(frozen=True)
class Adapter:
    """SGLang's scheduler with one kind of request, as a kit implementation (what an entry point names)."""

    ignore_eos: bool
    # SGLang's log records below ERROR (its retraction notices, length refusals) stay out of failure reports.
    CBATCH_ENGINE_LOGGERS = ("sglang",)

    @property
    def CBATCH_NATIVE_CONFIG(self) -> dict[str, Any]:  # noqa: N802 (the name the plugin reads)
        """A bare run uses these for every workload that does not test them: release_delay 0 (SGLang
        frees pages when a request ends) and, without ignore_eos, a chunk of SGLang's own order
        (a chunk below a page is never taken there; the token budget still bounds it) and the admission
        it does, optimistic (it retracts)."""
        return ({"release_delay": 0} if self.ignore_eos
                else {"release_delay": 0, "prefill_chunk": NATIVE_CHUNK, "admission": "optimistic"})

    def simulate(self, trace: Sequence[dict[str, Any]], *, capacity: int, block_size: int, token_budget: int,
                 max_active: int, prefill_chunk: int, release_delay: int, policy: str,
                 admission: str | None = None) -> dict[str, Any]:
        """``simulate`` with this adapter's kind of request."""
        return simulate(trace, ignore_eos=self.ignore_eos, capacity=capacity, block_size=block_size,
                        token_budget=token_budget, max_active=max_active, prefill_chunk=prefill_chunk,
                        release_delay=release_delay, policy=policy, admission=admission)


SGLANG = Adapter(ignore_eos=True)
SGLANG_RETRACT = Adapter(ignore_eos=False)


def _prompt(index: int, length: int) -> list[int]:
    """Token ids for a prompt, distinct per request, inside the tiny model's vocabulary."""
    return [(16 + 37 * index + k) % 500 + 8 for k in range(length)]


class _Run:
    """One trace through one fresh SGLang scheduler; collects the contract's events."""

    def __init__(self, engine: Engine, config: dict[str, Any], lines: list[dict[str, Any]], ignore_eos: bool) -> None:
        self.engine = engine
        self.config = config
        self.lines = lines
        self.ignore_eos = ignore_eos
        self.log = EventLog()
        self.arrivals = {line["id"]: line for line in lines if line["event"] == "arrival"}
        # SGLang aborts every request whose rid *starts with* the aborted one (abort_request); its own
        # front end gives uuid4 hex rids, none a prefix of another: the same fixed-width form here.
        self.rid = {kid: f"{k:032x}" for k, kid in enumerate(self.arrivals)}
        self.kid = {rid: kid for kid, rid in self.rid.items()}
        self.status: dict[str, str] = {}          # queued, active, finished, cancelled, rejected
        self.reqs: dict[str, Any] = {}            # SGLang's Req objects, by kit id
        self.held: dict[str, list[int]] = {}      # pages per request as the last look showed them
        self.cancels: dict[str, list[int]] = {}   # cancels of a running request SGLang has not answered yet
        self.emitted: dict[str, int] = {}
        self.preempted: set[str] = set()
        total = sum(line["prompt_tokens"] + line["output_tokens"] for line in self.arrivals.values())
        self.step_limit = 50 * total + 1000

    # -- the loop --------------------------------------------------------------

    def drive(self) -> None:
        lines, i, t, steps, idle = self.lines, 0, 0, 0, 0
        while i < len(lines) or not self.engine.idle():
            if self.engine.idle() and lines[i]["time"] > t:
                t = lines[i]["time"]  # SGLang idles: no pass until the next request comes
            while i < len(lines) and lines[i]["time"] == t:
                self._trace_line(lines[i], t)
                i += 1
            if not self.engine.idle():
                steps += 1
                if steps > self.step_limit:
                    raise RuntimeError(f"SGLang made no end after {self.step_limit} loop passes; "
                                       f"unfinished: {self._unfinished()}")
                idle = 0 if self._step(t) else idle + 1
                if idle > IDLE_PASSES_LIMIT and i == len(lines):
                    raise RuntimeError(f"SGLang stalled at tick {t}: {idle} loop passes scheduled nothing while "
                                       f"requests wait ({self.engine.free_slots()} of "
                                       f"{self.engine.settings.max_total_tokens} KV slots free); unfinished: "
                                       f"{self._unfinished()}")
            t += 1

    def _unfinished(self) -> str:
        left = [f"{rid} ({s})" for rid, s in self.status.items() if s in ("queued", "active")]
        return ", ".join(left[:8]) + (f" and {len(left) - 8} more" if len(left) > 8 else "")

    def _trace_line(self, line: dict[str, Any], t: int) -> None:
        kid = line["id"]
        if line["event"] == "arrival":
            self.log.emit(t, "arrival", kid)
            refusal = self.engine.front_end_refusal(line["prompt_tokens"], line["output_tokens"])
            if refusal:
                self.status[kid] = "rejected"
                self.log.emit(t, "rejected", kid, reason=refusal)
                return
            self.status[kid] = "queued"
            self.engine.add(self.rid[kid], _prompt(len(self.status), line["prompt_tokens"]), line["output_tokens"],
                            ignore_eos=self.ignore_eos)
            self.reqs[kid] = self.engine.waiting_req(self.rid[kid])
            self._sent(t)
            if self.reqs[kid] is None and self.status[kid] == "queued":
                raise RuntimeError(f"SGLang neither queued nor answered {kid!r}")
        elif self.status[kid] not in ("queued", "active"):
            self.log.emit(t, "cancel_ignored", kid, status=self.status[kid])
        elif kid in self.cancels:
            self.cancels[kid].append(t)  # SGLang already aborts it; answered with the first
        else:
            self.cancels[kid] = [t]
            self.engine.abort(self.rid[kid])
            self._sent(t)

    def _step(self, t: int) -> bool:
        """One loop pass; whether it ran a batch."""
        engine = self.engine
        waiting = set(engine.waiting())
        with engine_step("SGLang's get_next_batch_to_run", t, self._unfinished):
            batch = engine.schedule()
        self._sent(t)  # an abort of a chunked prefill is carried out here
        now_waiting = engine.waiting()
        for rid in now_waiting:
            kid = self.kid[rid]
            if self.status[kid] == "active":
                self.status[kid] = "queued"
                self.preempted.add(kid)
                self.log.emit(t, "preempted", kid, released_blocks=len(self.held.pop(kid, [])))
        tables = self._tables(batch)
        for rid in sorted(waiting - set(now_waiting)):
            kid = self.kid[rid]
            if self.status[kid] == "queued":
                self.status[kid] = "active"
                self.log.emit(t, "admit", kid, reserved_blocks=len(tables.get(kid, [])))
        self._snapshot(t, tables, [self.kid[rid] for rid in now_waiting])
        if batch:
            self._dispatch(t, batch)
        with engine_step("SGLang's run_batch / process_batch_result", t, self._unfinished):
            record = engine.run(batch)
        self._messages(t + 1, record.outputs, record.aborts)
        return batch is not None

    # -- what SGLang sent -------------------------------------------------------

    def _sent(self, t: int) -> None:
        outputs, aborts = self.engine.sent()
        self._messages(t, outputs, aborts)

    def _messages(self, t: int, outputs: list[Any], aborts: list[Any]) -> None:
        for output in outputs:
            for rid, ids, reason in zip(output.rids, output.output_ids, output.finished_reasons):
                self._output(t, self._known(rid), len(ids), reason)
        for abort in aborts:
            kid = self._known(abort.rid)
            self._end(t, kid, "cancelled" if kid in self.cancels else "rejected", reason=abort.finished_reason)
        for kid in list(self.held):
            if self.status[kid] not in ("queued", "active") and not self.engine.table(self.reqs[kid]):
                self.held.pop(kid)
                self.log.emit(t, "release", kid)

    def _known(self, rid: str) -> str:
        if rid not in self.kid:
            raise RuntimeError(f"SGLang sent a message for a request it was never given: {rid!r}")
        return self.kid[rid]

    def _output(self, t: int, kid: str, count: int, reason: dict[str, Any] | None) -> None:
        if self.status[kid] not in ("queued", "active"):
            raise RuntimeError(f"SGLang sent output for {kid!r} after it ended {self.status[kid]}")
        for _ in range(count):
            self.emitted[kid] = self.emitted.get(kid, 0) + 1
            self.log.emit(t, "token", kid, output_index=self.emitted[kid])
        if reason is None:
            return
        if reason.get("type") == "abort":
            self._end(t, kid, "cancelled" if kid in self.cancels else "rejected", reason=reason)
        else:
            self._end(t, kid, "finished")

    def _end(self, t: int, kid: str, status: str, reason: Any = None) -> None:
        """``kid`` ended ``status``; cancels SGLang had not answered yet are answered with it."""
        self.status[kid] = status
        fields = {"reason": reason["message"]} if status == "rejected" and isinstance(reason, dict) else {}
        self.log.emit(t, status, kid, **fields)
        cancels = self.cancels.pop(kid, [])
        for _ in cancels[1 if status == "cancelled" else 0:]:
            self.log.emit(t, "cancel_ignored", kid, status=status)

    # -- events ----------------------------------------------------------------

    def _tables(self, batch: Any) -> dict[str, list[int]]:
        return {self.kid[rid]: [page - 1 for page in pages] for rid, pages in self.engine.pages(batch).items() if pages}

    def _snapshot(self, t: int, tables: dict[str, list[int]], queued: list[str]) -> None:
        self.held.update(tables)
        free = self.engine.free_slots() // self.config["block_size"]
        allocated = self.config["capacity"] - free
        active = [kid for kid, s in self.status.items() if s == "active"]
        self.log.emit(t, "snapshot", active=active, queued=queued, reserved_blocks=allocated, draining_blocks=0,
                   allocated_blocks=allocated, free_blocks=free, admission_headroom=free, block_tables=tables)

    def _dispatch(self, t: int, batch: Any) -> None:
        rows = []
        for rid, n, before in batch_rows(batch):
            kid = self.kid[rid]
            known = self.arrivals[kid]["prompt_tokens"] + self.emitted.get(kid, 0)
            rows.append((kid, row_phase(has_output=bool(self.emitted.get(kid)), before=before, known=known,
                                        preempted=kid in self.preempted), n))
        self.log.dispatch(t, rows, self.config["token_budget"])

    def report(self) -> dict[str, Any]:
        kind = "ignore_eos" if self.ignore_eos else "retract"
        return engine_report(config=self.config, arrivals=self.arrivals, status=self.status, events=self.log.events,
                             dispatches=self.log.dispatches, fed=self.log.fed,
                             free_blocks=self.engine.free_slots() // self.config["block_size"],
                             engine=f"sglang {SGLANG_VERSION} ({kind})")
