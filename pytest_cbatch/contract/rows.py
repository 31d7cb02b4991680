"""Clauses about dispatches and their rows: what is fed, when, within which budget.

They need the engine's dispatch events, so client-side reports skip them.
"""

from __future__ import annotations

from bisect import bisect_left
from itertools import accumulate, repeat
from operator import sub
from typing import Iterator

from .core import TERMINAL, ReportIndex, Violation, clause


@clause("pending_sample_fed_once",
        "Within one incarnation (from admission to preemption or end), the input rows fed before emitting output k "
        "total prompt + k - 1, and rows never exceed prompt plus the outputs emitted so far.",
        "The newest sampled token is fed exactly once; re-feeding it after recompute duplicates a KV row.",
        needs=("dispatch", "token"),
        admits="recompute in any chunking; any preemption victim",
        reads=("trace.prompt_tokens", "events[dispatch].work[].input_tokens", "events[preempted]", "events[token]"),
        compares={
            "events[dispatch].work[].input_tokens": "the input rows fed before emitting output k total prompt + k - 1",
        })
def _pending_sample_fed_once(ix: ReportIndex) -> Iterator[Violation]:
    cid = "pending_sample_fed_once"
    for rid, line in ix.arrivals.items():
        prompt = line["prompt_tokens"]
        if _fed_as_emitted(ix, rid, prompt):
            continue
        fed = 0
        rows = prompt   # the rows that exist to feed: prompt + outputs emitted so far
        for i, kind, n in ix.sequence(rid):
            if kind == "token":
                if fed != rows:
                    emitted = rows - prompt + 1
                    yield ix.violation(cid, f"output {emitted} emitted after {fed} input rows this incarnation; "
                                            f"expected prompt {prompt} + {emitted} - 1 = {rows}", rid, i)
                    break
                rows += 1
            elif kind == "row":
                fed += n
                if fed > rows:
                    yield ix.violation(cid, f"rows fed reach {fed} with prompt {prompt} and {rows - prompt} outputs "
                                            f"emitted: at most {rows} rows exist to feed", rid, i)
                    break
            elif kind == "preempted":
                fed = 0


def _fed_as_emitted(ix: ReportIndex, rid: str, prompt: int) -> bool:
    """Whether the request passes pending_sample_fed_once, found without walking its events.

    Within an incarnation its rows' running total only grows (a row feeds at least one token, the schema's
    minimum), so when each output k follows exactly prompt + k - 1 rows of its incarnation, a row followed by
    an output of the same incarnation fed no more than existed; only each incarnation's rows after its last
    output remain, and the last of them fed the most.
    """
    tokens, (at, fed, _) = ix.tokens(rid), ix.rows_of(rid)
    preempted = ix.of(rid, "preempted")
    total = [0, *accumulate(fed)]   # total[j]: what the first j rows fed, whatever the incarnation
    starts = [0, *map(bisect_left, repeat(at), preempted), len(at)]   # each incarnation's first row, and the end
    fed_before = list(map(total.__getitem__, map(bisect_left, repeat(at), tokens)))   # before each output
    if preempted:   # less what the incarnations before each output's fed
        since = list(map(total.__getitem__, starts[:-1]))
        fed_before = list(map(sub, fed_before, map(since.__getitem__, map(bisect_left, repeat(preempted), tokens))))
    return fed_before == list(range(prompt, prompt + len(tokens))) and all(
        total[end] - total[start] <= prompt + bisect_left(tokens, at[end - 1])
        for start, end in zip(starts, starts[1:]) if end > start)


@clause("lifecycle_order",
        "A request is admitted only while queued, runs rows only while admitted, is preempted only while "
        "admitted (then holds nothing until admitted again), and the number of admitted requests never exceeds "
        "max_active (1 under the serial policy).",
        "Rows for a request that is not admitted compute on pages it does not own.", needs=("admit", "dispatch"),
        admits=("any admission order (FIFO, shortest first, ...), any rotation, admission and scheduling in the "
                "same step"),
        reads=("config.policy", "config.max_active", "events[arrival]", "events[admit]", "events[preempted]",
               "events[finished]", "events[cancelled]", "events[rejected]", "events[dispatch].work[].id"),
        compares={
            "events[admit]": "admitted only while queued",
            "events[dispatch].work[].id": "runs rows only while admitted",
            "events[preempted]": "preempted only while admitted",
            "admitted requests": "never exceeds max_active",
        })
def _lifecycle_order(ix: ReportIndex) -> Iterator[Violation]:
    cid = "lifecycle_order"
    limit = ix.max_active()
    state: dict[str, str] = {}
    arrivals = ix.arrivals
    active = 0
    rows_admitted = all(map(_rows_while_admitted, repeat(ix), arrivals))   # then no row needs a look below
    for i in ix.steps:   # tokens change no request's state
        ev = ix.events[i]
        kind = ev["event"]
        if kind == "dispatch":
            if rows_admitted:
                continue
            for row in ev["work"]:
                rid = row["id"]
                if rid in arrivals and state.get(rid) != "active":
                    yield ix.violation(cid, f"dispatch row ({row['phase']}) while the request is "
                                            f"{state.get(rid, 'not arrived')}, not admitted", rid, i)
            continue
        rid = ev.get("id")
        if rid not in arrivals:
            continue
        now = state.get(rid)
        if kind == "arrival":
            state[rid] = "queued"
        elif kind == "admit":
            if now != "queued":
                yield ix.violation(cid, f"admitted while {now or 'not arrived'}", rid, i)
            state[rid] = "active"
            active += 1
            if active > limit:
                yield ix.violation(cid, f"{active} requests admitted at once; max_active allows {limit}", rid, i)
        elif kind == "preempted":
            if now != "active":
                yield ix.violation(cid, f"preempted while {now or 'not arrived'}", rid, i)
            else:
                active -= 1
            state[rid] = "queued"
        elif kind in TERMINAL:
            if now == "active":
                active -= 1
            state[rid] = "ended"


def _rows_while_admitted(ix: ReportIndex, rid: str) -> bool:
    """Whether every dispatch row of the request falls while lifecycle_order sees it admitted: after an admit
    and before the next arrival, preemption or terminal event naming it."""
    rows = ix.rows_of(rid)[0]
    inside = 0
    since = None   # the admit that made it active, while it is
    for i, kind in ix.marks(rid):
        if kind == "admit":
            since = i if since is None else since
        elif since is not None and (kind in ("arrival", "preempted") or kind in TERMINAL):
            inside += bisect_left(rows, i) - bisect_left(rows, since)
            since = None
    if since is not None:
        inside += len(rows) - bisect_left(rows, since)
    return inside == len(rows)


@clause("budget_respected",
        "Each dispatch feeds at most token_budget input tokens, and its unused_budget is token_budget minus "
        "what it fed.",
        "The token budget bounds step latency; overrunning it breaks every latency SLO built on it.",
        needs=("dispatch",),
        reads=("config.token_budget", "events[dispatch].work[].input_tokens", "events[dispatch].unused_budget"),
        compares={
            "events[dispatch].work[].input_tokens": "at most token_budget input tokens",
            "events[dispatch].unused_budget": "its unused_budget is token_budget minus what it fed",
        })
def _budget_respected(ix: ReportIndex) -> Iterator[Violation]:
    budget = ix.cfg["token_budget"]
    for i, used in zip(ix.dispatches, ix.dispatch_fed):
        ev = ix.events[i]
        if used > budget:
            yield ix.violation("budget_respected", f"dispatch feeds {used} tokens, token_budget is {budget}", None, i)
        elif ev["unused_budget"] != budget - used:
            yield ix.violation("budget_respected", f"unused_budget {ev['unused_budget']}, expected {budget} - {used} "
                                                   f"= {budget - used}", None, i)


@clause("row_shape",
        "A dispatch has at most one row per request and at least one row; decode rows feed exactly 1 token, only "
        "after the prompt is fed and an output exists; prefill rows feed only prompt positions; prefill and "
        "recompute rows feed at most prefill_chunk tokens; recompute rows appear only after a preemption.",
        "Malformed rows mean the batch computes positions that were never scheduled.", needs=("dispatch", "token"),
        admits="decode and prefill rows in any order and rotation; chunks of any size up to prefill_chunk",
        reads=("config.prefill_chunk", "trace.prompt_tokens", "events[dispatch].work[].id",
               "events[dispatch].work[].phase", "events[dispatch].work[].input_tokens", "events[token]",
               "events[preempted]"),
        compares={
            "events[dispatch].work": "at most one row per request and at least one row",
            "events[dispatch].work[].phase": "decode rows",
            "events[dispatch].work[].input_tokens": "feed exactly 1 token",
        })
def _row_shape(ix: ReportIndex) -> Iterator[Violation]:
    cid = "row_shape"
    chunk = ix.cfg["prefill_chunk"]
    if all(ix.events[i]["work"] for i in ix.dispatches) and all(
            _rows_well_formed(ix, rid, line["prompt_tokens"], chunk) for rid, line in ix.arrivals.items()):
        return
    fed: dict[str, int] = {}
    first_token = {rid: tokens[0] for rid in ix.arrivals if (tokens := ix.tokens(rid))}
    prompts = {rid: line["prompt_tokens"] for rid, line in ix.arrivals.items()}
    preempted: set[str] = set()
    for i in ix.steps:
        ev = ix.events[i]
        kind = ev["event"]
        if kind == "preempted":
            fed[ev["id"]] = 0
            preempted.add(ev["id"])
        elif kind == "dispatch":
            if not ev["work"]:
                yield ix.violation(cid, "dispatch with no rows", None, i)
            seen: set[str] = set()
            for row in ev["work"]:
                rid = row["id"]
                prompt = prompts.get(rid)
                if prompt is None:
                    continue
                if rid in seen:
                    yield ix.violation(cid, "two rows for the same request in one dispatch", rid, i)
                seen.add(rid)
                n, phase = row["input_tokens"], row["phase"]
                done = fed.get(rid, 0)
                problem = None
                if phase == "decode":
                    if n != 1 or done < prompt or first_token.get(rid, i) >= i:
                        emitted = bisect_left(ix.tokens(rid), i)
                        problem = (f"decode row of {n} tokens after {done} of {prompt} prompt rows and "
                                   f"{emitted} outputs; a decode row feeds 1 token once the prompt is "
                                   f"fed and an output exists")
                elif n > chunk:
                    problem = f"{phase} row of {n} tokens exceeds prefill_chunk {chunk}"
                elif phase == "prefill" and done + n > prompt:
                    problem = f"prefill row covers positions {done}..{done + n - 1} past the prompt's " \
                              f"{prompt} tokens"
                elif phase == "recompute" and rid not in preempted:
                    problem = "recompute row for a request that was never preempted"
                if problem:
                    yield ix.violation(cid, problem, rid, i)
                fed[rid] = done + n


@clause("input_tokens_accounted",
        "summary.processed_input_tokens equals the sum of all dispatched rows, and summary.dispatches the number "
        "of dispatch events.",
        "Wasted prefill on cancelled requests must show up in the token count, not vanish.", needs=("dispatch",),
        reads=("events[dispatch].work[].input_tokens", "summary.processed_input_tokens", "summary.dispatches"),
        compares={
            "summary.processed_input_tokens": "summary.processed_input_tokens equals the sum of all dispatched rows",
            "summary.dispatches": "summary.dispatches the number of dispatch events",
        })
def _input_tokens_accounted(ix: ReportIndex) -> Iterator[Violation]:
    summary = ix.report["summary"]
    total = sum(ix.dispatch_fed)
    if summary["processed_input_tokens"] != total:
        yield ix.violation("input_tokens_accounted", f"summary.processed_input_tokens "
                                                     f"{summary['processed_input_tokens']}, dispatch rows sum to {total}")
    if summary["dispatches"] != len(ix.dispatches):
        yield ix.violation("input_tokens_accounted", f"summary.dispatches {summary['dispatches']}, "
                                                     f"{len(ix.dispatches)} dispatch events")


def _rows_well_formed(ix: ReportIndex, rid: str, prompt: int, chunk: int) -> bool:
    """Whether no row of the request can break row_shape, found per incarnation without walking the events.

    A sufficient test, for the common shape (the walk judges whatever it does not clear): at most one row per
    dispatch; in each incarnation recompute rows (only after a preemption), then prefill rows, then decode
    rows, each row within prefill_chunk; the prefill rows' running total only grows (a row feeds at least one
    token, the schema's minimum), so the last of them stays within the prompt; the first decode row comes
    after the prompt is fed and after the first output, and every decode row feeds 1 token.
    """
    at, fed, phases = ix.rows_of(rid)
    if len(set(at)) != len(at):
        return False
    tokens = ix.tokens(rid)
    cuts = [0, *map(bisect_left, repeat(at), ix.of(rid, "preempted")), len(at)]
    for k, (start, end) in enumerate(zip(cuts, cuts[1:])):
        shape, sizes = phases[start:end], fed[start:end]
        recompute, prefill = shape.count("recompute"), shape.count("prefill")
        first_decode = recompute + prefill
        if (recompute and not k) or shape[:recompute].count("recompute") != recompute \
                or shape[recompute:first_decode].count("prefill") != prefill:
            return False
        done = sum(sizes[:first_decode])
        if first_decode and (max(sizes[:first_decode]) > chunk or (prefill and done > prompt)):
            return False
        if first_decode < len(sizes) and (sizes[first_decode:].count(1) != len(sizes) - first_decode
                                          or done < prompt or not tokens or tokens[0] >= at[start + first_decode]):
            return False
    return True
