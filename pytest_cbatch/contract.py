"""The event and snapshot contract: one named clause per property, as pure functions.

``check_report(report, trace, config)`` returns every violation of the report
clauses; it needs neither pytest nor the implementation.  Three clauses need
the implementation itself (running it twice, watching its input, feeding it
bad input); they are registered here with their statements and checked by
:mod:`pytest_cbatch.runner`.

Every clause is policy-agnostic: it holds for any correct scheduler, whatever
its admission order, rotation, chunking or preemption victims.  Each clause is
registered with ``@clause(id, statement, why)`` right above its check, so a
clause id leads to its statement and its code in one place.

A report that fails ``schema_valid`` is not checked further (the other clauses
assume well-formed events), so one malformed field gives one failure, not fifty.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping, Sequence

__all__ = [
    "CLAUSES", "RUNNER_CLAUSES", "Clause", "Violation", "ReportIndex",
    "check_report", "clause_ids", "required_blocks",
]

TERMINAL = ("finished", "cancelled", "rejected")
CONFIG_KEYS = ("capacity", "block_size", "token_budget", "max_active", "prefill_chunk", "release_delay", "policy")


@dataclass(frozen=True)
class Violation:
    """One broken clause at one place: which request, which event, what was expected."""

    clause: str
    message: str
    request: str | None = None
    event_index: int | None = None
    time: int | None = None

    def __str__(self) -> str:
        where = []
        if self.request is not None:
            where.append(f"request {self.request!r}")
        if self.event_index is not None:
            where.append(f"event #{self.event_index}")
        if self.time is not None:
            where.append(f"t={self.time}")
        place = f" ({', '.join(where)})" if where else ""
        return f"[{self.clause}]{place} {self.message}"


@dataclass(frozen=True)
class Clause:
    """A contract clause: stable id, one-sentence statement, and why it matters."""

    id: str
    statement: str
    why: str
    check: Callable[["ReportIndex"], Iterator[Violation]] | None = field(default=None, compare=False, repr=False)


CLAUSES: dict[str, Clause] = {}


def clause(cid: str, statement: str, why: str) -> Callable:
    """Register a report clause; the decorated generator yields its violations."""

    def register(fn: Callable[["ReportIndex"], Iterator[Violation]]) -> Callable:
        if cid in CLAUSES:
            raise ValueError(f"clause {cid!r} registered twice")
        CLAUSES[cid] = Clause(cid, statement, why, fn)
        return fn

    return register


RUNNER_CLAUSES: dict[str, Clause] = {
    c.id: c
    for c in (
        Clause("deterministic", "The same trace and config give an identical report twice.",
               "Verdicts and grades must be reproducible; a replayed failure must fail again."),
        Clause("input_not_mutated", "The implementation does not mutate the trace or config it is given.",
               "Callers reuse their workload objects; a scheduler that edits them corrupts later runs."),
        Clause("invalid_input_refused",
               "Invalid traces and configs are refused (an exception, or a non-zero exit) and produce no report.",
               "Garbage in must not become a plausible-looking report (booleans as integers, unknown fields, "
               "duplicate ids, cancels of unknown requests, non-positive lengths or settings)."),
    )
}


def clause_ids() -> list[str]:
    """Every clause id, report clauses first, in registration order."""
    return list(CLAUSES) + list(RUNNER_CLAUSES)


def required_blocks(prompt: int, output: int, block_size: int) -> int:
    """Pages a request needs at its largest: the last sampled token is never fed back."""
    return -(-(prompt + output - 1) // block_size)


class ReportIndex:
    """A report cross-referenced with its trace, built in one pass over the events.

    ``seq[id]`` lists, in event order, ``(event_index, kind, payload)`` for every
    event naming the request; dispatch rows appear as kind ``"row"`` with the
    work item as payload.  Nothing here judges the report; the clauses do.
    """

    def __init__(self, report: Mapping[str, Any], trace: Sequence[Mapping[str, Any]], config: Mapping[str, Any]):
        self.report = report
        self.events: list[dict[str, Any]] = report["events"]
        self.asked = dict(config)
        self.cfg: dict[str, Any] = dict(report["config"])
        self.bs: int = self.cfg["block_size"]
        self.capacity: int = self.cfg["capacity"]
        self.arrivals: dict[str, dict[str, Any]] = {}
        self.cancels: dict[str, list[int]] = {}
        for line in trace:
            if line["event"] == "arrival":
                self.arrivals[line["id"]] = line
            else:
                self.cancels.setdefault(line["id"], []).append(line["time"])
        self.seq: dict[str, list[tuple[int, str, Any]]] = {rid: [] for rid in self.arrivals}
        self.unknown: dict[str, int] = {}
        self._terminal: dict[str, tuple[int, str] | None] = {}
        self._tokens: dict[str, list[tuple[int, dict[str, Any]]]] = {}
        self.dispatches: list[int] = []
        self.snapshots: list[int] = []
        seq = self.seq
        for i, ev in enumerate(self.events):
            kind = ev["event"]
            if kind == "dispatch":
                self.dispatches.append(i)
                for row in ev["work"]:
                    self._add(row["id"], i, "row", row)
            elif kind == "snapshot":
                self.snapshots.append(i)
            elif kind.startswith("x-"):
                continue
            else:
                rid = ev["id"]
                target = seq.get(rid)
                if target is None:
                    self.unknown.setdefault(rid, i)
                else:
                    target.append((i, kind, ev))

    def _add(self, rid: str, i: int, kind: str, payload: Any) -> None:
        target = self.seq.get(rid)
        if target is None:
            self.unknown.setdefault(rid, i)
        else:
            target.append((i, kind, payload))

    def time(self, i: int) -> int:
        return self.events[i]["time"]

    def violation(self, cid: str, message: str, rid: str | None = None, i: int | None = None) -> Violation:
        return Violation(cid, message, rid, i, None if i is None else self.events[i]["time"])

    def terminal(self, rid: str) -> tuple[int, str] | None:
        """(event index, kind) of the request's first terminal event, if any."""
        if rid not in self._terminal:
            self._terminal[rid] = next(((i, kind) for i, kind, _ in self.seq[rid] if kind in TERMINAL), None)
        return self._terminal[rid]

    def tokens(self, rid: str) -> list[tuple[int, dict[str, Any]]]:
        """(event index, event) of the request's token events, in order."""
        if rid not in self._tokens:
            self._tokens[rid] = [(i, ev) for i, kind, ev in self.seq[rid] if kind == "token"]
        return self._tokens[rid]

    def rows(self) -> Iterator[tuple[str, dict[str, Any], dict[str, Any]]]:
        """(id, trace arrival line, requests-table row) for each trace request the table has."""
        table = self.report["requests"]
        for rid, line in self.arrivals.items():
            row = table.get(rid)
            if row is not None:
                yield rid, line, row

    def max_active(self) -> int:
        return 1 if self.cfg["policy"] == "serial" else self.cfg["max_active"]


def check_report(
    report: Mapping[str, Any],
    trace: Sequence[Mapping[str, Any]],
    config: Mapping[str, Any],
    *,
    clauses: Sequence[str] | None = None,
    max_per_clause: int = 20,
) -> list[Violation]:
    """Check ``report`` (produced from ``trace`` under ``config``) against the contract.

    Returns the violations of every report clause (or of ``clauses`` only), at
    most ``max_per_clause`` each plus one line counting the rest.  ``trace``
    must be a valid trace (see ``trace_format.validate_trace``).  A report that
    is not schema-valid yields only its ``schema_valid`` violations.
    """
    from .schemas import schema_issues

    issues = schema_issues(report, "report", limit=max_per_clause)
    if issues:
        return [Violation("schema_valid", f"{issue.path or '/'}: {issue.message}") for issue in issues]
    index = ReportIndex(report, trace, config)
    out: list[Violation] = []
    for cid, c in CLAUSES.items():
        if c.check is None or (clauses is not None and cid not in clauses):
            continue
        found = 0
        for v in c.check(index):
            found += 1
            if found <= max_per_clause:
                out.append(v)
        if found > max_per_clause:
            out.append(Violation(cid, f"... and {found - max_per_clause} more violations of this clause"))
    return out


# --------------------------------------------------------------------------
# Report clauses.  Each yields Violations; none mutates the index.
# --------------------------------------------------------------------------

# Checked first, by check_report, as the gate for every other clause.
CLAUSES["schema_valid"] = Clause(
    "schema_valid", "The report validates against schemas/report.schema.json.",
    "Tools that read reports (dashboards, graders, this checker) rely on the field names and types.")


@clause("config_recorded", "The report's config records every setting the run asked for, with the same value.",
        "A result without its exact configuration cannot be compared or replayed.")
def _config_recorded(ix: ReportIndex) -> Iterator[Violation]:
    for key, value in ix.asked.items():
        if ix.cfg.get(key, _MISSING) != value:
            yield ix.violation("config_recorded", f"config.{key}: expected {value!r}, got {ix.cfg.get(key, 'nothing')!r}")


_MISSING = object()


@clause("arrival_matches_trace",
        "Every trace arrival appears exactly once as an arrival event at its trace time, the requests table "
        "has exactly the trace's ids with that arrival time, and no event names an unknown id.",
        "Missing arrivals make missing work indistinguishable from missing instrumentation.")
def _arrival_matches_trace(ix: ReportIndex) -> Iterator[Violation]:
    cid = "arrival_matches_trace"
    for rid, i in ix.unknown.items():
        yield ix.violation(cid, "an event names a request id that no trace arrival has", rid, i)
    table = ix.report["requests"]
    for rid in table:
        if rid not in ix.arrivals:
            yield ix.violation(cid, "requests table has a row for an id the trace never sent", rid)
    for rid, line in ix.arrivals.items():
        seen = [i for i, kind, _ in ix.seq[rid] if kind == "arrival"]
        if len(seen) != 1:
            yield ix.violation(cid, f"expected exactly 1 arrival event, got {len(seen)}", rid, seen[1] if seen[1:] else None)
        elif ix.time(seen[0]) != line["time"]:
            yield ix.violation(cid, f"arrival event at t={ix.time(seen[0])}, trace says t={line['time']}", rid, seen[0])
        row = table.get(rid)
        if row is None:
            yield ix.violation(cid, "missing from the requests table", rid)
        elif row["arrival"] != line["time"]:
            yield ix.violation(cid, f"requests.arrival: expected {line['time']}, got {row['arrival']}", rid)
        if seen and any(i < seen[0] for i, _, _ in ix.seq[rid]):
            first = ix.seq[rid][0][0]
            yield ix.violation(cid, "an event for this request comes before its arrival", rid, first)


@clause("time_monotonic", "Event times never go backwards.",
        "Latency figures and replays are computed from event order and times together.")
def _time_monotonic(ix: ReportIndex) -> Iterator[Violation]:
    last = 0
    for i, ev in enumerate(ix.events):
        t = ev["time"]
        if t < last:
            yield ix.violation("time_monotonic", f"time goes back from t={last} to t={t}", ev.get("id"), i)
        last = max(last, t)


@clause("terminal_exactly_once",
        "Every arrival reaches exactly one terminal state (finished, cancelled or rejected); the requests table "
        "records that status and its time as end, and the summary counts match.",
        "A request that never ends is a hang; one that ends twice is double-counted by every dashboard.")
def _terminal_exactly_once(ix: ReportIndex) -> Iterator[Violation]:
    cid = "terminal_exactly_once"
    counts = dict.fromkeys(TERMINAL, 0)
    table = ix.report["requests"]
    for rid in ix.arrivals:
        ends = [(i, kind) for i, kind, _ in ix.seq[rid] if kind in TERMINAL]
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
        "Work, tokens or admissions after the end are leaks or zombie requests.")
def _no_event_after_terminal(ix: ReportIndex) -> Iterator[Violation]:
    for rid, seq in ix.seq.items():
        end = ix.terminal(rid)
        if end is None:
            continue
        for i, kind, _ in seq:
            if i > end[0] and kind not in ("cancel_ignored", "release") and kind not in TERMINAL:
                what = "a dispatch row" if kind == "row" else f"a {kind} event"
                yield ix.violation("no_event_after_terminal",
                                   f"{what} after it {end[1]} at t={ix.time(end[0])}", rid, i)
                break


@clause("ttft_matches_tokens",
        "ttft_ticks is null iff the request emitted no token; otherwise it equals the first token's time minus "
        "the arrival time.",
        "TTFT must never be manufactured (as 0 or otherwise) for a request that produced no output.")
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
            expected = ix.time(tokens[0][0]) - line["time"]
            if row["ttft_ticks"] != expected:
                yield ix.violation("ttft_matches_tokens", f"expected ttft_ticks {expected} (first token t="
                                                          f"{ix.time(tokens[0][0])} - arrival t={line['time']}), got "
                                                          f"{row['ttft_ticks']}", rid, tokens[0][0])


@clause("ttft_null_on_cancel",
        "A request cancelled before its first token has ttft_ticks null, no token events, output_tokens 0 and "
        "empty token_times.",
        "Reporting TTFT 0 for cancelled requests makes p50 TTFT look better the more requests are cancelled.")
def _ttft_null_on_cancel(ix: ReportIndex) -> Iterator[Violation]:
    for rid, seq in ix.seq.items():
        end = ix.terminal(rid)
        if end is None or end[1] != "cancelled":
            continue
        if any(kind == "token" and i < end[0] for i, kind, _ in seq):
            continue
        row = ix.report["requests"].get(rid)
        late = [i for i, kind, _ in seq if kind == "token"]
        if late:
            yield ix.violation("ttft_null_on_cancel", "cancelled before its first token, yet a token event follows",
                               rid, late[0])
        if row is not None and (row["ttft_ticks"] is not None or row["output_tokens"] or row["token_times"]):
            yield ix.violation("ttft_null_on_cancel",
                               f"cancelled before its first token: expected ttft_ticks null, output_tokens 0, "
                               f"token_times []; got {row['ttft_ticks']}, {row['output_tokens']}, "
                               f"{row['token_times']}", rid, end[0])


@clause("itl_empty_for_one_token", "A request that emitted exactly one token has an empty itl_ticks list.",
        "There is no inter-token interval with one token; a [0] entry drags every ITL percentile down.")
def _itl_empty_for_one_token(ix: ReportIndex) -> Iterator[Violation]:
    for rid, _, row in ix.rows():
        if len(ix.tokens(rid)) == 1 and row["itl_ticks"] != []:
            yield ix.violation("itl_empty_for_one_token", f"one token emitted: expected itl_ticks [], got "
                                                          f"{row['itl_ticks']}", rid)


@clause("itl_matches_tokens",
        "itl_ticks has one entry fewer than the tokens emitted, each the difference of consecutive token times.",
        "ITL percentiles are only comparable across engines when computed the same way.")
def _itl_matches_tokens(ix: ReportIndex) -> Iterator[Violation]:
    for rid, line, row in ix.rows():
        tokens = ix.tokens(rid)
        if len(tokens) == 1:
            continue  # the one-token case has its own clause
        times = [ev["time"] for _, ev in tokens]
        expected = [b - a for a, b in zip(times, times[1:])]
        if row["itl_ticks"] != expected:
            yield ix.violation("itl_matches_tokens", f"expected itl_ticks {_short(expected)} from token times "
                                                     f"{_short(times)}, got {_short(row['itl_ticks'])}", rid)


@clause("token_record_consistent",
        "The requests table's token_times and output_tokens agree with the request's token events.",
        "The summary table and the event trace must tell the same story.")
def _token_record_consistent(ix: ReportIndex) -> Iterator[Violation]:
    for rid, line, row in ix.rows():
        times = [ev["time"] for _, ev in ix.tokens(rid)]
        if row["token_times"] != times:
            yield ix.violation("token_record_consistent", f"token_times {_short(row['token_times'])} but token "
                                                          f"events at {_short(times)}", rid)
        if row["output_tokens"] != len(times):
            yield ix.violation("token_record_consistent", f"output_tokens {row['output_tokens']} but "
                                                          f"{len(times)} token events", rid)


@clause("finished_outputs_complete",
        "A finished request emitted exactly its requested output tokens, its finished event at its last token's "
        "time; a request that is not finished emitted fewer.",
        "Finishing early truncates answers; emitting more than asked ignores max_tokens.")
def _finished_outputs_complete(ix: ReportIndex) -> Iterator[Violation]:
    for rid, line in ix.arrivals.items():
        end = ix.terminal(rid)
        tokens = ix.tokens(rid)
        want = line["output_tokens"]
        if end is not None and end[1] == "finished":
            if len(tokens) != want:
                yield ix.violation("finished_outputs_complete", f"finished after {len(tokens)} of {want} requested "
                                                                f"tokens", rid, end[0])
            elif ix.time(tokens[-1][0]) != ix.time(end[0]):
                yield ix.violation("finished_outputs_complete", f"finished at t={ix.time(end[0])}, last token at "
                                                                f"t={ix.time(tokens[-1][0])}", rid, end[0])
        elif len(tokens) >= want:
            yield ix.violation("finished_outputs_complete", f"emitted {len(tokens)} tokens of {want} requested but "
                                                            f"is not finished", rid, tokens[-1][0])


@clause("queue_ticks_consistent",
        "admitted is the time of the request's first admit event (null if never admitted) and queue_ticks is "
        "admitted minus arrival (null if never admitted).",
        "Queueing delay is the first thing capacity planning reads.")
def _queue_ticks_consistent(ix: ReportIndex) -> Iterator[Violation]:
    for rid, line, row in ix.rows():
        admits = [i for i, kind, _ in ix.seq[rid] if kind == "admit"]
        admitted = ix.time(admits[0]) if admits else None
        queue = None if admitted is None else admitted - line["time"]
        if (row["admitted"], row["queue_ticks"]) != (admitted, queue):
            yield ix.violation("queue_ticks_consistent", f"expected admitted={admitted} queue_ticks={queue}, got "
                                                         f"admitted={row['admitted']} queue_ticks={row['queue_ticks']}",
                               rid, admits[0] if admits else None)


@clause("no_duplicate_emission",
        "A request's token events carry output_index 1, 2, 3, ... in order with no repeat and no gap, across "
        "preemption and recompute.",
        "After a preemption the recomputed rows must not re-send tokens the client already has.")
def _no_duplicate_emission(ix: ReportIndex) -> Iterator[Violation]:
    for rid in ix.arrivals:
        for k, (i, ev) in enumerate(ix.tokens(rid), start=1):
            if ev["output_index"] != k:
                kind = "repeats an index already emitted" if ev["output_index"] < k else "skips an index"
                yield ix.violation("no_duplicate_emission", f"token #{k} of this request has output_index "
                                                            f"{ev['output_index']} ({kind}); expected {k}", rid, i)
                break


@clause("pending_sample_fed_once",
        "Within one incarnation (from admission to preemption or end), the input rows fed before emitting output k "
        "total prompt + k - 1, and rows never exceed prompt plus the outputs emitted so far.",
        "The newest sampled token is fed exactly once; re-feeding it after recompute duplicates a KV row.")
def _pending_sample_fed_once(ix: ReportIndex) -> Iterator[Violation]:
    cid = "pending_sample_fed_once"
    for rid, line in ix.arrivals.items():
        prompt = line["prompt_tokens"]
        fed = emitted = 0
        for i, kind, ev in ix.seq[rid]:
            if kind == "preempted":
                fed = 0
            elif kind == "row":
                fed += ev["input_tokens"]
                if fed > prompt + emitted:
                    yield ix.violation(cid, f"rows fed reach {fed} with prompt {prompt} and {emitted} outputs "
                                            f"emitted: at most {prompt + emitted} rows exist to feed", rid, i)
                    break
            elif kind == "token":
                emitted += 1
                if fed != prompt + emitted - 1:
                    yield ix.violation(cid, f"output {emitted} emitted after {fed} input rows this incarnation; "
                                            f"expected prompt {prompt} + {emitted} - 1 = {prompt + emitted - 1}", rid, i)
                    break


@clause("lifecycle_order",
        "A request is admitted only while queued, runs rows only while admitted, is preempted only while "
        "admitted (then holds nothing until admitted again), and the number of admitted requests never exceeds "
        "max_active (1 under the serial policy).",
        "Rows for a request that is not admitted compute on pages it does not own.")
def _lifecycle_order(ix: ReportIndex) -> Iterator[Violation]:
    cid = "lifecycle_order"
    limit = ix.max_active()
    state: dict[str, str] = {}
    active = 0
    for i, ev in enumerate(ix.events):
        kind = ev["event"]
        if kind == "dispatch":
            for row in ev["work"]:
                if row["id"] in ix.arrivals and state.get(row["id"]) != "active":
                    yield ix.violation(cid, f"dispatch row ({row['phase']}) while the request is "
                                            f"{state.get(row['id'], 'not arrived')}, not admitted", row["id"], i)
            continue
        rid = ev.get("id")
        if rid not in ix.arrivals:
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


@clause("budget_respected",
        "Each dispatch feeds at most token_budget input tokens, and its unused_budget is token_budget minus "
        "what it fed.",
        "The token budget bounds step latency; overrunning it breaks every latency SLO built on it.")
def _budget_respected(ix: ReportIndex) -> Iterator[Violation]:
    budget = ix.cfg["token_budget"]
    for i in ix.dispatches:
        ev = ix.events[i]
        used = sum(row["input_tokens"] for row in ev["work"])
        if used > budget:
            yield ix.violation("budget_respected", f"dispatch feeds {used} tokens, token_budget is {budget}", None, i)
        elif ev["unused_budget"] != budget - used:
            yield ix.violation("budget_respected", f"unused_budget {ev['unused_budget']}, expected {budget} - {used} "
                                                   f"= {budget - used}", None, i)


@clause("row_shape",
        "A dispatch has at most one row per request and at least one row; decode rows feed exactly 1 token, only "
        "after the prompt is fed and an output exists; prefill rows feed only prompt positions; prefill and "
        "recompute rows feed at most prefill_chunk tokens; recompute rows appear only after a preemption.",
        "Malformed rows mean the batch computes positions that were never scheduled.")
def _row_shape(ix: ReportIndex) -> Iterator[Violation]:
    cid = "row_shape"
    chunk = ix.cfg["prefill_chunk"]
    fed: dict[str, int] = {}
    emitted: dict[str, int] = {}
    preempted: set[str] = set()
    for i, ev in enumerate(ix.events):
        kind = ev["event"]
        if kind == "token":
            emitted[ev["id"]] = emitted.get(ev["id"], 0) + 1
        elif kind == "preempted":
            fed[ev["id"]] = 0
            preempted.add(ev["id"])
        elif kind == "dispatch":
            if not ev["work"]:
                yield ix.violation(cid, "dispatch with no rows", None, i)
            seen: set[str] = set()
            for row in ev["work"]:
                rid, n, phase = row["id"], row["input_tokens"], row["phase"]
                line = ix.arrivals.get(rid)
                if line is None:
                    continue
                if rid in seen:
                    yield ix.violation(cid, "two rows for the same request in one dispatch", rid, i)
                seen.add(rid)
                done = fed.get(rid, 0)
                problem = None
                if phase == "decode" and (n != 1 or done < line["prompt_tokens"] or not emitted.get(rid)):
                    problem = (f"decode row of {n} tokens after {done} of {line['prompt_tokens']} prompt rows and "
                               f"{emitted.get(rid, 0)} outputs; a decode row feeds 1 token once the prompt is "
                               f"fed and an output exists")
                elif phase != "decode" and n > chunk:
                    problem = f"{phase} row of {n} tokens exceeds prefill_chunk {chunk}"
                elif phase == "prefill" and done + n > line["prompt_tokens"]:
                    problem = f"prefill row covers positions {done}..{done + n - 1} past the prompt's " \
                              f"{line['prompt_tokens']} tokens"
                elif phase == "recompute" and rid not in preempted:
                    problem = "recompute row for a request that was never preempted"
                if problem:
                    yield ix.violation(cid, problem, rid, i)
                fed[rid] = done + n


class _Replay:
    """Each request's state (queued, active, draining, ended, released) and rows fed
    in its current incarnation, advanced one event at a time."""

    def __init__(self) -> None:
        self.state: dict[str, str] = {}
        self.fed: dict[str, int] = {}

    def advance(self, ev: Mapping[str, Any]) -> None:
        kind = ev["event"]
        if kind == "dispatch":
            for row in ev["work"]:
                self.fed[row["id"]] = self.fed.get(row["id"], 0) + row["input_tokens"]
        elif kind == "arrival":
            self.state[ev["id"]] = "queued"
        elif kind == "admit":
            self.state[ev["id"]] = "active"
        elif kind == "preempted":
            self.state[ev["id"]] = "queued"
            self.fed[ev["id"]] = 0
        elif kind == "rejected":
            self.state[ev["id"]] = "released"
        elif kind in ("finished", "cancelled"):
            self.state[ev["id"]] = "draining" if self.state.get(ev["id"]) == "active" else "ended"
        elif kind == "release":
            self.state[ev["id"]] = "released"


def _snapshot_walk(ix: ReportIndex) -> Iterator[tuple[int, dict[str, Any], dict[str, str], dict[str, int]]]:
    """Yield (index, snapshot, state by id, rows fed by id) as of each snapshot."""
    replay = _Replay()
    for i, ev in enumerate(ix.events):
        if ev["event"] == "snapshot":
            yield i, ev, replay.state, replay.fed
        else:
            replay.advance(ev)


@clause("pages_conserved",
        "In every snapshot allocated_blocks + free_blocks = capacity, the block tables hold exactly "
        "allocated_blocks distinct pages in 0..capacity-1 with no page in two tables, and draining_blocks counts "
        "the pages of ended requests not yet released.",
        "A page in two tables is silent KV corruption; a page in none is a leak.")
def _pages_conserved(ix: ReportIndex) -> Iterator[Violation]:
    cid = "pages_conserved"
    cap = ix.capacity
    for i, snap, state, _ in _snapshot_walk(ix):
        tables = snap["block_tables"]
        if snap["allocated_blocks"] + snap["free_blocks"] != cap:
            yield ix.violation(cid, f"allocated {snap['allocated_blocks']} + free {snap['free_blocks']} != capacity "
                                    f"{cap}", None, i)
        pages: set[int] = set()
        total = 0
        draining = 0
        for rid, table in tables.items():
            pages.update(table)
            total += len(table)
            if state.get(rid) in ("draining", "ended"):
                draining += len(table)
        if len(pages) != total:
            yield ix.violation(cid, f"{total - len(pages)} page(s) appear twice in the block tables: "
                                    f"{_short(_doubled(tables))}", None, i)
        elif total != snap["allocated_blocks"]:
            yield ix.violation(cid, f"block tables hold {total} pages, allocated_blocks says "
                                    f"{snap['allocated_blocks']}", None, i)
        if pages and (min(pages) < 0 or max(pages) >= cap):
            yield ix.violation(cid, f"page id outside 0..{cap - 1}: {min(pages) if min(pages) < 0 else max(pages)}",
                               None, i)
        if draining != snap["draining_blocks"]:
            yield ix.violation(cid, f"ended requests hold {draining} pages, draining_blocks says "
                                    f"{snap['draining_blocks']}", None, i)


def _doubled(tables: Mapping[str, list[int]]) -> list[int]:
    owners: dict[int, str] = {}
    doubled = []
    for rid, table in tables.items():
        for page in table:
            if page in owners:
                doubled.append(page)
            owners[page] = rid
    return doubled


@clause("snapshot_counts",
        "Each snapshot's active and queued counts equal the requests admitted and the requests waiting "
        "(arrived or preempted, not ended) at that point of the event trace.",
        "Running/waiting gauges are what operators watch; they must match the events.")
def _snapshot_counts(ix: ReportIndex) -> Iterator[Violation]:
    for i, snap, state, _ in _snapshot_walk(ix):
        values = list(state.values())
        active, queued = values.count("active"), values.count("queued")
        if (snap["active"], snap["queued"]) != (active, queued):
            yield ix.violation("snapshot_counts", f"snapshot says active={snap['active']} queued={snap['queued']}, "
                                                  f"events give active={active} queued={queued}", None, i)


@clause("pages_cover_rows",
        "Every dispatch follows a snapshot of its tick whose block table gives each row's request at least "
        "ceil(rows fed after the row / block_size) pages; no snapshot shows a request holding more than "
        "ceil((prompt + output - 1) / block_size) pages, or any page while it is neither admitted nor ended "
        "awaiting release.",
        "Rows without pages overwrite someone else's KV; pages beyond the largest need are hoarded capacity.")
def _pages_cover_rows(ix: ReportIndex) -> Iterator[Violation]:
    cid = "pages_cover_rows"
    bs = ix.bs
    replay = _Replay()
    tables: dict[str, list[int]] = {}
    snapshot_time: int | None = None
    for i, ev in enumerate(ix.events):
        kind = ev["event"]
        if kind == "snapshot":
            tables, snapshot_time = ev["block_tables"], ev["time"]
            for rid, table in tables.items():
                line = ix.arrivals.get(rid)
                if line is None or not table:
                    continue
                most = required_blocks(line["prompt_tokens"], line["output_tokens"], bs)
                where = replay.state.get(rid)
                if where not in ("active", "draining"):
                    yield ix.violation(cid, f"holds {len(table)} page(s) while {where or 'not arrived'}", rid, i)
                elif len(table) > most:
                    yield ix.violation(cid, f"holds {len(table)} pages; its whole sequence needs at most {most}",
                                       rid, i)
        elif kind == "dispatch":
            if snapshot_time != ev["time"]:
                yield ix.violation(cid, "dispatch without a snapshot at its tick, so its pages cannot be audited",
                                   None, i)
            else:
                for row in ev["work"]:
                    fed = replay.fed.get(row["id"], 0) + row["input_tokens"]
                    need = -(-fed // bs)
                    have = len(tables.get(row["id"], ()))
                    if have < need:
                        yield ix.violation(cid, f"{row['phase']} row brings its rows to {fed}, needing {need} "
                                                f"pages; the snapshot before the dispatch shows {have}", row["id"], i)
        replay.advance(ev)


@clause("headroom_nonnegative", "admission_headroom is never negative.",
        "Negative headroom means the scheduler promised more pages than exist.")
def _headroom_nonnegative(ix: ReportIndex) -> Iterator[Violation]:
    for i in ix.snapshots:
        if ix.events[i]["admission_headroom"] < 0:
            yield ix.violation("headroom_nonnegative", f"admission_headroom is {ix.events[i]['admission_headroom']}",
                               None, i)


@clause("no_reuse_before_release",
        "A page of an ended request appears in another request's block table only after that request's release "
        "event, and no earlier than its end time + release_delay.",
        "In-flight transfers may still write to a retired request's pages; reusing them early corrupts KV.")
def _no_reuse_before_release(ix: ReportIndex) -> Iterator[Violation]:
    delay = ix.cfg["release_delay"]
    owner: dict[int, str] = {}
    last_table: dict[str, list[int]] = {}
    ended_at: dict[str, int] = {}
    released: set[str] = set()
    for i, ev in enumerate(ix.events):
        kind = ev["event"]
        if kind in ("finished", "cancelled"):
            ended_at.setdefault(ev["id"], ev["time"])
        elif kind == "preempted":  # its pages went back to the pool at once
            for page in last_table.pop(ev["id"], []):
                if owner.get(page) == ev["id"]:
                    del owner[page]
        elif kind == "release":
            released.add(ev["id"])
        elif kind == "snapshot":
            for rid, table in ev["block_tables"].items():
                before = last_table.get(rid, [])
                if table == before:
                    continue
                new = table[len(before):] if table[:len(before)] == before else [p for p in table if p not in before]
                last_table[rid] = table
                for page in new:
                    prev = owner.get(page)
                    owner[page] = rid
                    if prev is None or prev == rid or prev not in ended_at:
                        continue
                    end = ended_at[prev]
                    if prev not in released or ev["time"] < end + delay:
                        yield ix.violation("no_reuse_before_release",
                                           f"page {page} of {prev!r} (ended t={end}, release_delay {delay}) given to "
                                           f"{rid!r} at t={ev['time']}"
                                           + ("" if prev in released else f" before {prev!r} was released"), rid, i)


@clause("release_once_after_delay",
        "Every admitted request gets exactly one release event, after its terminal event and no earlier than its "
        "end time + release_delay; a request never admitted gets none.",
        "Release events are how the pool's drain is observed and audited.")
def _release_once_after_delay(ix: ReportIndex) -> Iterator[Violation]:
    delay = ix.cfg["release_delay"]
    for rid, seq in ix.seq.items():
        releases = [i for i, kind, _ in seq if kind == "release"]
        admitted = any(kind == "admit" for _, kind, _ in seq)
        end = ix.terminal(rid)
        if not admitted:
            if releases:
                yield ix.violation("release_once_after_delay", "release for a request never admitted", rid, releases[0])
            continue
        if len(releases) != 1:
            yield ix.violation("release_once_after_delay", f"expected 1 release event, got {len(releases)}", rid,
                               releases[1] if releases[1:] else None)
        if releases and end is not None:
            at = releases[0]
            if at < end[0] or ix.time(at) < ix.time(end[0]) + delay:
                yield ix.violation("release_once_after_delay", f"released at t={ix.time(at)}, ended t="
                                                               f"{ix.time(end[0])}, release_delay {delay}", rid, at)


@clause("no_leaked_pages",
        "The report ends with a snapshot after the last release in which every page is free and no block table "
        "holds a page, and summary.free_blocks equals capacity.",
        "A page still held after drain is a leak that grows until the server stops admitting.")
def _no_leaked_pages(ix: ReportIndex) -> Iterator[Violation]:
    cid = "no_leaked_pages"
    cap = ix.capacity
    if ix.report["summary"]["free_blocks"] != cap:
        yield ix.violation(cid, f"summary.free_blocks {ix.report['summary']['free_blocks']}, capacity {cap}")
    if not ix.snapshots:
        yield ix.violation(cid, "the report has no snapshot")
        return
    last = ix.snapshots[-1]
    releases = [i for i, ev in enumerate(ix.events) if ev["event"] == "release"]
    if releases and releases[-1] > last:
        yield ix.violation(cid, "no snapshot after the last release, so the drained pool is never shown", None,
                           releases[-1])
        return
    snap = ix.events[last]
    held = {rid: table for rid, table in snap["block_tables"].items() if table}
    if snap["free_blocks"] != cap or held:
        owners = ", ".join(f"{rid}: {_short(t)}" for rid, t in list(held.items())[:5])
        yield ix.violation(cid, f"final snapshot: free_blocks {snap['free_blocks']} of {cap}"
                                + (f"; still held by {owners}" if held else ""), None, last)


@clause("cancel_idempotent",
        "Each trace cancel gets exactly one answer at its time: cancelled if the request had not ended, otherwise "
        "cancel_ignored with the status it ended with; so a second cancel, or a cancel after completion, changes "
        "nothing.",
        "Clients retry cancels; a retried cancel must not re-cancel, resurrect or double-count a request.")
def _cancel_idempotent(ix: ReportIndex) -> Iterator[Violation]:
    cid = "cancel_idempotent"
    for rid, seq in ix.seq.items():
        asked = ix.cancels.get(rid, [])
        answers = [(i, kind, ev) for i, kind, ev in seq if kind in ("cancelled", "cancel_ignored")]
        if len(answers) != len(asked):
            yield ix.violation(cid, f"trace cancels it {len(asked)} time(s), report answers {len(answers)} "
                                    f"time(s) with cancelled/cancel_ignored", rid,
                               answers[len(asked)][0] if len(answers) > len(asked) else None)
            continue
        ended: str | None = None
        cursor = 0
        for (i, kind, ev), t in zip(answers, asked):
            while cursor < len(seq) and seq[cursor][0] < i:
                if seq[cursor][1] in TERMINAL and ended is None:
                    ended = seq[cursor][1]
                cursor += 1
            if ev["time"] != t:
                yield ix.violation(cid, f"cancel sent at t={t} answered at t={ev['time']}", rid, i)
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
        "A request is rejected if and only if it cannot fit in the pool alone (ceil((prompt + output - 1) / "
        "block_size) > capacity); a rejected request is never admitted.",
        "An impossible request left in the queue blocks everyone behind it forever.")
def _impossible_rejected(ix: ReportIndex) -> Iterator[Violation]:
    for rid, line in ix.arrivals.items():
        need = required_blocks(line["prompt_tokens"], line["output_tokens"], ix.bs)
        end = ix.terminal(rid)
        rejected = end is not None and end[1] == "rejected"
        if need > ix.capacity and not rejected:
            yield ix.violation("impossible_rejected", f"needs {need} pages alone, capacity is {ix.capacity}: expected "
                                                      f"rejected, got {end[1] if end else 'no terminal event'}", rid)
        elif need <= ix.capacity and rejected:
            yield ix.violation("impossible_rejected", f"rejected although it needs only {need} of {ix.capacity} "
                                                      f"pages", rid, end[0])
        elif rejected and any(kind == "admit" for _, kind, _ in ix.seq[rid]):
            yield ix.violation("impossible_rejected", "rejected after being admitted", rid, end[0])


@clause("input_tokens_accounted",
        "summary.processed_input_tokens equals the sum of all dispatched rows, and summary.dispatches the number "
        "of dispatch events.",
        "Wasted prefill on cancelled requests must show up in the token count, not vanish.")
def _input_tokens_accounted(ix: ReportIndex) -> Iterator[Violation]:
    summary = ix.report["summary"]
    total = sum(row["input_tokens"] for i in ix.dispatches for row in ix.events[i]["work"])
    if summary["processed_input_tokens"] != total:
        yield ix.violation("input_tokens_accounted", f"summary.processed_input_tokens "
                                                     f"{summary['processed_input_tokens']}, dispatch rows sum to {total}")
    if summary["dispatches"] != len(ix.dispatches):
        yield ix.violation("input_tokens_accounted", f"summary.dispatches {summary['dispatches']}, "
                                                     f"{len(ix.dispatches)} dispatch events")


@clause("drained_at_last_event", "summary.drained_at_tick is the time of the report's last event.",
        "The drain time is when the pool is reusable, which is not the last response's latency.")
def _drained_at_last_event(ix: ReportIndex) -> Iterator[Violation]:
    last = ix.events[-1]["time"] if ix.events else 0
    if ix.report["summary"]["drained_at_tick"] != last:
        yield ix.violation("drained_at_last_event", f"summary.drained_at_tick "
                                                    f"{ix.report['summary']['drained_at_tick']}, last event at t={last}")


def _short(values: Sequence[Any], limit: int = 12) -> str:
    text = ", ".join(map(str, values[:limit]))
    return f"[{text}{', ...' if len(values) > limit else ''}]"
