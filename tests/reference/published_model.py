"""A deliberately naive, independent model of the course's published simulator (reserve admission).

Written straight from the published semantics, one token row at a time, with
plain lists (the free list searched with ``min``, reservations summed afresh):
nothing here is shared with ``reference/scheduler_sim.py``, so the two can
disagree.  ``published_report(trace, config)`` returns the report the
published program writes; the tests demand event-for-event equality.
"""

from __future__ import annotations

import math
from typing import Any


def published_report(trace: list[dict[str, Any]], config: dict[str, Any]) -> dict[str, Any]:
    cap, bs = config["capacity"], config["block_size"]
    budget_size, chunk, delay = config["token_budget"], config["prefill_chunk"], config["release_delay"]
    limit = 1 if config["policy"] == "serial" else config["max_active"]
    lines = sorted(trace, key=lambda line: (line["time"], line["event"] == "cancel"))  # stable
    now, pos = 0, 0
    events: list[dict[str, Any]] = []
    reqs: dict[str, dict[str, Any]] = {}
    waiting: list[str] = []
    active: list[str] = []
    releases: list[tuple[int, str]] = []
    free = list(range(cap))
    pool: dict[str, list[int]] = {}   # every table, in creation order
    decode_turn = prefill_turn = dispatches = fed_total = 0

    def need(rid: str) -> int:
        r = reqs[rid]
        return math.ceil((r["prompt"] + r["output"] - 1) / bs)

    def retire(rid: str, status: str) -> None:
        r = reqs[rid]
        if r["status"] in ("prefill", "decode"):
            active.remove(rid)
            releases.append((now + delay, rid))
        else:
            waiting.remove(rid)
        r["status"], r["end"] = status, now
        events.append({"time": now, "event": status, "id": rid})

    while pos < len(lines) or waiting or active or releases:
        while pos < len(lines) and lines[pos]["time"] == now:
            line = lines[pos]
            pos += 1
            rid = line["id"]
            if line["event"] == "arrival":
                reqs[rid] = {"prompt": line["prompt_tokens"], "output": line["output_tokens"], "arrival": now,
                             "status": "queued", "admitted": None, "end": None, "prefilled": 0, "rows": 0,
                             "tokens": []}
                waiting.append(rid)
                events.append({"time": now, "event": "arrival", "id": rid})
            elif reqs[rid]["status"] in ("queued", "prefill", "decode"):
                retire(rid, "cancelled")
            else:
                events.append({"time": now, "event": "cancel_ignored", "id": rid, "status": reqs[rid]["status"]})
        for due in sorted(releases):
            if due[0] <= now:
                releases.remove(due)
                free.extend(pool.pop(due[1]))
                events.append({"time": now, "event": "release", "id": due[1]})
        while waiting and len(active) < limit:
            head = waiting[0]
            if need(head) > cap:
                retire(head, "rejected")
                continue
            draining = sum(len(pool[rid]) for _, rid in releases)
            if need(head) > cap - sum(need(rid) for rid in active) - draining:
                events.append({"time": now, "event": "admission_blocked", "id": head, "required_blocks": need(head)})
                break
            waiting.pop(0)
            reqs[head]["status"], reqs[head]["admitted"] = "prefill", now
            active.append(head)
            pool[head] = []
            events.append({"time": now, "event": "admit", "id": head, "reserved_blocks": need(head)})
        budget = budget_size
        work: list[tuple[str, str, int]] = []
        decoders = [rid for rid in active if reqs[rid]["status"] == "decode"]
        if decoders:
            k = decode_turn % len(decoders)
            order = decoders[k:] + decoders[:k]
            take = min(len(order), budget)
            work += [(rid, "decode", 1) for rid in order[:take]]
            budget -= take
            decode_turn += min(len(decoders), budget_size)
        prefillers = [rid for rid in active if reqs[rid]["status"] == "prefill"]
        if prefillers and budget > 0:
            k = prefill_turn % len(prefillers)
            added = 0
            for rid in prefillers[k:] + prefillers[:k]:
                n = min(chunk, reqs[rid]["prompt"] - reqs[rid]["prefilled"], budget)
                if n == 0:
                    break
                work.append((rid, "prefill", n))
                budget -= n
                added += 1
            prefill_turn += added
        reserved = sum(need(rid) for rid in active)
        draining = sum(len(pool[rid]) for _, rid in releases)
        events.append({
            "time": now, "event": "snapshot", "active": list(active), "queued": list(waiting),
            "reserved_blocks": reserved, "draining_blocks": draining, "allocated_blocks": cap - len(free),
            "free_blocks": len(free), "admission_headroom": cap - reserved - draining,
            "block_tables": {rid: list(table) for rid, table in pool.items()},
        })
        if not work:
            upcoming = ([lines[pos]["time"]] if pos < len(lines) else []) + [t for t, _ in releases]
            if not upcoming:
                break
            now = min(upcoming)
            continue
        used = sum(n for _, _, n in work)
        events.append({"time": now, "event": "dispatch",
                       "work": [{"id": rid, "phase": phase, "input_tokens": n} for rid, phase, n in work],
                       "unused_budget": budget_size - used})
        dispatches += 1
        fed_total += used
        now += 1
        for rid, phase, n in work:
            r = reqs[rid]
            for _ in range(n):  # one KV row at a time: a new page when the tail is full or absent
                if r["rows"] % bs == 0:
                    page = min(free)
                    free.remove(page)
                    pool[rid].append(page)
                r["rows"] += 1
            if phase == "prefill":
                r["prefilled"] += n
                if r["prefilled"] < r["prompt"]:
                    continue
                r["status"] = "decode"
            r["tokens"].append(now)
            events.append({"time": now, "event": "token", "id": rid, "output_index": len(r["tokens"])})
            if len(r["tokens"]) == r["output"]:
                retire(rid, "finished")
    requests = {}
    for rid, r in reqs.items():
        times = r["tokens"]
        requests[rid] = {
            "status": r["status"], "arrival": r["arrival"], "admitted": r["admitted"], "end": r["end"],
            "output_tokens": len(times), "token_times": times,
            "queue_ticks": None if r["admitted"] is None else r["admitted"] - r["arrival"],
            "ttft_ticks": times[0] - r["arrival"] if times else None,
            "itl_ticks": [b - a for a, b in zip(times, times[1:])],
        }
    statuses = [r["status"] for r in reqs.values()]
    return {
        "schema_version": 1, "time_unit": "synthetic_tick",
        "config": {k: config[k] for k in ("capacity", "block_size", "token_budget", "max_active", "prefill_chunk",
                                          "release_delay", "policy")},
        "requests": requests, "events": events,
        "summary": {"drained_at_tick": now, "dispatches": dispatches, "processed_input_tokens": fed_total,
                    "free_blocks": len(free), "finished": statuses.count("finished"),
                    "cancelled": statuses.count("cancelled"), "rejected": statuses.count("rejected")},
    }
