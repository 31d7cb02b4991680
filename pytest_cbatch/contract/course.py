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
from typing import Any, Iterator, Mapping

from .core import ReportIndex, Violation, clause, required_blocks

__all__ = ["course_config", "course_scope"]

CID = "course_results"
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
               "summary.free_blocks", "summary.drained_at_tick"),
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
