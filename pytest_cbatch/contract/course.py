"""The course's exact results (opt-in): what the course states and its published simulator produces.

Every other clause holds for any correct scheduler, whatever its policy.  A
course assignment asks for more: the policy the course publishes (FIFO
admission with worst-case reservation, decode rows first, the two rotation
counters, greedy prefill chunks), whose results the course states exactly
(the demo: seven dispatches, 19 input tokens, all eight pages free by tick
eight).  ``course_results`` runs the kit's reference, which follows the
published simulator event for event, on the same trace and config, and
compares the results a student reports: each request's status and ticks,
and the summary.  It compares nothing the course leaves open:

* the order of events within a tick, snapshots, page ids, when pages are
  allocated, when (or whether) ``admission_blocked`` is logged: not read;
* a release event for a request that holds no pages at its end (the published
  simulator emits one at end + release_delay, and may wait for it before it
  reports the drain): drained_at_tick may lie anywhere from the last release
  of pages to the published simulator's drain tick (which also waits for the
  trace's last line);
* when a request that cannot fit even alone is rejected ("it must become
  rejected", no more): at arrival or at the head of the queue, so it may end
  cancelled instead when the trace cancels it, its end tick is free, and the
  summary's cancelled and rejected counts follow its status.

It judges reserve admission only (the course's), and only configs the
published simulator accepts; other runs skip it with the reason.  A
scheduler built to another policy (an engine) fails it by design: it is
opt-in, for course assignments.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any, Iterator, Mapping, Sequence

from .core import ReportIndex, Violation, clause, required_blocks

__all__ = ["PUBLISHED_SCHEDULE", "SideBySide", "course_config", "course_scope", "schedules_part"]

CID = "course_results"
PUBLISHED_SCHEDULE = (
    "Order. The trace's lines are sorted stably by time, every arrival before every cancel of the same time. "
    "The clock starts at tick 0.",
    "Each tick, in this order: the trace lines of this tick (an arrival joins the back of the queue; a cancel "
    "ends a queued or running request as cancelled, and one that has already ended is ignored); the releases "
    "due; admission; planning; the dispatch.",
    "Releases. A request that ends while running (finished or cancelled) leaves the running set at once; its "
    "pages, ceil(rows it was fed / block_size) of them, are released release_delay ticks after its end. One that "
    "ends while queued holds no pages and is never released.",
    "Admission. While requests wait and fewer than max_active run (1 under policy serial), the head of the queue "
    "needs ceil((prompt_tokens + output_tokens - 1) / block_size) pages. More than capacity: it is rejected (it "
    "ends now) and the next head is tried. More than capacity minus the needs of the running requests minus the "
    "pages of ended requests not yet released: it stays at the head and admission stops until the next tick. "
    "Otherwise it runs from now. The running requests are kept in the order they were admitted.",
    "Planning, within token_budget tokens. A running request decodes once its whole prompt has been fed, else it "
    "prefills. Decode rows first: the decoding requests in admission order, rotated left by D mod their number "
    "(the list from position D mod n, then the ones before it); the first min(n, token_budget) of them get a row "
    "of 1 token each. Then, while budget is left, prefill rows: the prefilling requests in admission order, "
    "rotated left by P mod their number; each in turn gets a row of min(prefill_chunk, prompt tokens it has "
    "left, budget left) tokens, and the walk stops once the budget is spent.",
    "Rotation. D and P start at 0 and are never reset: D counts every decode row and P every prefill row the run "
    "has dispatched so far (rows, not dispatches and not requests). After planning, D grows by the number of "
    "decode rows planned and P by the number of prefill rows planned.",
    "Dispatch. A plan with rows is one dispatch at this tick (it counts its tokens as processed input tokens); "
    "its rows complete one tick later, and the clock moves to that tick. A prompt's last chunk emits the first "
    "output token then, and every decode row the next one; a request whose output is complete then finishes.",
    "Idle. A tick with no rows moves the clock to the next trace time or release time, whichever comes first; "
    "with neither, the run ends and that tick is drained_at_tick.",
    "Results. queue_ticks = admission - arrival; ttft_ticks = first output token - arrival (null with no output); "
    "itl_ticks = the differences of consecutive token times; end = the tick it finished, was cancelled or was "
    "rejected.",
)
"""The published simulator's row order and rotation rules (reserve admission), in words a student can
implement from: ``cbatch clauses`` prints them and docs/contract.md states them, and a test runs an
implementation written from these words alone."""
SHOWN_TICKS = 6
"""How many dispatches from the parting one the side-by-side schedules show."""
_PER_REQUEST = ("ttft_ticks", "itl_ticks", "queue_ticks")
_EXACT_SUMMARY = ("dispatches", "processed_input_tokens", "free_blocks")
_COUNTS = ("finished", "cancelled", "rejected")


def _published() -> Any:
    """The kit's reference (the published simulator), imported only when a course clause runs: a graded
    submission's sandbox child imports the contract package (for the lifecycle searches) in a bubblewrap
    that leaves the reference out (``sandbox.guard``)."""
    from ..reference import scheduler_sim

    return scheduler_sim


def course_config(asked: Mapping[str, Any]) -> dict[str, Any]:
    """The settings the published simulator runs with: the ones the run asked for over its defaults.

    Only what was asked counts, never the report's own config: a report cannot
    talk its way out of the comparison by claiming other settings.
    """
    return {**_published().DEFAULT_CONFIG, **asked}


def course_scope(asked: Mapping[str, Any]) -> str | None:
    """Why the course states no results for a run asked for with ``asked``, or None."""
    config = course_config(asked)
    try:
        _published().validate_config(config)
    except ValueError as exc:
        return f"the course's published simulator does not run this config ({exc}), so it states no results for it"
    if config["admission"] != "reserve":
        return (f"the course states results for reserve admission only; this workload uses "
                f"admission={config['admission']!r} (an extension of the kit's)")
    return None


@clause(CID,
        "Opt-in, for course assignments: under reserve admission, each request's status, ttft_ticks, itl_ticks, "
        "queue_ticks and end, and the summary's dispatches, processed_input_tokens, finished, cancelled and "
        "rejected counts and free_blocks equal what the course's published simulator (the kit's reference) gives "
        "on the same trace and config, and drained_at_tick lies between the last release of pages and the "
        "published simulator's drain tick.",
        "A course states exact results (the demo: 7 dispatches, 19 input tokens); a rotation, admission or budget "
        "rule that differs from the published one gives other numbers while every other clause holds.",
        needs=("dispatch", "token"),
        admits=("any order of events within a tick; admission_blocked logged at any time; no release event for a "
                "request holding no pages; an impossible request rejected at arrival (or cancelled first); "
                "drained_at_tick from the last release of pages; any page ids, snapshots and allocation times"),
        reads=("config", "trace.prompt_tokens", "trace.output_tokens", "requests.*.status", "requests.*.end",
               "requests.*.ttft_ticks", "requests.*.itl_ticks", "requests.*.queue_ticks", "summary.dispatches",
               "summary.processed_input_tokens", "summary.finished", "summary.cancelled", "summary.rejected",
               "summary.free_blocks", "summary.drained_at_tick", "events[dispatch].time",
               "events[dispatch].work[].id", "events[dispatch].work[].phase", "events[dispatch].work[].input_tokens"),
        compares={
            "requests.*.status": "each request's status",
            "requests.*.ttft_ticks": "ttft_ticks",
            "requests.*.itl_ticks": "itl_ticks",
            "requests.*.queue_ticks": "queue_ticks",
            "requests.*.end": "and end",
            "summary.dispatches": "the summary's dispatches",
            "summary.processed_input_tokens": "processed_input_tokens",
            "summary.finished": "finished, cancelled and rejected counts",
            "summary.cancelled": "finished, cancelled and rejected counts",
            "summary.rejected": "finished, cancelled and rejected counts",
            "summary.free_blocks": "free_blocks",
            "summary.drained_at_tick": "drained_at_tick lies between the last release of pages and the published "
                                       "simulator's drain tick",
        },
        opt_in="--cbatch-course (pytest), cbatch check --course, [grading] course = true (rubric)",
        scope=course_scope)
def _course_results(ix: ReportIndex) -> Iterator[Violation]:
    config = course_config(ix.cfg)
    expected = _published().simulate(ix.trace, **config)
    found = list(_differences(ix, config, expected))
    if found:   # where the schedules part says which rule was missed; it decides nothing by itself
        parting = schedules_part(ix, expected["events"])
        yield from ([parting] if parting else []) + found


def _differences(ix: ReportIndex, config: Mapping[str, Any], expected: Mapping[str, Any]) -> Iterator[Violation]:
    """Each result of the report that differs from the published simulator's ``expected`` report."""
    given = "the course's simulator gives"
    impossible = {rid for rid, line in ix.arrivals.items()
                  if required_blocks(line["prompt_tokens"], line["output_tokens"], config["block_size"])
                  > config["capacity"]}
    statuses = {rid: row["status"] for rid, row in expected["requests"].items()}
    for rid, line, row in ix.rows():
        want = expected["requests"][rid]
        if rid in impossible:
            allowed = ["rejected"] + (["cancelled"] if rid in ix.cancels else [])
            if row["status"] in allowed:
                statuses[rid] = row["status"]   # when it is rejected is free, so a cancel may reach it first
            else:
                yield ix.violation(CID, f"status: it cannot fit even alone, so it ends {' or '.join(allowed)}; "
                                        f"got {_shown(row['status'])}", rid)
        elif row["status"] != want["status"]:
            yield ix.violation(CID, f"status: {given} {want['status']!r}, this report {_shown(row['status'])}", rid)
        elif row["end"] != want["end"]:
            yield ix.violation(CID, f"end: {given} t={want['end']} ({want['status']}), this report "
                                    f"t={_shown(row['end'])}", rid)
        for name in _PER_REQUEST:
            if row[name] != want[name]:
                yield ix.violation(CID, f"{name}: {given} {_shown(want[name])}, this report {_shown(row[name])}",
                                   rid)
    summary, want_summary = ix.report["summary"], expected["summary"]
    counts = Counter(statuses.values())
    for name in _EXACT_SUMMARY + _COUNTS:
        want = counts[name] if name in _COUNTS else want_summary[name]
        if summary[name] != want:
            yield ix.violation(CID, f"summary.{name}: {given} {want}, this report {_shown(summary[name])}")
    low, high = _drain_window(expected, config["release_delay"], impossible)
    drained = summary["drained_at_tick"]
    if not low <= drained <= high:
        window = f"t={low}" if low == high else f"t={low}..{high}"
        yield ix.violation(CID, f"summary.drained_at_tick: {given} {window} (from the last release of pages to "
                                f"its own drain tick), this report {_shown(drained)}")


def _shown(value: Any) -> str:
    """A reported value for a message, cut short: the report is the judged code's, of any size."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _drain_window(expected: Mapping[str, Any], delay: int, impossible: set[str]) -> tuple[int, int]:
    """The drain ticks the course allows: from the last release of pages (and the last end of a request
    that fits) to the published simulator's own drain tick."""
    fed = {row["id"] for ev in expected["events"] if ev["event"] == "dispatch" for row in ev["work"]}
    low = 0
    for rid, row in expected["requests"].items():
        if rid not in impossible:
            low = max(low, row["end"] + (delay if rid in fed else 0))
    return low, expected["summary"]["drained_at_tick"]


Row = tuple[str, str, int]
"""One dispatch row: request id, phase, input tokens."""


@dataclass(frozen=True)
class SideBySide(Violation):
    """Where a report's schedule parts from the published simulator's: the message names the first dispatch
    (its tick and row) that differs, and ``schedules`` holds both schedules from there, a tick a line:
    (tick, the course's rows, the report's rows, whether they are the same rows), a rows text "" when that
    schedule has no dispatch then."""

    schedules: tuple[tuple[int, str, str, bool], ...] = ()


def schedules_part(ix: ReportIndex, published: Sequence[Mapping[str, Any]]) -> SideBySide | None:
    """The first dispatch where the report's schedule and the published one (``published``: its events) differ
    in tick or in rows (as a multiset: the order of rows within a dispatch is free), or None when they agree."""
    course = [(ev["time"], _rows(ev)) for ev in published if ev["event"] == "dispatch"]
    given = [(ix.events[i]["time"], _rows(ix.events[i]), i) for i in ix.dispatches]
    for k in range(max(len(course), len(given))):
        ours = course[k] if k < len(course) else None
        theirs = given[k][:2] if k < len(given) else None
        if ours is None or theirs is None or ours[0] != theirs[0] or Counter(ours[1]) != Counter(theirs[1]):
            break
    else:
        return None
    index = given[k][2] if k < len(given) else None
    what, rid = _parting(ours, theirs)
    table = _side_by_side(course[k:], [g[:2] for g in given[k:]])
    left = "the course's simulator"
    width = max(len(left), *(len(a or "-") for _, a, _, _ in table))
    lines = [f"  {'tick':<6}{left:<{width}} | this report"]
    lines += [f"{' ' if same else '≠'} {f't={tick}':<6}{a or '-':<{width}} | {b or '-'}"
              for tick, a, b, same in table]
    message = (f"the schedules part at dispatch {k + 1}, {what} (the published row order and rotation: "
               f"`cbatch clauses`, or docs/contract.md); from there, side by side:\n    " + "\n    ".join(lines))
    time = ours[0] if theirs is None else theirs[0]
    return SideBySide(CID, message, rid, index, time, tuple(table))


def _rows(event: Mapping[str, Any]) -> list[Row]:
    return [(row["id"], row["phase"], row["input_tokens"]) for row in event["work"]]


def _row(row: Row) -> str:
    return f"{_shown_id(row[0])} {row[1]} {row[2]}"


def _shown_id(rid: str) -> str:
    return rid if len(rid) <= 24 else rid[:21] + "..."


def _parting(ours: tuple[int, list[Row]] | None, theirs: tuple[int, list[Row]] | None) -> tuple[str, str | None]:
    """The parting dispatch in words (its tick and first differing row) and the request it names."""
    if theirs is None:
        return (f"t={ours[0]}: the course's simulator dispatches {_few(ours[1])}, this report nothing more",
                ours[1][0][0])
    if ours is None:
        return (f"t={theirs[0]}: this report dispatches {_few(theirs[1])}, the course's simulator nothing more",
                theirs[1][0][0] if theirs[1] else None)
    if ours[0] != theirs[0]:
        return (f"t={min(ours[0], theirs[0])}: the course's simulator dispatches {_few(ours[1])} at t={ours[0]}, "
                f"this report {_few(theirs[1])} at t={theirs[0]}", (theirs[1] or ours[1])[0][0])
    missing, extra = Counter(ours[1]) - Counter(theirs[1]), Counter(theirs[1]) - Counter(ours[1])
    row = next(i for i, r in enumerate(ours[1] + [None]) if r is None or r in missing)
    lost = ours[1][row] if row < len(ours[1]) else None
    added = next((r for r in theirs[1] if r in extra), None)
    place = f"t={ours[0]}, row {row + 1} of the course's dispatch"
    said = [f"the course's simulator feeds {_row(lost)}" if lost else "the course's simulator feeds no more rows",
            f"this report {_row(added)}" if added else "this report no such row"]
    return f"{place}: {', '.join(said)}", (added or lost)[0]


def _few(rows: list[Row], most: int = 4) -> str:
    text = ", ".join(_row(r) for r in rows[:most])
    return (text + f" and {len(rows) - most} more") if len(rows) > most else text or "no rows"


def _side_by_side(course: list[tuple[int, list[Row]]], given: list[tuple[int, list[Row]]]
                  ) -> list[tuple[int, str, str, bool]]:
    """Both schedules from the parting dispatch, a tick a line: the first SHOWN_TICKS ticks either dispatches
    at, each with whether the two dispatch the same rows then."""
    ours, theirs = dict(course), dict(given)
    ticks = sorted(set(ours) | set(theirs))[:SHOWN_TICKS]
    return [(t, _few(ours[t]) if t in ours else "", _few(theirs[t]) if t in theirs else "",
             t in ours and t in theirs and Counter(ours[t]) == Counter(theirs[t])) for t in ticks]
