"""The course's policy written from the words of ``contract.course.PUBLISHED_SCHEDULE`` alone (docs/contract.md).

Nothing here was read from ``reference/scheduler_sim.py`` or ``published_model.py``: each step names the rule
it follows, so the rules, not a second reading of the code, are what a passing ``course_results`` pins.  It
writes only the events the results need (no snapshots, no page ids): the course leaves those open.
"""

from __future__ import annotations

from typing import Any


def simulate(trace: list[dict[str, Any]], *, capacity: int, block_size: int, token_budget: int, max_active: int,
             prefill_chunk: int, release_delay: int, policy: str, admission: str = "reserve") -> dict[str, Any]:
    if admission != "reserve":
        raise NotImplementedError("the rules are the course's: reserve admission only")
    lines = sorted(trace, key=lambda line: (line["time"], line["event"] == "cancel"))  # rule 1
    limit = 1 if policy == "serial" else max_active                                     # rule 4
    events: list[dict[str, Any]] = []
    req: dict[str, dict[str, Any]] = {}
    queue: list[str] = []
    running: list[str] = []          # admission order (rule 4)
    unreleased: dict[str, tuple[int, int]] = {}   # ended while running: id -> (release tick, pages) (rule 3)
    d = p = 0                        # rule 6
    dispatches = processed = 0
    now, nxt = 0, 0

    def pages(rid: str) -> int:
        return -(-req[rid]["fed"] // block_size)

    def need(rid: str) -> int:
        r = req[rid]
        return -(-(r["prompt"] + r["output"] - 1) // block_size)

    def end(rid: str, status: str) -> None:
        r = req[rid]
        if rid in running:           # rule 3: leaves the running set, its pages released later
            running.remove(rid)
            unreleased[rid] = (now + release_delay, pages(rid))
        else:
            queue.remove(rid)
        r["status"], r["end"] = status, now
        events.append({"time": now, "event": status, "id": rid})

    while True:
        while nxt < len(lines) and lines[nxt]["time"] == now:       # rule 2: the trace lines of this tick
            line = lines[nxt]
            nxt += 1
            rid = line["id"]
            if line["event"] == "arrival":
                req[rid] = {"prompt": line["prompt_tokens"], "output": line["output_tokens"], "arrival": now,
                            "admitted": None, "end": None, "status": "queued", "fed": 0, "tokens": []}
                queue.append(rid)
                events.append({"time": now, "event": "arrival", "id": rid})
            elif req[rid]["end"] is None:
                end(rid, "cancelled")
        for rid, (due, _) in sorted(unreleased.items()):           # rule 2: the releases due
            if due <= now:
                del unreleased[rid]
                events.append({"time": now, "event": "release", "id": rid})
        while queue and len(running) < limit:                        # rule 4: admission
            head = queue[0]
            if need(head) > capacity:
                end(head, "rejected")
                continue
            free = capacity - sum(need(r) for r in running) - sum(n for _, n in unreleased.values())
            if need(head) > free:
                break
            queue.pop(0)
            running.append(head)
            req[head]["admitted"], req[head]["status"] = now, "active"
            events.append({"time": now, "event": "admit", "id": head, "reserved_blocks": need(head)})
        budget, rows = token_budget, []                              # rule 5: planning
        decoding = [r for r in running if req[r]["fed"] >= req[r]["prompt"]]
        prefilling = [r for r in running if req[r]["fed"] < req[r]["prompt"]]
        if decoding:
            k = d % len(decoding)
            for rid in (decoding[k:] + decoding[:k])[:min(len(decoding), token_budget)]:
                rows.append((rid, "decode", 1))
                budget -= 1
        decode_rows = len(rows)
        if prefilling and budget > 0:
            k = p % len(prefilling)
            for rid in prefilling[k:] + prefilling[:k]:
                if budget == 0:
                    break
                n = min(prefill_chunk, req[rid]["prompt"] - req[rid]["fed"], budget)
                rows.append((rid, "prefill", n))
                budget -= n
        d += decode_rows                                             # rule 6
        p += len(rows) - decode_rows
        if not rows:                                                 # rule 8: idle
            upcoming = [lines[nxt]["time"]] if nxt < len(lines) else []
            upcoming += [due for due, _ in unreleased.values()]
            if not upcoming:
                break
            now = min(upcoming)
            continue
        used = sum(n for _, _, n in rows)                            # rule 7: the dispatch
        events.append({"time": now, "event": "dispatch", "unused_budget": token_budget - used,
                       "work": [{"id": rid, "phase": phase, "input_tokens": n} for rid, phase, n in rows]})
        dispatches += 1
        processed += used
        now += 1
        for rid, phase, n in rows:
            r = req[rid]
            r["fed"] += n
            if phase == "decode" or r["fed"] == r["prompt"]:
                r["tokens"].append(now)
                events.append({"time": now, "event": "token", "id": rid, "output_index": len(r["tokens"])})
                if len(r["tokens"]) == r["output"]:
                    end(rid, "finished")
    requests = {}
    for rid, r in req.items():                                       # rule 9: results
        times = r["tokens"]
        requests[rid] = {"status": r["status"], "arrival": r["arrival"], "admitted": r["admitted"], "end": r["end"],
                         "output_tokens": len(times), "token_times": times,
                         "queue_ticks": None if r["admitted"] is None else r["admitted"] - r["arrival"],
                         "ttft_ticks": times[0] - r["arrival"] if times else None,
                         "itl_ticks": [b - a for a, b in zip(times, times[1:])]}
    statuses = [r["status"] for r in req.values()]
    return {"schema_version": 1, "time_unit": "synthetic_tick",
            "config": {"capacity": capacity, "block_size": block_size, "token_budget": token_budget,
                       "max_active": max_active, "prefill_chunk": prefill_chunk, "release_delay": release_delay,
                       "policy": policy},
            "requests": requests, "events": events,
            "summary": {"drained_at_tick": now, "dispatches": dispatches, "processed_input_tokens": processed,
                        "free_blocks": capacity, "finished": statuses.count("finished"),
                        "cancelled": statuses.count("cancelled"), "rejected": statuses.count("rejected")}}
