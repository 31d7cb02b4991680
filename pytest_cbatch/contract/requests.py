"""Clauses about each request's record: arrival, end, tokens, TTFT and ITL, cancels, rejection.

Most of these are visible to a client too, so they also judge client-side
reports of live servers (``time_unit`` seconds); ``needs`` says which event
kinds each one must observe.
"""

from __future__ import annotations

from bisect import bisect_right
from itertools import islice
from operator import itemgetter, le
from typing import Iterator

from .core import TERMINAL, Replay, ReportIndex, Violation, clause, short

_MISSING = object()


@clause("config_recorded",
        "The report's own config records every setting the run asked for, admission included, with the same "
        "value (admission may be left out when the run asked for reserve, the default, as the course's simulator "
        "does).",
        "A result without its exact configuration cannot be compared or replayed, and a scheduler that ran other "
        "settings than it was asked for must not pass as having obeyed them.",
        admits="admission left out when it is reserve; extra settings of the engine's own",
        reads=("config",),
        compares={
            "config": "records every setting the run asked for, admission included, with the same value",
        })
def _config_recorded(ix: ReportIndex) -> Iterator[Violation]:
    recorded = ix.report["config"]
    for key, value in {**ix.cfg, "admission": ix.cfg.get("admission", "reserve")}.items():
        got = recorded.get(key, _MISSING)
        if got is _MISSING and key == "admission" and value == "reserve":
            continue
        if got is _MISSING or type(got) is not type(value) or got != value:
            yield ix.violation("config_recorded", f"config.{key}: the run asked for {value!r}, the report records "
                                                  f"{'nothing' if got is _MISSING else repr(got)}")


@clause("arrival_matches_trace",
        "Every trace arrival appears exactly once as an arrival event at its trace time (client-side: at its "
        "scheduled moment, within the replay's slack), the requests table has exactly the trace's ids with that "
        "arrival time, and no event names an unknown id.",
        "Missing arrivals make missing work indistinguishable from missing instrumentation.", needs=("arrival",),
        admits="any order of a tick's arrivals and cancels; client-side, arrival at the moment the request was sent",
        reads=("trace.time", "events[arrival].time", "events[*].id", "events[dispatch].work[].id", "requests",
               "requests.*.arrival"),
        compares={
            "events[arrival].time": "at its trace time",
            "requests": "exactly the trace's ids",
            "requests.*.arrival": "with that arrival time",
            "events[*].id": "no event names an unknown id",
        })
def _arrival_matches_trace(ix: ReportIndex) -> Iterator[Violation]:
    cid = "arrival_matches_trace"
    for rid, i in ix.unknown.items():
        yield ix.violation(cid, "an event names a request id that no trace arrival has", rid, i)
    table = ix.report["requests"]
    for rid in table:
        if rid not in ix.arrivals:
            yield ix.violation(cid, "requests table has a row for an id the trace never sent", rid)
    for rid, line in ix.arrivals.items():
        seen = ix.of(rid, "arrival")
        if len(seen) != 1:
            yield ix.violation(cid, f"expected exactly 1 arrival event, got {len(seen)}", rid, seen[1] if seen[1:] else None)
        elif not ix.on_time(ix.time(seen[0]), line["time"]):
            yield ix.violation(cid, f"arrival event at t={ix.time(seen[0])}, trace says {ix.when(line['time'])}",
                               rid, seen[0])
        row = table.get(rid)
        if row is None:
            yield ix.violation(cid, "missing from the requests table", rid)
        elif seen and row["arrival"] != ix.time(seen[0]):
            yield ix.violation(cid, f"requests.arrival: expected {ix.time(seen[0])} (its arrival event), got "
                                    f"{row['arrival']}", rid)
        first = ix.first_event(rid)
        if seen and first < seen[0]:
            yield ix.violation(cid, "an event for this request comes before its arrival", rid, first)


@clause("time_monotonic", "Event times never go backwards.",
        "Latency figures and replays are computed from event order and times together.",
        reads=("events[*].time",),
        compares={
            "events[*].time": "Event times never go backwards",
        })
def _time_monotonic(ix: ReportIndex) -> Iterator[Violation]:
    times = list(map(itemgetter("time"), ix.events))
    if all(map(le, times, islice(times, 1, None))) and (not times or times[0] >= 0):
        return
    last = 0
    for i, ev in enumerate(ix.events):
        t = ev["time"]
        if t < last:
            yield ix.violation("time_monotonic", f"time goes back from t={last} to t={t}", ev.get("id"), i)
        last = max(last, t)


@clause("terminal_exactly_once",
        "Every arrival reaches exactly one terminal state (finished, cancelled or rejected); the requests table "
        "records that status and its time as end, and the summary counts match.",
        "A request that never ends is a hang; one that ends twice is double-counted by every dashboard.",
        needs=TERMINAL,
        admits="an impossible request ending rejected or cancelled",
        reads=("events[finished]", "events[cancelled]", "events[rejected]", "requests.*.status", "requests.*.end",
               "summary.finished", "summary.cancelled", "summary.rejected"),
        compares={
            "terminal events": "exactly one terminal state",
            "requests.*.status": "records that status",
            "requests.*.end": "its time as end",
            "summary.finished": "the summary counts match",
            "summary.cancelled": "the summary counts match",
            "summary.rejected": "the summary counts match",
        })
def _terminal_exactly_once(ix: ReportIndex) -> Iterator[Violation]:
    cid = "terminal_exactly_once"
    counts = dict.fromkeys(TERMINAL, 0)
    table = ix.report["requests"]
    for rid in ix.arrivals:
        ends = [(i, kind) for i, kind in ix.marks(rid) if kind in TERMINAL]
        if not ends:
            yield ix.violation(cid, "never reached finished, cancelled or rejected", rid)
            continue
        if len(ends) > 1:
            names = ", ".join(f"{k} at event #{i}" for i, k in ends)
            yield ix.violation(cid, f"expected one terminal event, got {len(ends)}: {names}", rid, ends[1][0])
        i, kind = ends[0]
        counts[kind] += 1
        row = table.get(rid)
        if row is not None and (row["status"], row["end"]) != (kind, ix.time(i)):
            yield ix.violation(cid, f"requests row says status={row['status']!r} end={row['end']}, "
                                    f"events say {kind!r} at t={ix.time(i)}", rid, i)
    summary = ix.report["summary"]
    for kind in TERMINAL:
        if summary[kind] != counts[kind]:
            yield ix.violation(cid, f"summary.{kind}: expected {counts[kind]} (terminal events), got {summary[kind]}")


@clause("no_event_after_terminal",
        "After a request's terminal event the only events naming it are cancel_ignored and release.",
        "Work, tokens or admissions after the end are leaks or zombie requests.", needs=TERMINAL,
        admits="a release after the end; cancel_ignored for later cancels",
        reads=("events[*].event", "events[*].id", "events[dispatch].work[].id"),
        compares={
            "events[*].event": "the only events naming it are cancel_ignored and release",
        })
def _no_event_after_terminal(ix: ReportIndex) -> Iterator[Violation]:
    for rid in ix.arrivals:
        end = ix.terminal(rid)
        if end is None:
            continue
        # The first event after the end that may not follow it: a token, a dispatch row or another event.
        tokens, rows = ix.tokens(rid), ix.rows_of(rid)[0]
        k, j = bisect_right(tokens, end[0]), bisect_right(rows, end[0])
        late = [(tokens[k], "a token event")] if k < len(tokens) else []
        if j < len(rows):
            late.append((rows[j], "a dispatch row"))
        late += [(i, f"a {kind} event") for i, kind in ix.marks(rid)
                 if i > end[0] and kind not in ("cancel_ignored", "release") and kind not in TERMINAL][:1]
        if late:
            i, what = min(late)
            yield ix.violation("no_event_after_terminal", f"{what} after it {end[1]} at t={ix.time(end[0])}", rid, i)


@clause("ttft_matches_tokens",
        "ttft_ticks is null iff the request emitted no token; otherwise it equals the first token's time minus "
        "the arrival time.",
        "TTFT must never be manufactured (as 0 or otherwise) for a request that produced no output.",
        needs=("token", "arrival"),
        admits="client-side, times in seconds from the moment the request was sent",
        reads=("requests.*.ttft_ticks", "events[token].time", "events[arrival].time", "events[cancelled]"),
        compares={
            "requests.*.ttft_ticks": "null iff the request emitted no token; otherwise it equals the first token's "
                                     "time minus the arrival time",
        })
def _ttft_matches_tokens(ix: ReportIndex) -> Iterator[Violation]:
    for rid, line, row in ix.rows():
        tokens = ix.tokens(rid)
        if not tokens:
            end = ix.terminal(rid)
            if end is not None and end[1] == "cancelled":
                continue  # ttft_null_on_cancel states this case
            if row["ttft_ticks"] is not None:
                yield ix.violation("ttft_matches_tokens", f"no token was emitted: expected ttft_ticks null, got "
                                                          f"{row['ttft_ticks']}", rid)
        else:
            first, arrived = ix.time(tokens[0]), ix.arrived_at(rid)
            expected = first - arrived
            if row["ttft_ticks"] is None or abs(row["ttft_ticks"] - expected) > (1e-9 if ix.seconds else 0):
                yield ix.violation("ttft_matches_tokens", f"expected ttft_ticks {expected} (first token t={first} "
                                                          f"- arrival t={arrived}), got {row['ttft_ticks']}",
                                   rid, tokens[0])


@clause("ttft_null_on_cancel",
        "A request cancelled before its first token has ttft_ticks null, no token events, output_tokens 0 and "
        "empty token_times.",
        "Reporting TTFT 0 for cancelled requests makes p50 TTFT look better the more requests are cancelled.",
        needs=("token", "cancelled"),
        reads=("events[cancelled]", "events[token]", "requests.*.ttft_ticks", "requests.*.output_tokens",
               "requests.*.token_times"),
        compares={
            "events[token]": "no token events",
            "requests.*.ttft_ticks": "ttft_ticks null",
            "requests.*.output_tokens": "output_tokens 0",
            "requests.*.token_times": "empty token_times",
        })
def _ttft_null_on_cancel(ix: ReportIndex) -> Iterator[Violation]:
    for rid in ix.arrivals:
        end = ix.terminal(rid)
        if end is None or end[1] != "cancelled":
            continue
        late = ix.tokens(rid)
        if late and late[0] < end[0]:
            continue
        row = ix.report["requests"].get(rid)
        if late:
            yield ix.violation("ttft_null_on_cancel", "cancelled before its first token, yet a token event follows",
                               rid, late[0])
        if row is not None and (row["ttft_ticks"] is not None or row["output_tokens"] or row["token_times"]):
            yield ix.violation("ttft_null_on_cancel",
                               f"cancelled before its first token: expected ttft_ticks null, output_tokens 0, "
                               f"token_times []; got {row['ttft_ticks']}, {row['output_tokens']}, "
                               f"{row['token_times']}", rid, end[0])


@clause("itl_empty_for_one_token",
        "A request whose tokens all arrived at one time (exactly one token, or one data frame) has an empty "
        "itl_ticks list.",
        "There is no inter-token interval with one token; a [0] entry drags every ITL percentile down.",
        needs=("token",),
        admits="client-side, several tokens in one data frame",
        reads=("events[token].time", "requests.*.itl_ticks"),
        compares={
            "requests.*.itl_ticks": "an empty itl_ticks list",
        })
def _itl_empty_for_one_token(ix: ReportIndex) -> Iterator[Violation]:
    for rid, _, row in ix.rows():
        if len(ix.frame_times(rid)) == 1 and row["itl_ticks"] != []:
            yield ix.violation("itl_empty_for_one_token", f"{len(ix.tokens(rid))} token(s) at one time: expected "
                                                          f"itl_ticks [], got {row['itl_ticks']}", rid)


@clause("itl_matches_tokens",
        "itl_ticks holds the differences of consecutive distinct token times: one entry fewer than the tokens "
        "for an engine, which emits one token per request per dispatch; one per data frame after the first for "
        "a client, as vLLM's bench serve computes it.",
        "ITL percentiles are only comparable across engines when computed the same way.", needs=("token",),
        admits="client-side, several tokens in one data frame (vLLM merges frames when the HTTP side lags)",
        reads=("events[token].time", "requests.*.itl_ticks"),
        compares={
            "requests.*.itl_ticks": "the differences of consecutive distinct token times",
        })
def _itl_matches_tokens(ix: ReportIndex) -> Iterator[Violation]:
    tolerance = 1e-9 if ix.seconds else 0
    for rid, line, row in ix.rows():
        times = ix.frame_times(rid)
        if len(times) == 1:
            continue  # the one-token case has its own clause
        expected = [b - a for a, b in zip(times, times[1:])]
        got = row["itl_ticks"]
        if got == expected:   # equal entries differ by 0, within any tolerance
            continue
        if len(got) != len(expected) or any(abs(g - e) > tolerance for g, e in zip(got, expected)):
            yield ix.violation("itl_matches_tokens", f"expected itl_ticks {short(expected)} from token times "
                                                     f"{short(times)}, got {short(got)}", rid)


@clause("token_record_consistent",
        "The requests table's token_times and output_tokens agree with the request's token events.",
        "The summary table and the event trace must tell the same story.", needs=("token",),
        reads=("events[token].time", "requests.*.token_times", "requests.*.output_tokens"),
        compares={
            "requests.*.token_times": "token_times",
            "requests.*.output_tokens": "output_tokens",
        })
def _token_record_consistent(ix: ReportIndex) -> Iterator[Violation]:
    for rid, line, row in ix.rows():
        times = ix.token_times(rid)
        if row["token_times"] != times:
            yield ix.violation("token_record_consistent", f"token_times {short(row['token_times'])} but token "
                                                          f"events at {short(times)}", rid)
        if row["output_tokens"] != len(times):
            yield ix.violation("token_record_consistent", f"output_tokens {row['output_tokens']} but "
                                                          f"{len(times)} token events", rid)


@clause("finished_outputs_complete",
        "A finished request emitted exactly its requested output tokens, its finished event at its last token's "
        "time (client-side: at or after it); a request that is not finished emitted fewer.",
        "Finishing early truncates answers; emitting more than asked ignores max_tokens.", needs=("token", "finished"),
        admits=("client-side, the finish frame after the last token frame; client-side, where the server refused "
                "ignore_eos (server.ignore_eos false), fewer tokens for a row whose finish_reason is 'stop' (an "
                "end-of-sequence token: its length could not be forced)"),
        reads=("trace.output_tokens", "events[token].time", "events[finished].time", "events[cancelled]",
               "events[rejected]", "server.ignore_eos", "requests.*.finish_reason"),
        compares={
            "number of events[token]": "exactly its requested output tokens",
            "events[finished].time": "its finished event at its last token's time",
        })
def _finished_outputs_complete(ix: ReportIndex) -> Iterator[Violation]:
    unforced = "server.ignore_eos" in ix.honoured and ix.report.get("server", {}).get("ignore_eos") is False
    for rid, line in ix.arrivals.items():
        end = ix.terminal(rid)
        tokens = ix.tokens(rid)
        want = line["output_tokens"]
        if end is not None and end[1] == "finished":
            stopped = unforced and ix.report["requests"].get(rid, {}).get("finish_reason") == "stop"
            if len(tokens) != want and not (stopped and len(tokens) < want):
                yield ix.violation("finished_outputs_complete", f"finished after {len(tokens)} of {want} requested "
                                                                f"tokens", rid, end[0])
            else:
                last, done = ix.time(tokens[-1]), ix.time(end[0])
                if done < last or (done != last and not ix.seconds):
                    yield ix.violation("finished_outputs_complete", f"finished at t={done}, last token at t={last}",
                                       rid, end[0])
        elif len(tokens) >= want:
            yield ix.violation("finished_outputs_complete", f"emitted {len(tokens)} tokens of {want} requested but "
                                                            f"is not finished", rid, tokens[-1])


@clause("queue_ticks_consistent",
        "admitted is the time of the request's first admit event (null if never admitted) and queue_ticks is "
        "admitted minus arrival (null if never admitted).",
        "Queueing delay is the first thing capacity planning reads.", needs=("admit",),
        reads=("events[admit].time", "events[arrival].time", "requests.*.admitted", "requests.*.queue_ticks"),
        compares={
            "requests.*.admitted": "the time of the request's first admit event",
            "requests.*.queue_ticks": "admitted minus arrival",
        })
def _queue_ticks_consistent(ix: ReportIndex) -> Iterator[Violation]:
    for rid, line, row in ix.rows():
        admits = ix.of(rid, "admit")
        admitted = ix.time(admits[0]) if admits else None
        queue = None if admitted is None else admitted - ix.arrived_at(rid)
        if (row["admitted"], row["queue_ticks"]) != (admitted, queue):
            yield ix.violation("queue_ticks_consistent", f"expected admitted={admitted} queue_ticks={queue}, got "
                                                         f"admitted={row['admitted']} queue_ticks={row['queue_ticks']}",
                               rid, admits[0] if admits else None)


@clause("no_duplicate_emission",
        "A request's token events carry output_index 1, 2, 3, ... in order with no repeat and no gap, across "
        "preemption and recompute.",
        "After a preemption the recomputed rows must not re-send tokens the client already has.", needs=("token",),
        admits="any preemption victim and any number of preemptions",
        reads=("events[token].output_index",),
        compares={
            "events[token].output_index": "output_index 1, 2, 3, ... in order",
        })
def _no_duplicate_emission(ix: ReportIndex) -> Iterator[Violation]:
    for rid in ix.arrivals:
        indices = ix.output_indices(rid)
        if indices == list(range(1, len(indices) + 1)):
            continue
        for k, (i, index) in enumerate(zip(ix.tokens(rid), indices), start=1):
            if index != k:
                kind = "repeats an index already emitted" if index < k else "skips an index"
                yield ix.violation("no_duplicate_emission", f"token #{k} of this request has output_index "
                                                            f"{index} ({kind}); expected {k}", rid, i)
                break


@clause("cancel_idempotent",
        "Each trace cancel gets exactly one answer at its time (client-side: within the replay's slack): cancelled "
        "if the request had not ended, otherwise cancel_ignored with the status it ended with; so a second cancel, "
        "or a cancel after completion, changes nothing.",
        "Clients retry cancels; a retried cancel must not re-cancel, resurrect or double-count a request.",
        needs=("cancelled", "cancel_ignored"),
        admits="at one tick, arrivals before cancels or trace order; client-side, an answer within the replay's slack",
        reads=("trace.time", "events[cancelled].time", "events[cancel_ignored].time",
               "events[cancel_ignored].status", "events[finished]", "events[rejected]"),
        compares={
            "answers": "exactly one answer at its time",
            "events[cancelled]": "cancelled if the request had not ended",
            "events[cancel_ignored].status": "cancel_ignored with the status it ended with",
        })
def _cancel_idempotent(ix: ReportIndex) -> Iterator[Violation]:
    cid = "cancel_idempotent"
    for rid in ix.arrivals:
        marks = ix.marks(rid)
        asked = ix.cancels.get(rid, [])
        answers = [(i, kind, ix.events[i]) for i, kind in marks if kind in ("cancelled", "cancel_ignored")]
        if len(answers) != len(asked):
            yield ix.violation(cid, f"trace cancels it {len(asked)} time(s), report answers {len(answers)} "
                                    f"time(s) with cancelled/cancel_ignored", rid,
                               answers[len(asked)][0] if len(answers) > len(asked) else None)
            continue
        ended: str | None = None
        cursor = 0
        for (i, kind, ev), t in zip(answers, asked):
            while cursor < len(marks) and marks[cursor][0] < i:
                if marks[cursor][1] in TERMINAL and ended is None:
                    ended = marks[cursor][1]
                cursor += 1
            if not ix.on_time(ev["time"], t):
                yield ix.violation(cid, f"cancel sent at {ix.when(t)} answered at t={ev['time']}", rid, i)
            elif kind == "cancelled" and ended is not None:
                yield ix.violation(cid, f"cancel after the request {ended}: expected cancel_ignored "
                                        f"(status {ended!r}), got cancelled", rid, i)
            elif kind == "cancel_ignored" and ended is None:
                yield ix.violation(cid, "cancel_ignored for a request that had not ended: expected cancelled", rid, i)
            elif kind == "cancel_ignored" and ev["status"] != ended:
                yield ix.violation(cid, f"cancel_ignored says status {ev['status']!r}, the request {ended}", rid, i)
            if kind == "cancelled" and ended is None:
                ended = "cancelled"


@clause("impossible_rejected",
        "A request that cannot fit in the pool alone (ceil((prompt + output - 1) / block_size) > capacity) is never "
        "admitted and never runs: it ends rejected (at arrival or at the head of the queue, at the latest by the end "
        "of the first tick after which no other request is waiting, admitted or awaiting release), or cancelled if "
        "a cancel reaches it first; a request that fits is never rejected.",
        "An impossible request left in the queue blocks everyone behind it forever; rejecting one that fits "
        "drops a valid request.", needs=("admit", "rejected"),
        admits=("rejection at arrival or when the request reaches the head of the queue; a cancel that reaches it"
                " first"),
        reads=("trace.prompt_tokens", "trace.output_tokens", "config.block_size", "config.capacity", "events[admit]",
               "events[dispatch].work[].id", "events[rejected]", "events[cancelled]", "events[finished]",
               "events[arrival]", "events[preempted]", "events[release]", "events[*].time"),
        compares={
            "events[admit]": "never admitted",
            "events[dispatch].work[].id": "never runs",
            "events[rejected]": "it ends rejected",
            "events[rejected].time": "at the latest by the end of the first tick after which no other request is "
                                     "waiting, admitted or awaiting release",
            "events[cancelled]": "or cancelled if a cancel reaches it first",
        })
def _impossible_rejected(ix: ReportIndex) -> Iterator[Violation]:
    cid = "impossible_rejected"
    alone: dict[str, float] | None = None   # computed only when an impossible request ended
    for rid, line in ix.arrivals.items():
        need = ix.largest[rid]
        end = ix.terminal(rid)
        ended = end[1] if end else None
        if need <= ix.capacity:
            if ended == "rejected":
                yield ix.violation(cid, f"rejected although it needs only {need} of {ix.capacity} pages", rid, end[0])
            continue
        ran = next(((i, kind) for i, kind, _ in ix.sequence(rid) if kind in ("admit", "row")), None)
        if ran is not None:
            what = "admitted" if ran[1] == "admit" else "given a dispatch row"
            yield ix.violation(cid, f"needs {need} pages alone, capacity is {ix.capacity}, yet it was {what}",
                               rid, ran[0])
        elif ended not in ("rejected", "cancelled"):
            yield ix.violation(cid, f"needs {need} pages alone, capacity is {ix.capacity}: expected rejected, got "
                                    f"{ended or 'no terminal event'}", rid)
        else:
            alone = _alone_since(ix) if alone is None else alone
            if rid in alone:
                yield ix.violation(cid, f"needs {need} pages alone, capacity is {ix.capacity}: by the end of t="
                                        f"{alone[rid]} nothing else was waiting, admitted or awaiting release, so it "
                                        f"should have been rejected then; it was still waiting and ended {ended} at "
                                        f"t={ix.time(end[0])}", rid, end[0])


def _alone_since(ix: ReportIndex) -> dict[str, float]:
    """Each request that, after all the events of some time, was the only one waiting, admitted or awaiting its
    release while it had not ended: the first such time."""
    replay = Replay()
    alone: dict[str, float] = {}
    events = ix.events
    for i, ev in enumerate(events):
        replay.advance(ev)
        if i + 1 < len(events) and events[i + 1]["time"] == ev["time"]:
            continue
        members = replay.members
        open_ = members["queued"] | members["active"] | members["draining"]
        if len(open_) == 1:
            alone.setdefault(next(iter(open_)), ev["time"])
    return alone


@clause("usage_agrees",
        "Where a request row carries the server's own completion token count (usage_completion_tokens, "
        "client-side reports), it equals the tokens the client counted in the stream.",
        "A stream that loses or invents tokens while the usage frame says otherwise hides output from the client.",
        needs=("token",), reads=("requests.*.usage_completion_tokens", "events[token]"),
        compares={
            "requests.*.usage_completion_tokens": "it equals the tokens the client counted in the stream",
        })
def _usage_agrees(ix: ReportIndex) -> Iterator[Violation]:
    for rid, _, row in ix.rows():
        usage = row.get("usage_completion_tokens")
        if usage is not None and usage != len(ix.tokens(rid)):
            yield ix.violation("usage_agrees", f"the server's usage says {usage} completion tokens, the stream "
                                               f"carried {len(ix.tokens(rid))}", rid)
