"""pytest_cbatch.engine_report: the helpers engine adapters build their reports with."""

from __future__ import annotations

from pytest_cbatch.engine_report import EventLog, engine_report


def test_an_event_log_records_events_in_order_and_counts_dispatches() -> None:
    log = EventLog()
    log.emit(0, "arrival", "a")
    log.dispatch(0, [("a", "prefill", 3)], token_budget=4)
    log.emit(1, "token", "a", output_index=1)
    log.emit(1, "finished", "a")
    log.dispatch(1, [("a", "decode", 1)], token_budget=4)
    assert log.events[:2] == [{"time": 0, "event": "arrival", "id": "a"},
                              {"time": 0, "event": "dispatch", "unused_budget": 1,
                               "work": [{"id": "a", "phase": "prefill", "input_tokens": 3}]}]
    assert log.events[2] == {"time": 1, "event": "token", "id": "a", "output_index": 1}
    assert (log.dispatches, log.fed) == (2, 4)
    report = engine_report(config={}, arrivals={"a": {"time": 0}}, status={"a": "finished"}, events=log.events,
                           dispatches=log.dispatches, fed=log.fed, free_blocks=8, engine="test")
    assert report["summary"]["processed_input_tokens"] == 4 and report["requests"]["a"]["token_times"] == [1]


def test_an_event_without_a_request_names_none() -> None:
    log = EventLog()
    log.emit(2, "snapshot", active=[], queued=[])
    assert log.events == [{"time": 2, "event": "snapshot", "active": [], "queued": []}]
