"""Self-contained workloads and schedules (no scheduler implementation needed).

* :func:`fcfs_schedule` — a small FCFS continuous-batching planner emitting the
  kit's report events (``dispatch``, ``token``, ``preempted``, ``finished``,
  ``cancelled``, ``release``): token budget, chunked prefill, one-token
  decodes, scripted preemptions followed by recompute rows.  It makes
  ``python -m gpu_checks`` independent of any scheduler; the pytest suite is
  driven by the implementation under test instead.
* :func:`alone_schedule` — every request alone, all its positions in one row.
* Traces with lengths on and around page boundaries, and the scheduler
  configs the suite uses with them (``SUITE_WORKLOADS``), including the
  long-context ones: a 1,100-token prompt prefilled in 256-token chunks next
  to short requests, decoding past 1,100 keys on 70+ pages, with and without
  a preemption that recomputes 1,000+ rows.
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

from .sizes import DECODE_GRAPH_ROWS, PAD_TO, key_intervals, size_parameters

__all__ = ["Workload", "SUITE_WORKLOADS", "numerics_workloads", "reference_simulate", "fcfs_schedule", "alone_schedule", "boundary_trace", "arrivals",
           "boundary_workload"]


def alone_schedule(fed_lens: Mapping[str, int]) -> list[dict[str, Any]]:
    """Events running each request alone: one row feeding all ``fed_lens[id]`` positions."""
    events: list[dict[str, Any]] = []
    for t, (rid, n) in enumerate(fed_lens.items()):
        events.append({"time": t, "event": "dispatch", "unused_budget": 0,
                       "work": [{"id": rid, "phase": "prefill", "input_tokens": n}]})
        events.append({"time": t + 1, "event": "finished", "id": rid})
    return events


@dataclass
class _Req:
    rid: str
    prompt: int
    output: int
    committed: int = 0
    emitted: int = 0
    recompute_to: int = 0

    def next_row(self, chunk: int, budget: int) -> tuple[str, int]:
        if self.committed < self.recompute_to:
            return "recompute", min(chunk, self.recompute_to - self.committed, budget)
        if self.committed < self.prompt:
            return "prefill", min(chunk, self.prompt - self.committed, budget)
        return "decode", 1


def fcfs_schedule(trace: Iterable[Mapping[str, Any]], *, token_budget: int, prefill_chunk: int,
                  max_active: int, block_size: int = 16,
                  preempt: Sequence[tuple[str, int]] = ()) -> dict[str, Any]:
    """Plan ``trace`` FCFS and return a report ``{"events": [...]}``.

    One dispatch per tick: decode rows first, then prefill/recompute rows in
    admission order, within ``token_budget``.  Each ``(id, k)`` in
    ``preempt`` preempts that request once, before the first dispatch at
    which it runs with at least ``k`` rows computed in its current
    incarnation (entries of one request fire in order); the victim loses its
    KV, goes to the front of the queue and recomputes its committed rows.
    Pages are not modelled (``block_size`` only sizes ``released_blocks``).
    Raises ValueError when a scripted preemption never fires.
    """
    lines = sorted(trace, key=lambda e: e["time"])
    script: dict[str, deque[int]] = {}
    for rid, k in preempt:
        script.setdefault(rid, deque()).append(k)
    events: list[dict[str, Any]] = []
    queue: deque[_Req] = deque()
    active: list[_Req] = []
    reqs: dict[str, _Req] = {}
    i, t = 0, 0
    while i < len(lines) or queue or active:
        while i < len(lines) and lines[i]["time"] <= t:
            line = lines[i]
            i += 1
            rid = line["id"]
            if line["event"] == "arrival":
                reqs[rid] = _Req(rid, line["prompt_tokens"], line["output_tokens"])
                queue.append(reqs[rid])
                events.append({"time": t, "event": "arrival", "id": rid})
            elif reqs[rid] in queue or reqs[rid] in active:
                events.append({"time": t, "event": "cancelled", "id": rid})
                if reqs[rid] in active:
                    active.remove(reqs[rid])
                    events.append({"time": t, "event": "release", "id": rid})
                else:
                    queue.remove(reqs[rid])
        for victim in [r for r in active if script.get(r.rid) and r.committed >= script[r.rid][0]]:
            script[victim.rid].popleft()
            active.remove(victim)
            events.append({"time": t, "event": "preempted", "id": victim.rid,
                           "released_blocks": -(-victim.committed // block_size)})
            victim.recompute_to = max(victim.recompute_to, victim.committed)
            victim.committed = 0
            queue.appendleft(victim)
        while queue and len(active) < max_active:
            active.append(queue.popleft())
        if not active:
            t = lines[i]["time"] if i < len(lines) else t + 1
            continue
        rows: list[tuple[_Req, str, int]] = []
        budget = token_budget
        decoding = [r for r in active if r.committed >= max(r.prompt, r.recompute_to)]
        for req in decoding + [r for r in active if r not in decoding]:
            if budget == 0:
                break
            phase, n = req.next_row(prefill_chunk, budget)
            rows.append((req, phase, n))
            budget -= n
        events.append({"time": t, "event": "dispatch", "unused_budget": budget,
                       "work": [{"id": r.rid, "phase": ph, "input_tokens": n} for r, ph, n in rows]})
        t += 1
        for req, phase, n in rows:
            req.committed += n
            if phase == "recompute" or req.committed < req.prompt + req.emitted:
                continue
            req.emitted += 1
            events.append({"time": t, "event": "token", "id": req.rid, "output_index": req.emitted})
            if req.emitted == req.output:
                active.remove(req)
                events.append({"time": t, "event": "finished", "id": req.rid})
                events.append({"time": t, "event": "release", "id": req.rid})
    unfired = sorted(rid for rid, left in script.items() if left)
    if unfired:
        raise ValueError(f"scripted preemptions that never fired: {unfired}")
    return {"events": events}


def boundary_trace(n_requests: int, block_size: int, chunk: int, max_len: int, seed: int,
                   gap: int = 1) -> list[dict[str, Any]]:
    """Arrivals whose prompt and output lengths sit on and around page and chunk edges.

    Lengths are drawn from {1, 2, bs-1, bs, bs+1, 2bs, chunk-1, chunk, chunk+1,
    uniform(1, max_len)}, clipped to ``max_len``; one arrival every ``gap`` ticks.
    """
    rng = random.Random(seed)
    bs = block_size
    edges = [1, 2, bs - 1, bs, bs + 1, 2 * bs, chunk - 1, chunk, chunk + 1]

    def length() -> int:
        pick = rng.choice(edges + [0, 0])
        return max(1, min(max_len, pick or rng.randint(1, max_len)))

    return [{"time": k * gap, "event": "arrival", "id": f"r{k}", "prompt_tokens": length(),
             "output_tokens": max(1, length() // 2)} for k in range(n_requests)]


def arrivals(rows: Iterable[tuple[int, str, int, int]]) -> list[dict[str, Any]]:
    """Trace lines from ``(time, id, prompt_tokens, output_tokens)`` tuples."""
    return [{"time": t, "event": "arrival", "id": rid, "prompt_tokens": p, "output_tokens": o}
            for t, rid, p, o in rows]


@dataclass(frozen=True)
class Workload:
    """A trace plus the scheduler config(s) to run it under.

    ``config`` is passed as ``simulate(trace, **config)``; ``baseline``, when
    given, is a config of the same trace without preemption to compare with.
    ``preset`` is the model the numerics run on.  :meth:`kit_reports` plans
    the same trace with the kit's own FCFS planner (same budget, chunk,
    active limit and page size; ``kit_preempt`` scripts its preemptions), for
    implementations that do not support ``config``.
    """

    name: str
    trace: list[dict[str, Any]]
    config: dict[str, Any]
    baseline: dict[str, Any] | None = None
    notes: str = ""
    preset: str = "tiny"
    kit_preempt: tuple[tuple[str, int], ...] = ()

    def kit_reports(self) -> tuple[dict[str, Any], dict[str, Any] | None]:
        """(report, baseline report or None) from :func:`fcfs_schedule`, with the config's block_size."""
        plan = {k: self.config[k] for k in ("token_budget", "prefill_chunk", "max_active", "block_size")}
        report = fcfs_schedule(self.trace, preempt=self.kit_preempt, **plan)
        report["config"] = {"block_size": self.config["block_size"]}
        baseline = None
        if self.baseline is not None:
            baseline = fcfs_schedule(self.trace, **plan)
            baseline["config"] = {"block_size": self.config["block_size"]}
        return report, baseline


def boundary_workload(block_size: int = 16, prefill_chunk: int = 256, preset: str = "narrow") -> Workload:
    """``bounds``: every size parameter of :func:`~.sizes.size_parameters` at ``n - 1``, ``n``, ``n + 1``.

    Built from the parameters: a wide group first (``DECODE_GRAPH_ROWS + 2``
    short requests decoding together, one finishing per step, so steps of
    10, 9, 8 and 7 decode rows, one of them beside a prefill); then, once it
    is done, one request per merged key interval of :func:`~.sizes.key_intervals`
    (prompt ``lo - 1``, decoding through ``lo .. hi`` keys: pages, split-KV
    partitions, the RoPE and block tables) and prompts of ``chunk - 1``,
    ``chunk`` and ``chunk + 1`` tokens.
    """
    params = size_parameters(block_size, prefill_chunk)
    wide = DECODE_GRAPH_ROWS + 2
    lines = [(0, f"w{k}", 2 + k % 4, 3 + k) for k in range(wide)]
    lines.append((1, "w-prefill", 2 * PAD_TO, 2))      # a prefill row beside the widest decode steps
    later = 3 * wide                                   # after the wide group is done
    lines += [(later, f"keys{lo}", lo - 1, hi - lo + 2) for lo, hi in key_intervals(params, block_size)]
    lines += [(later + 1, f"prompt{n}", n, 2) for p in params if p.measure == "prompt_len" for n in p.targets]
    trace = arrivals(lines)
    pages = sum(-(-(x["prompt_tokens"] + x["output_tokens"]) // block_size) for x in trace)
    config = {"block_size": block_size, "token_budget": prefill_chunk + 4 * PAD_TO, "max_active": wide + 2,
              "prefill_chunk": prefill_chunk, "release_delay": 1, "policy": "continuous", "capacity": pages + 1}
    return Workload(
        "bounds", trace, config, preset=preset,
        notes="every size parameter (page, split-KV partition, two partitions, RoPE table, block-table width, "
              "prefill chunk, batch padding, decode graph rows) at n-1, n and n+1, derived from the parameters")


def _suite_workloads() -> dict[str, Workload]:
    chunked = arrivals([(0, "a", 23, 5), (0, "b", 9, 6), (1, "c", 16, 4), (2, "d", 17, 3), (3, "e", 7, 7),
                        (4, "f", 33, 2)])
    base = {"capacity": 64, "block_size": 8, "max_active": 4, "release_delay": 1, "policy": "continuous"}
    preempt = arrivals([(0, "old", 12, 10), (0, "mid", 10, 10), (1, "new", 9, 12), (2, "late", 5, 6)])
    small = {"block_size": 4, "token_budget": 8, "max_active": 4, "prefill_chunk": 4, "release_delay": 0,
             "policy": "continuous"}
    long = arrivals([(0, "long", 1100, 40), (1, "s1", 20, 8), (2, "s2", 9, 12), (8, "late", 300, 6),
                     (10, "s3", 33, 5)])
    wide = {"block_size": 16, "token_budget": 288, "max_active": 4, "prefill_chunk": 256, "release_delay": 1,
            "policy": "continuous"}
    long_preempt = arrivals([(0, "old", 200, 120), (0, "long", 1100, 24)])
    return {
        "chunked": Workload(
            "chunked", chunked, {**base, "token_budget": 11, "prefill_chunk": 8},
            notes="8-token chunks under an 11-token budget shared with decodes: chunk ends land on, "
                  "one before and one after 8-token page boundaries"),
        "preempt": Workload(
            "preempt", preempt, {**small, "capacity": 11, "admission": "optimistic"},
            baseline={**small, "capacity": 40, "admission": "reserve"}, kit_preempt=(("new", 6), ("old", 13)),
            notes="optimistic admission on 11 pages of 4 tokens forces preemption and recompute; "
                  "the baseline reserves enough pages to never preempt"),
        "long": Workload(
            "long", long, {**wide, "capacity": 160}, preset="narrow",
            notes="a 1,100-token prompt in 256-token chunks beside short prefills and decodes, then 39 decodes "
                  "past 1,100 keys (split-KV partitions of 512) on 72 pages of 16, positions up to 1,138, "
                  "while a 300-token prompt prefills beside them"),
        "long-preempt": Workload(
            "long-preempt", long_preempt, {**wide, "capacity": 84, "admission": "optimistic"},
            baseline={**wide, "capacity": 160, "admission": "reserve"}, preset="narrow",
            kit_preempt=(("long", 1104),),
            notes="optimistic admission on 84 pages: the prompts fit (82 pages), the decodes do not, so the "
                  "1,100-token request is preempted and recomputes 1,100+ rows"),
        "bounds": boundary_workload(),
    }


SUITE_WORKLOADS: dict[str, Workload] = _suite_workloads()


def reference_simulate() -> Any:
    """The kit's reference scheduler's module (``simulate``, ``demo_trace``, ``DEFAULT_CONFIG``).

    Imported when asked for: from the installed kit, or, when ``python -m gpu_checks`` runs from a
    checkout without it, the checkout's top-level ``reference`` package.
    """
    try:
        from pytest_cbatch.reference import scheduler_sim
    except ImportError:
        from reference import scheduler_sim  # type: ignore[no-redef]
    return scheduler_sim


def numerics_workloads() -> dict[str, Workload]:
    """What the pytest suite's numerics run: the built-in ``demo`` workload, then :data:`SUITE_WORKLOADS`."""
    ref = reference_simulate()
    base = {k: v for k, v in ref.DEFAULT_CONFIG.items() if k != "admission"}
    return {"demo": Workload("demo", ref.demo_trace(), base), **SUITE_WORKLOADS}
