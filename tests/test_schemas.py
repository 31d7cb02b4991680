"""The shipped JSON Schemas and the validation layer in pytest_cbatch.schemas."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import pytest

from pytest_cbatch import schemas
from pytest_cbatch.reference.scheduler_faults import demo as faults_demo
from pytest_cbatch.reference.scheduler_sim import demo_trace, simulate
from pytest_cbatch.reference.scheduler_sim import TRACE_FIELDS, validate_trace
from pytest_cbatch.schemas import (
    SCHEMA_NAMES,
    SchemaIssue,
    check_schema_all,
    load_schema,
    schema_issues,
    validator_backend,
)

try:
    import jsonschema_rs
except ImportError:  # the optional fast backend
    jsonschema_rs = None

HAVE_RS = jsonschema_rs is not None
BACKENDS = ["jsonschema", "jsonschema-rs"] if HAVE_RS else ["jsonschema"]
needs_rs = pytest.mark.skipif(not HAVE_RS, reason="jsonschema-rs is not installed")

ARRIVAL = {"time": 0, "event": "arrival", "id": "a", "prompt_tokens": 3, "output_tokens": 2}
CANCEL = {"time": 1, "event": "cancel", "id": "a"}


def verdicts(instance: Any, name: str, **kwargs: Any) -> list[SchemaIssue]:
    """The issues from every available backend, asserting that they agree exactly."""
    results = [schema_issues(instance, name, backend=backend, **kwargs) for backend in BACKENDS]
    for backend, issues in zip(BACKENDS[1:], results[1:]):
        assert issues == results[0], f"{backend} disagrees with jsonschema"
    return results[0]


def random_trace(rng: random.Random) -> list[dict[str, Any]]:
    trace: list[dict[str, Any]] = []
    for i in range(rng.randint(1, 10)):
        t = rng.randint(0, 8)
        rid = f"q{i}"
        trace.append({"time": t, "event": "arrival", "id": rid,
                      "prompt_tokens": rng.randint(1, 12), "output_tokens": rng.randint(1, 8)})
        if rng.random() < 0.35:
            trace.append({"time": t + rng.randint(0, 6), "event": "cancel", "id": rid})
    return trace


def random_config(rng: random.Random, crowded: bool) -> dict[str, Any]:
    """Tiny pools that reject requests; ``crowded`` ones admit optimistically and preempt."""
    return {
        "capacity": rng.randint(4, 8) if crowded else rng.randint(1, 6),
        "block_size": rng.randint(1, 4), "token_budget": rng.randint(1, 6),
        "max_active": 4 if crowded else rng.randint(1, 4),
        "prefill_chunk": rng.randint(1, 4), "release_delay": rng.randint(0, 2),
        "policy": "continuous" if crowded else rng.choice(["continuous", "serial"]),
        "admission": "optimistic" if crowded else rng.choice(["reserve", "optimistic"]),
    }


RANDOM_RUNS = [
    (trace, config, simulate(trace, **config))
    for seed in range(40)
    for rng in [random.Random(seed)]
    for trace, config in [(random_trace(rng), random_config(rng, crowded=seed % 2 == 1))]
]


def demo_report() -> dict[str, Any]:
    return simulate(demo_trace())


def find_event(report: dict[str, Any], kind: str) -> int:
    return next(i for i, event in enumerate(report["events"]) if event["event"] == kind)


# -- the schema documents -----------------------------------------------------

def test_every_schema_is_valid_against_its_metaschema() -> None:
    check_schema_all()


def test_ids_titles_and_descriptions() -> None:
    loaded = {name: load_schema(name) for name in SCHEMA_NAMES}
    for name, schema in loaded.items():
        assert schema["$id"] == f"https://pytest-cbatch.dev/schemas/{name}.schema.json"
        assert schema["title"] and schema["description"]
    assert len({schema["$id"] for schema in loaded.values()}) == len(SCHEMA_NAMES)


def test_load_schema_returns_fresh_copies_and_refuses_unknown_names() -> None:
    first = load_schema("report")
    first["title"] = "mutated"
    assert load_schema("report")["title"] != "mutated"
    with pytest.raises(ValueError, match="trace-line, report, faults-report"):
        load_schema("events")


def test_trace_line_schema_lists_exactly_the_loader_fields() -> None:
    defs = load_schema("trace-line")["$defs"]
    for kind, fields in TRACE_FIELDS.items():
        assert tuple(defs[kind]["required"]) == fields
        assert tuple(defs[kind]["properties"]) == fields
        assert defs[kind]["additionalProperties"] is False


def test_report_event_union_names_exactly_the_reference_vocabulary() -> None:
    declared = set(load_schema("report")["$defs"]["event_name"]["anyOf"][0]["enum"])
    emitted = {event["event"] for _, _, report in RANDOM_RUNS for event in report["events"]}
    assert emitted == declared


def test_module_import_loads_no_validator() -> None:
    code = "import sys, pytest_cbatch.schemas; print(sorted({'jsonschema', 'jsonschema_rs'} & set(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    assert done.stdout.strip() == "[]"


# -- reference output validates ---------------------------------------------

@pytest.mark.parametrize("policy", ["continuous", "serial"])
@pytest.mark.parametrize("admission", ["reserve", "optimistic"])
def test_demo_reports_validate(policy: str, admission: str) -> None:
    report = simulate(demo_trace(), policy=policy, admission=admission)
    assert verdicts(report, "report") == []
    assert verdicts(json.loads(json.dumps(report)), "report") == []


def test_random_reports_and_their_traces_validate() -> None:
    for trace, config, report in RANDOM_RUNS:
        assert verdicts(report, "report") == [], config
        for line in trace:
            assert verdicts(line, "trace-line") == [], line
    events = [event for _, _, report in RANDOM_RUNS for event in report["events"]]
    assert {"preempted", "rejected", "cancelled", "cancel_ignored"} <= {event["event"] for event in events}
    assert any(row["phase"] == "recompute" for event in events if event["event"] == "dispatch" for row in event["work"])


def test_faults_demo_report_validates() -> None:
    report = faults_demo()  # holds tuples, which JSON writes as arrays
    assert verdicts(report, "faults-report") == []
    assert verdicts(json.loads(json.dumps(report)), "faults-report") == []


# -- negative and permissive cases -------------------------------------------

Mutation = Callable[[dict[str, Any]], Any]


def set_in_event(kind: str, *keys: Any, value: Any) -> Mutation:
    """Set ``keys`` inside the first ``kind`` event of the report to ``value``."""
    def mutate(report: dict[str, Any]) -> None:
        target = report["events"][find_event(report, kind)]
        for key in keys[:-1]:
            target = target[key]
        target[keys[-1]] = value
    return mutate


def event_path(kind: str, *rest: Any) -> Callable[[dict[str, Any]], str]:
    return lambda report: "/".join(["", "events", str(find_event(report, kind)), *map(str, rest)])


TRACE_CASES = {
    "boolean time": ({**ARRIVAL, "time": True}, "/time"),
    "boolean length": ({**ARRIVAL, "prompt_tokens": False}, "/prompt_tokens"),
    "zero length": ({**ARRIVAL, "output_tokens": 0}, "/output_tokens"),
    "negative time": ({**CANCEL, "time": -1}, "/time"),
    "string time": ({**ARRIVAL, "time": "0"}, "/time"),
    "empty id": ({**ARRIVAL, "id": ""}, "/id"),
    "unknown field": ({**ARRIVAL, "priority": 1}, ""),
    "cancel with lengths": ({**CANCEL, "prompt_tokens": 1}, ""),
    "missing field": ({"time": 0, "event": "arrival", "id": "a", "prompt_tokens": 3}, ""),
    "unknown kind": ({**CANCEL, "event": "pause"}, "/event"),
}


@pytest.mark.parametrize("case", TRACE_CASES)
def test_bad_trace_lines(case: str) -> None:
    line, path = TRACE_CASES[case]
    issues = verdicts(line, "trace-line")
    assert issues and issues[0].path == path, issues
    with pytest.raises(ValueError):  # the loader refuses it too
        validate_trace([ARRIVAL, line] if line.get("event") == "cancel" else [line])


def test_unknown_field_and_missing_field_messages_name_the_field() -> None:
    assert "'priority' was unexpected" in verdicts({**ARRIVAL, "priority": 1}, "trace-line")[0].message
    assert "'id' is a required property" in verdicts({"time": 0, "event": "cancel"}, "trace-line")[0].message
    assert verdicts([ARRIVAL], "trace-line")[0].path == ""


def drop_summary_field(report: dict[str, Any]) -> None:
    del report["summary"]["dispatches"]


def bad_row_in_slashed_id(report: dict[str, Any]) -> None:
    report["requests"]["a/b~c"] = {**report["requests"]["long"], "arrival": -1}


REPORT_CASES: dict[str, tuple[Mutation, Any]] = {
    "boolean event time": (set_in_event("arrival", "time", value=True), event_path("arrival", "time")),
    "string event time": (set_in_event("release", "time", value="3"), event_path("release", "time")),
    "boolean output_index": (set_in_event("token", "output_index", value=True), event_path("token", "output_index")),
    "output_index 0": (set_in_event("token", "output_index", value=0), event_path("token", "output_index")),
    "boolean input_tokens": (set_in_event("dispatch", "work", 0, "input_tokens", value=True),
                             event_path("dispatch", "work", 0, "input_tokens")),
    "wrong phase": (set_in_event("dispatch", "work", 0, "phase", value="warmup"),
                    event_path("dispatch", "work", 0, "phase")),
    "unknown event": (set_in_event("finished", "event", value="stall"), event_path("finished", "event")),
    "bare x- prefix": (set_in_event("finished", "event", value="x-"), event_path("finished", "event")),
    "missing event field": (lambda r: r["events"][find_event(r, "admit")].pop("reserved_blocks"),
                            event_path("admit")),
    "bad cancel_ignored status": (lambda r: r["events"].append(
        {"time": 9, "event": "cancel_ignored", "id": "long", "status": "queued"}),
        lambda r: f"/events/{len(r['events'])}/status"),
    "boolean page id": (set_in_event("snapshot", "block_tables", value={"long": [0, True]}),
                        event_path("snapshot", "block_tables", "long", 1)),
    "string ttft": (lambda r: r["requests"]["short"].update(ttft_ticks="2"), "/requests/short/ttft_ticks"),
    "escaped pointer": (bad_row_in_slashed_id, "/requests/a~1b~0c/arrival"),
    "missing summary field": (drop_summary_field, "/summary"),
    "missing top-level field": (lambda r: r.pop("requests"), ""),
    "wrong time unit": (lambda r: r.update(time_unit="ms"), "/time_unit"),
}


@pytest.mark.parametrize("case", REPORT_CASES)
def test_bad_reports(case: str) -> None:
    mutate, path = REPORT_CASES[case]
    report = demo_report()
    expected = path(report) if callable(path) else path  # where the mutation will strike
    mutate(report)
    issues = verdicts(report, "report")
    assert issues and issues[0].path == expected, issues


def test_unknown_event_message_lists_the_alternatives() -> None:
    report = demo_report()
    set_in_event("finished", "event", value="stall")(report)
    message = verdicts(report, "report")[0].message
    assert "'stall'" in message and "'preempted'" in message and "^x-" in message


PERMITTED: dict[str, Mutation] = {
    "x-custom event": lambda r: r["events"].append({"time": 3, "event": "x-custom", "anything": [True, None]}),
    "extra event field": set_in_event("token", "logprob", value=-0.25),
    "extra work-row field": set_in_event("dispatch", "work", 0, "cached_tokens", value=1),
    "extra request and summary fields": lambda r: (r["requests"]["long"].update(model="m"),
                                                   r["summary"].update(preemptions=0)),
    "negative headroom and budget": lambda r: (set_in_event("snapshot", "admission_headroom", value=-3)(r),
                                               set_in_event("dispatch", "unused_budget", value=-1)(r)),
    "explicit reserve admission": lambda r: r["config"].update(admission="reserve"),
}


@pytest.mark.parametrize("case", PERMITTED)
def test_permitted_variations(case: str) -> None:
    report = demo_report()
    PERMITTED[case](report)
    assert verdicts(report, "report") == []


def test_bad_faults_reports() -> None:
    report = faults_demo()
    report["request_events"][1]["index"] = True
    report["transfer_events"][1]["reason"] = "cancelled"
    report["request_events"].append({"event": "x-note"})
    assert [issue.path for issue in verdicts(report, "faults-report")] == [
        "/request_events/1/index", "/transfer_events/1/reason",
    ]


# -- behaviour of the validation layer ------------------------------------------

def test_limit_and_argument_errors() -> None:
    report = demo_report()
    for event in report["events"]:
        event["time"] = -1
    assert len(verdicts(report, "report", limit=3)) == 3
    with pytest.raises(ValueError, match="limit"):
        schema_issues(report, "report", limit=0)
    with pytest.raises(ValueError, match="unknown schema"):
        schema_issues(report, "reports")
    with pytest.raises(ValueError, match="unknown backend"):
        schema_issues(report, "report", backend="fastjsonschema")


def test_issue_is_frozen_and_prints_its_place() -> None:
    issue = SchemaIssue("", "'id' is a required property")
    assert str(issue) == "(document): 'id' is a required property"
    assert str(SchemaIssue("/time", "True is not of type 'integer'")) == "/time: True is not of type 'integer'"
    with pytest.raises(AttributeError):
        issue.path = "/x"  # type: ignore[misc]


def test_long_messages_are_cut() -> None:
    report = demo_report()
    report["events"] = {"huge": list(range(10_000))}
    message = verdicts(report, "report")[0].message
    assert len(message) <= 400 and message.endswith("...")


def test_values_json_cannot_hold_are_judged_by_jsonschema() -> None:
    report = demo_report()
    set_in_event("token", "debug", value={1, 2})(report)  # unconstrained extra field
    assert verdicts(report, "report") == []
    set_in_event("dispatch", "work", value={1, 2})(report)
    assert [issue.path for issue in verdicts(report, "report")] == [event_path("dispatch", "work")(report)]


def test_without_jsonschema_rs_the_pure_path_decides(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(schemas, "_rs_module", lambda: None)
    assert validator_backend() == "jsonschema"
    assert schema_issues({**ARRIVAL, "time": True}, "trace-line")[0].path == "/time"
    with pytest.raises(ImportError, match="jsonschema-rs"):
        schema_issues(ARRIVAL, "trace-line", backend="jsonschema-rs")


@needs_rs
def test_jsonschema_rs_is_the_default_backend() -> None:
    assert validator_backend() == "jsonschema-rs"


@needs_rs
def test_jsonschema_rs_treats_booleans_as_non_integers() -> None:
    for keyword in ({"type": "integer"}, {"type": "number"}, {"const": 1}, {"enum": [0, 1]}):
        validator = jsonschema_rs.validator_for(keyword)
        assert not validator.is_valid(True) and not validator.is_valid(False), keyword
    assert schema_issues({**ARRIVAL, "output_tokens": True}, "trace-line", backend="jsonschema-rs")


def large_invalid_report() -> dict[str, Any]:
    """A report with over _SCREEN_MIN requests and thousands of events, broken in a few places."""
    rng = random.Random(7)
    trace = [{"time": i // 3, "event": "arrival", "id": f"r{i}", "prompt_tokens": rng.randint(1, 30),
              "output_tokens": rng.randint(1, 20)} for i in range(80)]
    report = simulate(trace, capacity=64, block_size=4, token_budget=16, max_active=8)
    assert len(report["requests"]) >= schemas._SCREEN_MIN
    events = report["events"]
    events[5]["time"] = True
    events[len(events) // 2]["event"] = "stall"
    events[-3]["time"] = "late"
    report["requests"]["r40"]["token_times"] = [1, None]
    return report


@needs_rs
def test_screened_explanation_matches_the_pure_one(monkeypatch: pytest.MonkeyPatch) -> None:
    report = large_invalid_report()
    screened = []
    original = schemas._Screen._accepts

    def counting(self: Any, subschema: dict[str, Any], value: Any) -> bool:
        screened.append(value)
        return original(self, subschema, value)

    monkeypatch.setattr(schemas._Screen, "_accepts", counting)
    issues = verdicts(report, "report")
    assert [issue.path for issue in issues] == [
        "/requests/r40/token_times/1", "/events/5/time",
        f"/events/{len(report['events']) // 2}/event", f"/events/{len(report['events']) - 3}/time",
    ]
    assert len(screened) >= len(report["events"])


@needs_rs
def test_backend_disagreement_falls_back_to_jsonschema_rs_words(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(schemas, "_explain", lambda validator, instance, limit: [])
    issues = schema_issues({**ARRIVAL, "time": True}, "trace-line", backend="jsonschema-rs")
    assert [issue.path for issue in issues] == ["/time"]
    assert schema_issues(ARRIVAL, "trace-line", backend="jsonschema-rs") == []
