"""Fuzzing the trust boundary: no hostile value reaches a traceback of the kit.

Everything judged code hands back, and everything a user types, is fuzzed here with seeded,
derandomized Hypothesis searches (and seeded case lists where Hypothesis itself runs inside):
traces, configs, command-line and pytest/ini options, reports, ``exec:`` output, and the values
lifecycle parts return.  Each case must end in a clean verdict: a usage error (exit 2, a
``pytest.UsageError``, a ValueError naming the place), a ``completes`` or ``schema_valid`` failure
naming the field, or another clause's verdict; never an internal exception (AttributeError,
TypeError, RecursionError, OverflowError, KeyError, UnicodeDecodeError ...), and never a lifecycle
verdict ``error`` (a part that "broke down outside any clause").  The default run is brief; with
``--run-slow`` each search tries ten times the examples.

The hostile values themselves (``hostile``) are the classes that once crashed the kit: objects whose
``__eq__``/``__hash__``/``__repr__``/``__str__``/``__iter__`` raise, subclasses of int, str, float,
list and dict, integers of thousands of digits, NaN and infinity, sets, tuples and bytes, and nesting
a hundred thousand levels deep.  The focused regression test of each class is in ``test_boundary.py``.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any, Callable

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from pytest_cbatch import cli
from pytest_cbatch.bounded import Bounds
from pytest_cbatch.explain import explain_failure
from pytest_cbatch.impls import BrokenOutput, PythonImplementation, Refused, Unsupported
from pytest_cbatch.kinds.command import exec_report
from pytest_cbatch.lifecycle import PART_CLAUSES, lifecycle_verdicts
from pytest_cbatch.plain import NotPlain, plain
from pytest_cbatch.reference import scheduler_faults
from pytest_cbatch.reference.scheduler_sim import load_trace, simulate, validate_config, validate_trace
from pytest_cbatch.runner import ALL_CLAUSES, Judge
from pytest_cbatch.workloads import BASE_CONFIG

TRACE = validate_trace([
    {"time": 0, "event": "arrival", "id": "a", "prompt_tokens": 3, "output_tokens": 2},
    {"time": 0, "event": "arrival", "id": "b", "prompt_tokens": 2, "output_tokens": 3},
    {"time": 1, "event": "cancel", "id": "b"},
])
CONFIG = dict(BASE_CONFIG)
REPORT = simulate(TRACE, **CONFIG)


# -- hostile values ------------------------------------------------------------------------------------

class Boom(Exception):
    """What every hostile method raises."""


def _boom(*_: Any) -> Any:
    raise Boom("hostile method")


def _hostile_class(name: str, *methods: str, base: type = object) -> type:
    namespace: dict[str, Any] = {m: _boom for m in methods}
    if "__eq__" in methods and "__hash__" not in methods:
        namespace["__hash__"] = base.__hash__ if base.__hash__ is not None else object.__hash__
    return type(name, (base,), namespace)


HOSTILE_CLASSES = [
    _hostile_class("RaisesOnEq", "__eq__", "__ne__"),
    _hostile_class("RaisesOnRepr", "__repr__", "__str__"),
    _hostile_class("RaisesOnHash", "__hash__"),
    _hostile_class("RaisesOnIter", "__iter__", "__len__"),
    _hostile_class("RaisesOnBool", "__bool__"),
    _hostile_class("HostileInt", "__eq__", "__repr__", "__str__", "__index__", "__int__", base=int),
    _hostile_class("HostileStr", "__eq__", "__repr__", "__str__", "__len__", "__iter__", base=str),
    _hostile_class("HostileFloat", "__eq__", "__repr__", "__float__", base=float),
    _hostile_class("HostileList", "__eq__", "__iter__", "__len__", "__getitem__", "__repr__", base=list),
    _hostile_class("HostileDict", "__eq__", "__iter__", "__len__", "__getitem__", "get", "keys", "items",
                   "__repr__", "__contains__", base=dict),
    type("QuietInt", (int,), {}), type("QuietStr", (str,), {}), type("QuietDict", (dict,), {}),
]


def _instance(cls: type, seed: int) -> Any:
    for base, value in ((int, seed), (float, seed + 0.5), (str, f"s{seed}"), (list, [seed]), (dict, {"k": seed})):
        if issubclass(cls, base):
            return cls(value)
    return cls()


def nested(depth: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(depth):
        value = [value]
    return value


LEAVES = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=8),
    st.sampled_from(["2**63", "-2**63-1", "10**5000", "float('nan')", "float('inf')"]).map(eval),
    st.builds(_instance, st.sampled_from(HOSTILE_CLASSES), st.integers(0, 9)),
    st.binary(max_size=4), st.frozensets(st.integers(0, 3), max_size=2), st.tuples(st.integers(0, 3)),
    st.sampled_from([70, 2000, 100_000]).map(nested),
)
KEYS = st.text(max_size=4) | st.integers(0, 3) | st.tuples(st.integers(0, 3)) | st.builds(
    _instance, st.sampled_from([c for c in HOSTILE_CLASSES if c.__name__ in ("RaisesOnRepr", "QuietStr", "QuietInt")]),
    st.integers(0, 9))
hostile = st.recursive(
    LEAVES,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(KEYS, inner, max_size=3),
    max_leaves=6,
)


def brief(request: pytest.FixtureRequest, examples: int) -> settings:
    """Seeded settings: ``examples`` examples (ten times as many with --run-slow), no database, no shrinking
    past a few seconds (a failure here is an internal exception, whose first example says enough)."""
    slow = request.config.getoption("--run-slow")
    return settings(max_examples=examples * (10 if slow else 1), derandomize=True, database=None, deadline=None,
                    suppress_health_check=list(HealthCheck), phases=(Phase.generate, Phase.shrink))


# -- reports (what simulate returns) --------------------------------------------------------------------

@st.composite
def corrupted_reports(draw: st.DrawFn) -> Any:
    """The reference's report with one node replaced by a hostile value (or dropped), or a hostile value whole."""
    if draw(st.integers(0, 9)) == 0:
        return draw(hostile)
    report = json.loads(json.dumps(REPORT))
    node: Any = report
    while True:
        keys = list(node) if isinstance(node, dict) else list(range(len(node)))
        if not keys:
            return report
        key = draw(st.sampled_from(keys))
        child = node[key]
        if isinstance(child, (dict, list)) and child and draw(st.booleans()):
            node = child
            continue
        if isinstance(node, dict) and draw(st.integers(0, 5)) == 0:
            del node[key]
        else:
            node[key] = draw(hostile)
        return report


class HostileError(Exception):
    """An exception whose message cannot be read."""

    __str__ = __repr__ = _boom


def judge_all(report: Any, behaviour: str = "return") -> None:
    """Judge every clause on an implementation that returns ``report`` (with ``behaviour`` "mutate", after
    writing it into its input; with "raise", it raises an exception carrying it, whose message cannot be
    read); render each failure as the plugin does."""

    def simulate(trace: list[Any], **config: Any) -> Any:
        if behaviour == "raise":
            raise HostileError(report)
        if behaviour == "mutate":
            trace[0]["id"] = report
            config["capacity"] = report
            return REPORT
        return report

    judge = Judge(PythonImplementation("fuzz", simulate, "fuzz", Bounds(seconds=30, memory_mib=0)))
    if behaviour != "return":
        results = [judge.judge(clause, TRACE, CONFIG) for clause in ("completes", "input_not_mutated")]
        assert all(r.status in ("pass", "fail", "skip") for r in results), results
        assert any(r.status == "fail" for r in results) or report == TRACE[0]["id"], results
        return
    results = [judge.judge(clause, TRACE, CONFIG) for clause in ALL_CLAUSES if clause != "invalid_input_refused"]
    try:
        plain(report)
        clean = True
    except NotPlain as exc:
        clean = False
        completes = results[0]
        assert completes.status == "fail" and exc.path in completes.violations[0].message, completes
    for result in results:
        assert result.status in ("pass", "fail", "skip"), result
        if result.status == "fail":
            text = explain_failure(spec="fuzz", clause=result.clause, workload="fuzz", violations=result.violations,
                                   trace=TRACE, config=CONFIG, report=result.report, trace_path="fuzz.jsonl",
                                   stack=result.stack, stopped=result.stopped)
            assert result.clause in text
    if clean and not isinstance(report, dict):  # a report is a JSON object
        assert any(r.clause in ("completes", "schema_valid") and r.status == "fail" for r in results), results


def test_hostile_reports_end_in_verdicts(request: pytest.FixtureRequest) -> None:
    @brief(request, 25)
    @given(corrupted_reports(), st.sampled_from(["return"] * 8 + ["raise", "mutate"]))
    def check(report: Any, behaviour: str) -> None:
        judge_all(report, behaviour)

    check()


# -- exec: output ----------------------------------------------------------------------------------------

JSON_TEXT = st.one_of(
    st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=5),
                 lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
                 max_leaves=6).map(json.dumps),
    st.just(5000).map(lambda digits: json.dumps(REPORT).replace('"time": 1', '"time": ' + "9" * digits, 1)),
    st.sampled_from(["[" * 100_000, "[" * 65 + "]" * 65, '{"a": NaN}', "Infinity", ""]),
).map(lambda text: text.encode())


def test_hostile_exec_output_ends_in_verdicts(request: pytest.FixtureRequest) -> None:
    @brief(request, 60)
    @given(st.sampled_from([0, 0, 0, 1, 2, 3, -9, 137]), JSON_TEXT | st.binary(max_size=40),
           st.binary(max_size=40) | st.text().map(str.encode))
    def check(code: int, stdout: bytes, stderr: bytes) -> None:
        try:
            report = exec_report("exec:fuzz", code, stdout, stderr)
        except (Unsupported, Refused, BrokenOutput) as exc:
            assert str(exc) and isinstance(getattr(exc, "stack", ""), str)
            return
        assert plain(report) == report
        judge_all(report)

    check()


# -- traces, configs and command-line options -----------------------------------------------------------

TRACE_LINES = st.one_of(
    st.binary(max_size=30),
    st.builds(lambda line: json.dumps(line).encode(), st.fixed_dictionaries(
        {"time": st.integers(), "event": st.sampled_from(["arrival", "cancel", "x"]), "id": st.text(max_size=3)},
        optional={"prompt_tokens": st.integers() | st.floats(), "output_tokens": st.integers() | st.text()})),
    st.sampled_from([100_000, 5000]).map(lambda n: b"[" * n if n > 5000 else b'{"time": ' + b"9" * n + b"}"),
    st.sampled_from([b'{"time": NaN}', b"\xff\xfe"]),
)


def test_hostile_trace_files_are_refused_by_line(request: pytest.FixtureRequest, tmp_path: Path) -> None:
    @brief(request, 60)
    @given(st.lists(TRACE_LINES, min_size=1, max_size=4))
    def check(lines: list[bytes]) -> None:
        path = tmp_path / "trace.jsonl"
        path.write_bytes(b"\n".join(lines))
        try:
            trace = load_trace(str(path))
        except ValueError as exc:
            assert str(path) in str(exc) and " line " in str(exc), exc
            return
        assert plain(trace) == trace

    check()


# -- check_report's own arguments (the caller's config and trace) --------------------------------------

SETTING_VALUES = (st.integers(-3, 10**6) | st.floats(allow_nan=False, max_value=1e6) | st.text(max_size=6)
                  | st.booleans() | st.none() | st.lists(st.integers(0, 9), max_size=2)
                  | st.sampled_from(["reserve", "optimistic", "continuous", "serial", "fifo", "4"])
                  | st.dictionaries(st.text(max_size=2), st.integers(0, 3), max_size=1) | hostile)


@st.composite
def api_arguments(draw: st.DrawFn) -> tuple[Any, Any]:
    """(config, trace) for ``check_report``: the demo's with one setting or one trace field replaced (or added),
    or a hostile value whole."""
    config: Any = dict(CONFIG)
    trace: Any = [dict(line) for line in TRACE]
    which = draw(st.integers(0, 9))
    if which < 6:
        key = draw(st.sampled_from([*CONFIG, "admission", "tick", "capacity "]))
        config[key] = draw(SETTING_VALUES)
    elif which < 9:
        line = draw(st.sampled_from(trace))
        line[draw(st.sampled_from([*line, "extra"]))] = draw(SETTING_VALUES)
    else:
        config, trace = draw(st.sampled_from([(hostile, trace), (config, hostile)]).flatmap(
            lambda pair: st.tuples(*(p if isinstance(p, st.SearchStrategy) else st.just(p) for p in pair))))
    return config, trace


def _valid_input(config: Any, trace: Any) -> bool:
    """Whether ``cbatch check`` would take ``config`` and ``trace``: plain data, valid settings, a valid trace."""
    try:
        settings_ = plain(config)
        return isinstance(settings_, dict) and validate_config(settings_) is not None and \
            validate_trace(plain(trace)) is not None
    except ValueError:
        return False


def test_check_report_refuses_a_bad_config_or_trace_with_a_value_error(request: pytest.FixtureRequest) -> None:
    """Whatever its caller passes, check_report judges a valid config and trace and refuses any other with a
    ValueError naming the place (as cbatch check refuses its input): never an internal exception, never a
    verdict on settings no workload could ask for."""
    from pytest_cbatch.contract import check_report

    seen = {True: 0, False: 0}

    @brief(request, 60)
    @given(api_arguments())
    def check(arguments: tuple[Any, Any]) -> None:
        config, trace = arguments
        valid = _valid_input(config, trace)
        seen[valid] += 1
        try:
            found = check_report(REPORT, trace, config)
        except ValueError as exc:
            assert not valid, exc
            assert str(exc).startswith(("config", "trace")), exc
            return
        assert valid, (config, trace)
        assert all(v.clause for v in found), found

    check()
    assert seen[True] and seen[False], seen   # both kinds were tried


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = cli.main(list(argv))
    out = capsys.readouterr()
    assert "Traceback" not in out.out + out.err, out
    return code, out.err


CONFIG_JSON = st.one_of(
    st.dictionaries(st.sampled_from(["capacity", "block_size", "token_budget", "max_active", "policy"]),
                    st.integers() | st.floats() | st.text(max_size=4) | st.booleans() | st.none(),
                    min_size=1, max_size=2).map(json.dumps),
    st.sampled_from([100_000, 5000]).map(lambda n: "[" * n if n > 5000 else '{"capacity": ' + "9" * n + "}"),
    st.sampled_from(['{"capacity": 1e400}', '{"capacity": 1.5}']),
    st.text(max_size=12),
)


def test_hostile_configs_and_flags_are_usage_errors_or_verdicts(request: pytest.FixtureRequest,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    @brief(request, 15)
    @given(CONFIG_JSON, st.sampled_from([[], ["--capacity", "99999999999999999999999"], ["--capacity", "-1"],
                                         ["--max-active", str(2**63)]]))
    def check(config_json: str, flags: list[str]) -> None:
        code, err = run_cli(capsys, "check", "--impl", "reference", "--config-json", config_json, *flags)
        assert code in (0, 1, 2), (code, err)
        if code == 2:
            assert err.startswith("error: "), err

    check()


def test_hostile_pytest_settings_are_usage_errors(request: pytest.FixtureRequest) -> None:
    from pytest_cbatch.plugin import _config_overrides

    @brief(request, 100)
    @given(st.sampled_from(["capacity", "policy", "release_delay", "capcity", ""]),
           st.text(max_size=8) | st.sampled_from(["--1", "²", "1e3", " 7 "]) | st.just(5000).map("9".__mul__))
    def check(key: str, value: str) -> None:
        try:
            chosen = _config_overrides([f"{key}={value}"])
        except pytest.UsageError as exc:
            assert "--cbatch-config" in str(exc)
            return
        assert plain(chosen) == chosen

    check()


def test_hostile_breaker_settings_are_usage_errors(request: pytest.FixtureRequest) -> None:
    from types import SimpleNamespace

    from pytest_cbatch.plugin import _breaker

    @brief(request, 60)
    @given(st.text(max_size=8) | st.sampled_from(["-1", "1e3", "9" * 40, "²", " 4 "]))
    def check(value: str) -> None:
        config = SimpleNamespace(getoption=lambda name: value, getini=lambda name: None)
        try:
            breaker = _breaker(config)
        except pytest.UsageError as exc:
            assert "--cbatch-max-timeouts" in str(exc) and repr(value) in str(exc)
            return
        assert breaker.limit == int(value)

    check()


def test_hostile_expectation_files_are_usage_errors(request: pytest.FixtureRequest, tmp_path: Path) -> None:
    from pytest_cbatch.expect import ExpectError, load_expectations

    @brief(request, 60)
    @given(st.binary(max_size=40) | st.just(10_000).map(lambda n: b"x = " + b"[" * n) | st.sampled_from([
                                                      b"strict = true\n\xff",
                                                      b"[[expect]]\nclause = 'x'\naction = 'xfail'\nreason = 'r'\n"
                                                      b"expires = 1979-05-27T07:32:00"]))
    def check(content: bytes) -> None:
        path = tmp_path / "expect.toml"
        path.write_bytes(content)
        try:
            load_expectations(path)
        except ExpectError as exc:
            assert str(path) in str(exc)

    check()


# -- lifecycle return values ---------------------------------------------------------------------------

# What each part's reads and calls are: (class name in the reference, member, kind).
LIFECYCLE_MEMBERS: dict[str, list[tuple[str, str, str]]] = {
    "allocator": [("PagedKV", name, "property") for name in ("free", "pages", "tables", "transfers")]
                 + [("PagedKV", name, "method") for name in ("read", "pin", "append", "fork", "create")],
    "recompute": [("RecomputeRequest", name, "property") for name in ("state", "outputs", "events", "prompt",
                                                                      "committed", "recomputed_rows")]
                 + [("RecomputeRequest", name, "method") for name in ("resume", "sample", "preempt")],
    "transfer": [("TransferManager", name, "property") for name in ("generation", "rooms", "records")]
                + [("TransferManager", name, "method") for name in ("begin", "read", "complete", "abort")],
}


def hostile_namespace(owner: str, member: str, kind: str, value: Callable[[], Any], after: int) -> Any:
    """The reference's lifecycle classes, but ``owner.member`` gives ``value()`` from its ``after``-th use on
    (counted from the creation of the latest ``owner``)."""
    base = getattr(scheduler_faults, owner)
    uses = [0]

    def give(real: Any) -> Any:
        uses[0] += 1
        return value() if uses[0] > after else real

    if kind == "property":
        slot = getattr(base, member, None)
        if isinstance(slot, property):
            attr: Any = property(lambda self: give(slot.fget(self)))
        else:  # an instance attribute: read through __getattribute__
            def __getattribute__(self: Any, name: str) -> Any:
                real = object.__getattribute__(self, name)
                return give(real) if name == member else real
            attr = None
    else:
        method = getattr(base, member)
        attr = lambda self, *args: give(method(self, *args))  # noqa: E731

    def __init__(self: Any, *args: Any) -> None:
        uses[0] = 0  # each new object counts afresh: an example replays the same way
        base.__init__(self, *args)

    namespace = {member: attr} if attr is not None else {"__getattribute__": __getattribute__}
    cls = type(owner, (base,), {**namespace, "__init__": __init__})
    names = {name: getattr(scheduler_faults, name) for name in ("PagedKV", "RecomputeRequest", "TransferManager")}
    names[owner] = cls
    return type("Hostile", (), names)


def lifecycle_cases(count: int, seed: int = 28) -> list[tuple[str, str, str, str, int, int]]:
    rng = random.Random(seed)
    cases = []
    for _ in range(count):
        part = rng.choice(sorted(LIFECYCLE_MEMBERS))
        owner, member, kind = rng.choice(LIFECYCLE_MEMBERS[part])
        cases.append((part, owner, member, kind, rng.randrange(len(HOSTILE_VALUES)), rng.choice([0, 1, 3, 8])))
    return cases


HOSTILE_VALUES: list[Callable[[], Any]] = [
    *(lambda cls=cls: _instance(cls, 1) for cls in HOSTILE_CLASSES),
    lambda: 10**5000, lambda: float("nan"), lambda: nested(100_000), lambda: {"state": object()},
    lambda: [_instance(HOSTILE_CLASSES[0], 0)], lambda: {_instance(HOSTILE_CLASSES[0], 0): 1},
    lambda: (1, _instance(HOSTILE_CLASSES[1], 0)), lambda: "active", lambda: None, lambda: -1,
]


LIFECYCLE_SETTINGS = settings(max_examples=3, derandomize=True, database=None, deadline=None,
                              phases=(Phase.generate,), suppress_health_check=list(HealthCheck))


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "lifecycle_case" in metafunc.fixturenames:
        count = 120 if metafunc.config.getoption("--run-slow") else 6
        metafunc.parametrize("lifecycle_case", lifecycle_cases(count), ids=lambda c: f"{c[0]}-{c[2]}-{c[4]}-{c[5]}")


def test_hostile_lifecycle_values_end_in_clause_verdicts(lifecycle_case: tuple[str, str, str, str, int, int]) -> None:
    """Seeded cases, not a Hypothesis search: each case runs Hypothesis's own search of a lifecycle part."""
    part, owner, member, kind, which, after = lifecycle_case
    namespace = hostile_namespace(owner, member, kind, HOSTILE_VALUES[which], after)
    verdicts = lifecycle_verdicts(part, namespace, LIFECYCLE_SETTINGS, bounds=Bounds(seconds=30, memory_mib=0))
    assert set(verdicts) == set(PART_CLAUSES[part])
    broken = {cid: v.message for cid, v in verdicts.items() if v.status == "error"}
    assert not broken, broken
