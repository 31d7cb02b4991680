"""Each clause admits the legitimate choices correct schedulers make differently, and still catches the bug.

A report from the reference (the course's published simulator) is rewritten into what a correct
scheduler making another choice would write; the contract must accept it.  Then the same report is
broken in the way the clause exists to catch; the contract must reject it, naming that clause.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from pytest_cbatch.contract import CLAIMS, check_report, unobservable
from pytest_cbatch.impls import PythonImplementation
from pytest_cbatch.reference.scheduler_sim import demo_trace, simulate
from pytest_cbatch.runner import Judge, shrink_trace
from pytest_cbatch.workloads import BASE_CONFIG, WORKLOADS

Report = dict[str, Any]


def clauses_failed(report: Report, trace: list[dict[str, Any]], config: dict[str, Any] | None = None) -> set[str]:
    return {v.clause for v in check_report(report, trace, {**BASE_CONFIG, **(config or {})})}


def demo() -> tuple[Report, list[dict[str, Any]]]:
    return simulate(demo_trace()), demo_trace()


def snapshots(report: Report) -> list[dict[str, Any]]:
    return [ev for ev in report["events"] if ev["event"] == "snapshot"]


# -- snapshot active / queued -----------------------------------------------------------
@pytest.mark.parametrize("form", ["counts", "reordered", "absent"])
def test_active_and_queued_may_be_counts_reordered_lists_or_absent(form: str) -> None:
    report, trace = demo()
    for snap in snapshots(report):
        if form == "counts":
            snap["active"], snap["queued"] = len(snap["active"]), len(snap["queued"])
        elif form == "reordered":
            snap["active"], snap["queued"] = list(reversed(snap["active"])), list(reversed(snap["queued"]))
        else:
            del snap["active"], snap["queued"]
    assert clauses_failed(report, trace) == set()


@pytest.mark.parametrize("form", ["count", "list"])
def test_active_that_disagrees_with_the_events_fails_snapshot_counts(form: str) -> None:
    report, trace = demo()
    snap = snapshots(report)[1]
    snap["active"] = len(snap["active"]) + 1 if form == "count" else snap["active"] + ["late"]
    assert clauses_failed(report, trace) == {"snapshot_counts"}


# -- the requests table ---------------------------------------------------------------------
def test_the_requests_table_may_list_its_rows_in_any_order() -> None:
    """The course's per-request table names no order, and a JSON object has none: reversed rows pass."""
    report, trace = demo()
    report["requests"] = dict(reversed(list(report["requests"].items())))
    assert list(report["requests"]) != [line["id"] for line in trace if line["event"] == "arrival"]
    assert clauses_failed(report, trace) == set()


# -- the end of the run --------------------------------------------------------------------
def test_no_snapshot_after_the_last_release_and_drain_at_the_last_release_pass() -> None:
    report, trace = demo()
    assert report["events"][-1]["event"] == "snapshot"
    report["events"].pop()  # stop stepping when idle, as an engine does
    report["summary"]["drained_at_tick"] = report["events"][-1]["time"]
    assert clauses_failed(report, trace) == set()


def test_a_leak_without_a_final_snapshot_is_still_caught() -> None:
    report, trace = demo()
    report["events"].pop()
    report["summary"]["free_blocks"] -= 1
    assert "no_leaked_pages" in clauses_failed(report, trace)


def test_pages_held_in_the_last_snapshot_and_never_released_are_a_leak() -> None:
    report, trace = demo()
    last_release = max(i for i, ev in enumerate(report["events"]) if ev["event"] == "release")
    del report["events"][last_release:]  # long's release and the drained snapshot never come
    report["summary"]["drained_at_tick"] = report["events"][-1]["time"]
    assert "no_leaked_pages" in clauses_failed(report, trace)


@pytest.mark.parametrize("drained, ok", [(8, True), (7, False), (9, False)])
def test_drain_time_lies_between_the_last_release_and_the_last_event(drained: int, ok: bool) -> None:
    report, trace = demo()
    report["summary"]["drained_at_tick"] = drained
    assert ("drain_time_consistent" not in clauses_failed(report, trace)) is ok


# -- releases -----------------------------------------------------------------------------
def test_no_release_for_a_request_that_holds_no_pages_at_its_end() -> None:
    trace = list(WORKLOADS["cancel_before_rows"].trace)
    config = WORKLOADS["cancel_before_rows"].config
    report = simulate(trace, **config)
    i = next(i for i, ev in enumerate(report["events"]) if ev["event"] == "release" and ev["id"] == "c")
    del report["events"][i]  # c was admitted and cancelled before its first row: it holds nothing
    assert clauses_failed(report, trace, config) == set()


def test_a_missing_release_for_a_request_that_holds_pages_fails() -> None:
    report, trace = demo()
    i = next(i for i, ev in enumerate(report["events"]) if ev["event"] == "release" and ev["id"] == "cancel-me")
    del report["events"][i]
    assert "release_once_after_delay" in clauses_failed(report, trace)


# -- impossible requests -------------------------------------------------------------------
def test_an_impossible_request_may_be_rejected_at_arrival() -> None:
    w = WORKLOADS["impossible"]
    report = simulate(list(w.trace), **w.config)
    # Move the rejection to the arrival tick, as a scheduler that checks on arrival would.
    events = report["events"]
    i = next(i for i, ev in enumerate(events) if ev["event"] == "rejected")
    rejected = events.pop(i)
    j = next(j for j, ev in enumerate(events) if ev["event"] == "arrival" and ev["id"] == rejected["id"])
    events.insert(j + 1, {**rejected, "time": events[j]["time"]})
    report["requests"][rejected["id"]]["end"] = events[j]["time"]
    assert clauses_failed(report, list(w.trace), w.config) == set()


def test_an_impossible_request_admitted_fails() -> None:
    w = WORKLOADS["impossible_behind"]
    report = simulate(list(w.trace), **w.config)
    assert report["requests"]["huge"]["status"] == "cancelled"  # the cancel reached it first
    assert clauses_failed(report, list(w.trace), w.config) == set()
    i = next(i for i, ev in enumerate(report["events"]) if ev["event"] == "cancelled" and ev["id"] == "huge")
    report["events"].insert(i, {"time": report["events"][i]["time"], "event": "admit", "id": "huge",
                                "reserved_blocks": 11})
    assert "impossible_rejected" in clauses_failed(report, list(w.trace), w.config)


# -- the seconds form: a client-side report ----------------------------------------------------
def client_report() -> tuple[Report, list[dict[str, Any]], dict[str, Any]]:
    trace = [{"time": 0, "event": "arrival", "id": "a", "prompt_tokens": 3, "output_tokens": 3},
             {"time": 0, "event": "arrival", "id": "b", "prompt_tokens": 3, "output_tokens": 4},
             {"time": 2, "event": "cancel", "id": "b"}]
    config = dict(BASE_CONFIG)   # what the run asks; the kit's client records its tick_seconds beside it
    events = [
        {"time": 0.001, "event": "arrival", "id": "a"}, {"time": 0.002, "event": "arrival", "id": "b"},
        {"time": 0.030, "event": "token", "id": "a", "output_index": 1},
        {"time": 0.045, "event": "token", "id": "a", "output_index": 2},
        {"time": 0.045, "event": "token", "id": "a", "output_index": 3},   # two tokens in one data frame
        {"time": 0.045, "event": "finished", "id": "a"},
        {"time": 0.101, "event": "cancelled", "id": "b"},
    ]
    row = {"status": "finished", "arrival": 0.001, "admitted": None, "end": 0.045, "output_tokens": 3,
           "token_times": [0.030, 0.045, 0.045], "queue_ticks": None, "ttft_ticks": 0.030 - 0.001,
           "itl_ticks": [0.045 - 0.030], "tpot": (0.045 - 0.030) / 2, "usage_completion_tokens": 3}
    report = {
        "schema_version": 1, "time_unit": "seconds", "config": {**config, "tick_seconds": 0.05},
        "observed": ["arrival", "token", "finished", "cancelled", "cancel_ignored", "rejected"],
        "requests": {"a": row, "b": {"status": "cancelled", "arrival": 0.002, "admitted": None, "end": 0.101,
                                     "output_tokens": 0, "token_times": [], "queue_ticks": None, "ttft_ticks": None,
                                     "itl_ticks": [], "tpot": None, "usage_completion_tokens": None}},
        "events": events, "summary": {"finished": 1, "cancelled": 1, "rejected": 0},
    }
    return report, trace, config


def test_a_client_side_report_passes_what_a_client_can_observe() -> None:
    report, trace, config = client_report()
    assert check_report(report, trace, config, honoured=CLAIMS) == []
    hidden = unobservable("pages_conserved", report, CLAIMS)
    assert hidden and "snapshot" in hidden
    assert unobservable("ttft_null_on_cancel", report, CLAIMS) is None


def test_a_client_side_report_from_a_kind_that_declares_no_claims_fails_schema_valid() -> None:
    report, trace, config = client_report()
    found = [str(v) for v in check_report(report, trace, config, claimant="file sneaky.py")]
    assert any("/observed" in v and "file sneaky.py" in v and "http:" in v for v in found), found
    assert any("/time_unit" in v and "'seconds'" in v for v in found), found
    assert any("processed_input_tokens" in v for v in found), found   # judged as the tick report it must be
    assert unobservable("pages_conserved", report) is None


@pytest.mark.parametrize("breakage, clause", [
    (lambda r: r["requests"]["a"].update(itl_ticks=[0.015, 0.0]), "itl_matches_tokens"),
    (lambda r: r["requests"]["a"].update(usage_completion_tokens=4), "usage_agrees"),
    (lambda r: r["events"][1].update(time=5.0), "arrival_matches_trace"),
    (lambda r: r["events"][6].update(time=0.05), "cancel_idempotent"),           # answered before it was sent
    (lambda r: r["requests"]["b"].update(ttft_ticks=0.0), "ttft_null_on_cancel"),
])
def test_a_client_side_report_still_catches_its_bugs(breakage: Any, clause: str) -> None:
    report, trace, config = client_report()
    breakage(report)
    assert clause in {v.clause for v in check_report(report, trace, config, honoured=CLAIMS)}


def test_the_runner_skips_unobservable_clauses_with_the_reason() -> None:
    report, trace, config = client_report()
    impl = PythonImplementation("client", lambda t, **c: copy.deepcopy(report), "test")
    impl.claims = CLAIMS   # as an entry point or a live server has them
    judge = Judge(impl)
    result = judge.judge("pages_cover_rows", trace, config)
    assert result.status == "skip" and result.unobservable and "not observable" in result.reason
    assert judge.judge("deterministic", trace, config).unobservable
    assert judge.judge("ttft_null_on_cancel", trace, config).status == "pass"


# -- schema failures: every distinct kind shows, through shrinking too ---------------------------
def two_kinds_of_schema_error(trace: Any, **config: Any) -> Report:
    report = simulate(trace, **config)
    for row in report["requests"].values():
        row["ttft_ticks"] = "soon" if row["ttft_ticks"] is not None else None   # many copies of one kind
    for ev in report["events"]:
        if ev["event"] == "cancelled":
            ev["time"] = -1                                                       # and one of another
    return report


def test_each_distinct_schema_error_is_shown_even_behind_many_of_another() -> None:
    trace = demo_trace()
    violations = check_report(two_kinds_of_schema_error(trace), trace, BASE_CONFIG, max_per_clause=2)
    messages = [v.message for v in violations]
    assert any("/ttft_ticks" in m for m in messages) and any("/time" in m for m in messages), messages


def test_shrinking_keeps_every_distinct_schema_error() -> None:
    judge = Judge(PythonImplementation("two-kinds", two_kinds_of_schema_error, "test"))
    smaller = shrink_trace(judge, "schema_valid", demo_trace(), BASE_CONFIG)
    assert any(line["event"] == "cancel" for line in smaller)  # the cancel behind the second kind stays
    messages = [v.message for v in judge.judge("schema_valid", smaller, BASE_CONFIG).violations]
    assert any("/ttft_ticks" in m for m in messages) and any("/time" in m for m in messages), messages


def test_a_trace_given_out_of_order_is_judged_in_time_order() -> None:
    trace = [{"time": 3, "event": "cancel", "id": "a"}, {"time": 0, "event": "arrival", "id": "a",
                                                         "prompt_tokens": 2, "output_tokens": 9},
             {"time": 1, "event": "cancel", "id": "a"}]
    assert clauses_failed(simulate(trace), trace) == set()
