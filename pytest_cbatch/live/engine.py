"""The embedded server's engine: the reference scheduler in wall-clock ticks, feeding a backend.

One asyncio task (:meth:`Engine.run`) steps the scheduler every ``tick_s``
seconds while anything is running, waiting or draining, and sleeps until
the next submission otherwise.  Each step's events drive the backend
(``preempted``, ``dispatch``) and the waiting HTTP handlers (``token``,
``finished``).  Everything runs on the server's event loop, so no locks.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from dataclasses import dataclass, field
from typing import Any

from .sampling import Backend, Sample
from .prometheus import ServerMetrics
from ..reference.scheduler_sim import Scheduler

__all__ = ["Engine", "Seq", "Job", "Rejected", "SERVE_DEFAULTS"]

# Serving-sized defaults (cbatch simulate's defaults are the seed's toy pool).
SERVE_DEFAULTS: dict[str, Any] = {
    "capacity": 1024, "block_size": 16, "token_budget": 512, "max_active": 64, "prefill_chunk": 256,
    "release_delay": 1, "policy": "continuous", "admission": "reserve",
}


class Rejected(Exception):
    """The request can never fit the pool (the scheduler's own rule, checked before it arrives)."""


@dataclass
class Seq:
    """One choice: a scheduler request, the samples it produced so far and where the handler has read to."""

    rid: str
    prompt_len: int
    max_tokens: int
    job: "Job"
    arrived: float
    samples: list[Sample] = field(default_factory=list)
    read: int = 0
    finished: bool = False
    rejected: bool = False
    last_token_at: float | None = None

    def take(self) -> list[Sample]:
        """Samples not yet sent (several when the writer fell behind)."""
        new, self.read = self.samples[self.read:], len(self.samples)
        return new


@dataclass
class Job:
    """The choices of one HTTP request and the event its handler waits on."""

    seqs: list[Seq] = field(default_factory=list)
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def finished(self) -> bool:
        return all(s.finished for s in self.seqs)


class Engine:
    """Scheduler + backend + metrics, stepped in wall-clock ticks."""

    def __init__(self, config: dict[str, Any], backend: Backend, tick_s: float) -> None:
        self.scheduler = Scheduler(**config)
        self.config = config
        self.backend = backend
        self.tick_s = tick_s
        self.metrics = ServerMetrics()
        self.seqs: dict[str, Seq] = {}
        self._pending: dict[str, Sample] = {}
        self._ids = itertools.count(1)
        self._wake = asyncio.Event()
        self.steps = 0

    def submit(self, prompts: list[list[int]], max_tokens: int) -> Job:
        """Arrive one scheduler request per prompt (at the current tick); Rejected if one can never fit."""
        bs, capacity = self.config["block_size"], self.config["capacity"]
        for prompt in prompts:
            if -(-(len(prompt) + max_tokens - 1) // bs) > capacity:
                raise Rejected(f"a prompt of {len(prompt)} tokens with max_tokens {max_tokens} can never fit "
                               f"the KV pool ({capacity} pages of {bs} tokens)")
        job = Job()
        now = time.perf_counter()
        for prompt in prompts:
            rid = f"r{next(self._ids)}"
            self.scheduler.arrive(rid, len(prompt), max_tokens)
            self.backend.add(rid, prompt)
            seq = Seq(rid, len(prompt), max_tokens, job, now)
            self.seqs[rid] = seq
            job.seqs.append(seq)
            self.metrics.prompt_tokens += len(prompt)
        self._wake.set()
        return job

    def abort(self, job: Job) -> None:
        """Cancel every unfinished choice of ``job`` (a client disconnect); a repeat is harmless."""
        for seq in job.seqs:
            if not seq.finished:
                seq.finished = True
                self.scheduler.cancel(seq.rid)
                self._end(seq.rid)
        self._wake.set()

    def _end(self, rid: str) -> None:
        self.seqs.pop(rid, None)
        self._pending.pop(rid, None)
        self.backend.drop(rid)

    def step(self) -> None:
        """One scheduler tick and everything it causes."""
        now = time.perf_counter()
        events = self.scheduler.step()
        self.scheduler.events.clear()   # a server runs for long: keep no history
        for ev in events:
            kind, rid = ev["event"], ev.get("id")
            if kind == "dispatch":
                self.metrics.iteration_tokens.observe(sum(w["input_tokens"] for w in ev["work"]))
                live = [w for w in ev["work"] if w["id"] in self.seqs]
                self._pending.update(self.backend.forward(live) if live else {})
            elif kind == "preempted" and rid in self.seqs:
                self.backend.preempt(rid)
            elif kind == "token" and rid in self.seqs:
                self._deliver(self.seqs[rid], self._pending.pop(rid), now)
            elif kind in ("finished", "rejected") and rid in self.seqs:
                seq = self.seqs[rid]
                seq.finished, seq.rejected = True, kind == "rejected"
                seq.job.changed.set()
                self._end(rid)
        self.steps += 1

    def _deliver(self, seq: Seq, sample: Sample, now: float) -> None:
        self.backend.accept(seq.rid, sample.token_id)
        seq.samples.append(sample)
        if seq.last_token_at is None:
            self.metrics.ttft.observe(now - seq.arrived)
        else:
            self.metrics.itl.observe(now - seq.last_token_at)
        seq.last_token_at = now
        self.metrics.generation_tokens += 1
        seq.job.changed.set()

    async def run(self) -> None:
        """Step every ``tick_s`` while busy; sleep until a submission when idle.  Runs until cancelled."""
        loop = asyncio.get_running_loop()
        while True:
            if not self.scheduler.busy:
                self._wake.clear()
                await self._wake.wait()
                continue
            start = loop.time()
            self.step()
            await asyncio.sleep(max(0.0, start + self.tick_s - loop.time()))
