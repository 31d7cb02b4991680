"""pytest_cbatch.engine_report: the helpers engine adapters build their reports with."""

from __future__ import annotations

import pytest

from pytest_cbatch.engine_report import EventLog, engine_report, engine_run_input, engine_step, pool_tokens


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


DEMO = {"capacity": 8, "block_size": 4, "token_budget": 16, "max_active": 4, "prefill_chunk": 8, "release_delay": 0,
        "policy": "continuous"}


def test_a_run_input_is_the_validated_config_then_the_sorted_trace() -> None:
    trace = [{"time": 1, "event": "cancel", "id": "a"}, {"time": 0, "event": "arrival", "id": "a",
                                                          "prompt_tokens": 3, "output_tokens": 2}]
    config, lines = engine_run_input(trace, **DEMO)
    assert config == DEMO and "admission" not in config
    assert [line["event"] for line in lines] == ["arrival", "cancel"]
    assert engine_run_input(trace, **DEMO, admission="reserve")[0]["admission"] == "reserve"
    with pytest.raises(ValueError, match="capacity"):  # the config is checked before the trace
        engine_run_input([{"time": -1}], **{**DEMO, "capacity": 0})
    with pytest.raises(ValueError, match="prompt_tokens"):
        engine_run_input([{**trace[1], "prompt_tokens": 0}], **DEMO)


def test_a_pool_beyond_the_model_context_is_unsupported() -> None:
    assert pool_tokens(DEMO, 32) == 32
    with pytest.raises(NotImplementedError,
                       match=r"^capacity \* block_size = 32 exceeds the model's max_position_embeddings 31$"):
        pool_tokens(DEMO, 31)


def test_a_failing_engine_step_is_one_runtime_error_naming_step_tick_and_open_requests() -> None:
    asked = []

    def unfinished() -> str:
        asked.append(True)
        return "a (active)"

    with engine_step("X's step", 3, unfinished):
        pass
    assert asked == []  # only a failure asks for the open requests
    with pytest.raises(RuntimeError) as caught:
        with engine_step("X's step", 3, unfinished):
            raise KeyError("b")
    assert str(caught.value) == "X's step failed at tick 3: KeyError: 'b'; unfinished: a (active)"
    assert isinstance(caught.value.__cause__, KeyError)
