"""The child's reply pipe is a boundary: hostile bytes on it fail that call of that submission, never the
grader, and never cost the grader its memory.  Each submission here writes straight to the pipe the sandbox
child answers on (its fd is in the child's command line), as a hostile student's code can."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings, strategies as st

from pytest_cbatch.runner import Judge
from pytest_cbatch.sandbox import IsolatedImplementation, Limits, bwrap_problem, load_spec_for
from pytest_cbatch.sandbox.protocol import MAX_CONTAINERS, MAX_DEPTH, ReplyReader, SandboxFailure, bound_problem

NO_BWRAP = bwrap_problem()
needs_bwrap = pytest.mark.skipif(NO_BWRAP is not None, reason=f"bubblewrap cannot run here: {NO_BWRAP}")

TRACE = [{"id": "r0", "arrival": 0, "prompt_len": 4, "max_new": 2}]
CONFIG = {"capacity": 64, "page_size": 4}

WRITES_TO_THE_PIPE = '''
import json, os, sys

_FD = json.loads(sys.argv[-1])["rpc_out"]  # the child's reply pipe, as its command line names it


def _write(data):
    view = memoryview(data)
    while view:
        view = view[os.write(_FD, view):]


def simulate(trace, capacity=64, page_size=4, **config):
'''


def submission(tmp_path: Path, body: str) -> str:
    path = tmp_path / "hostile.py"
    path.write_text(WRITES_TO_THE_PIPE + textwrap.indent(textwrap.dedent(body), "    "), encoding="utf-8")
    return str(path)


def judged(spec: str, **limits: Any) -> str:
    """The ``completes`` verdict of ``spec`` on one workload, in bubblewrap: its message (it must fail)."""
    impl = IsolatedImplementation(spec, load_spec_for(spec), Limits(**limits), mode="bwrap")
    try:
        result = Judge(impl).judge("completes", TRACE, CONFIG)
    finally:
        impl.close()
    assert result.status == "fail", result
    return result.violations[0].message


@needs_bwrap
def test_a_deeply_nested_line_fails_the_call_not_the_grader(tmp_path: Path) -> None:
    spec = submission(tmp_path, '''
        _write(b'{"ok": ' + b'[' * 20000 + b']' * 20000 + b'}\\n')
        return {}
    ''')
    message = judged(spec)
    assert f"nested deeper than {MAX_DEPTH} arrays and objects (the protocol's MAX_DEPTH)" in message, message


@needs_bwrap
def test_a_line_that_is_not_utf8_fails_the_call(tmp_path: Path) -> None:
    # An encoded surrogate: json.loads of bytes would take it (it decodes with surrogatepass), and the
    # report would carry a string no UTF-8 output of the grader's can hold.
    spec = submission(tmp_path, '''
        _write(b'{"ok": {"events": "\\xed\\xa0\\x80"}}\\n')
        return {}
    ''')
    message = judged(spec)
    assert "garbage ('utf-8' codec can't decode byte 0xed" in message, message


@needs_bwrap
def test_a_reply_that_never_ends_its_line_fails_at_the_byte_limit(tmp_path: Path) -> None:
    spec = submission(tmp_path, '''
        while True:
            _write(b'[1,' * 100000)
    ''')
    message = judged(spec, reply_mb=1)
    assert "a reply line longer than 1 MiB (limit reply_mb) that does not end" in message, message


GRADES_THREE_FLOODS = '''
import json, resource, sys
from pytest_cbatch.runner import Judge
from pytest_cbatch.sandbox import IsolatedImplementation, Limits, load_spec_for

resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))  # without the bounds: a MemoryError, not a swap storm
spec, trace, config = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
impl = IsolatedImplementation(spec, load_spec_for(spec), Limits(), mode="bwrap")
judge = Judge(impl)
messages = []
for arrival in range(3):  # three workloads, three floods
    moved = [dict(trace[0], arrival=arrival)]
    messages.append(judge.judge("completes", moved, config).violations[0].message)
impl.close()
print(json.dumps({"messages": messages, "maxrss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}))
'''


@needs_bwrap
def test_three_60_mib_replies_of_empty_objects_leave_the_grader_small(tmp_path: Path) -> None:
    spec = submission(tmp_path, '''
        _write(b'{"ok": [' + b'{},' * (20 << 20) + b'{}]}\\n')
        return {}
    ''')
    run = subprocess.run([sys.executable, "-c", GRADES_THREE_FLOODS, spec, json.dumps(TRACE), json.dumps(CONFIG)],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    found = json.loads(run.stdout.strip().splitlines()[-1])
    assert found["maxrss_kb"] < 1536 << 10, f"the grader's peak RSS: {found['maxrss_kb'] >> 10} MiB"
    for message in found["messages"]:
        assert f"with more than {MAX_CONTAINERS} arrays and objects (the protocol's MAX_CONTAINERS)" in message


def test_a_reader_takes_lines_in_any_chunks_and_unpacks_batches() -> None:
    lines = b'{"ok": 1}\n{"batch": [{"ex": 1}, {"seg": ["a", []]}]}\n{"ok": [2, {"a": "[{"}]}\n'
    for size in (1, 3, len(lines)):
        reader = ReplyReader("submission", 1 << 20)
        for start in range(0, len(lines), size):
            reader.feed(lines[start:start + size])
        got = []
        while reader:
            got.append(reader.pop())
        assert got == [{"ok": 1}, {"ex": 1}, {"seg": ["a", []]}, {"ok": [2, {"a": "[{"}]}], size


@pytest.mark.parametrize("line, words", [
    (b"[1, 2]", "a reply that is not an object"),
    (b'{"batch": [1]}', "a batch that is not a list of replies"),
    (b"{not json", "garbage (Expecting property name"),
    (b'{"ok": ' + b"[" * (MAX_DEPTH + 1) + b"]" * (MAX_DEPTH + 1) + b"}", "nested deeper than"),
    (b'{"ok": [' + b"[]," * MAX_CONTAINERS + b"[]]}", "the protocol's MAX_CONTAINERS"),
], ids=["array", "batch", "not-json", "deep", "containers"])
def test_a_bad_line_is_a_garbage_failure_naming_what_is_wrong(line: bytes, words: str) -> None:
    with pytest.raises(SandboxFailure, match="wrote .* on its reply channel, which only the kit.s side") as failure:
        ReplyReader("submission", 64 << 20).feed(line + b"\n")
    assert failure.value.kind == "garbage" and words in str(failure.value), str(failure.value)


def nested(depth: int, string: bool) -> Any:
    value: Any = 'q"[{\\' if string else 0
    for level in range(depth):
        value = [value] if level % 2 else {"k": value}
    return value


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2 * MAX_DEPTH), st.booleans())
def test_the_depth_bound_is_the_nesting_of_the_value(depth: int, string: bool) -> None:
    # Brackets inside strings do not count; the reply's own object is one level more.
    line = json.dumps({"ok": nested(depth, string)}).encode()
    assert (bound_problem(line) is None) == (depth + 1 <= MAX_DEPTH), depth


def test_grading_holds_one_workloads_runs_at_a_time(tmp_path: Path) -> None:
    # Each run holds its decoded report: the grader forgets a workload's runs once its clauses are judged.
    from dataclasses import replace

    from pytest_cbatch.grading import evaluate
    from pytest_cbatch.grading.contract_part import Contract
    from pytest_cbatch.grading.plan import build_plan
    from pytest_cbatch.grading.rubric import load_rubric
    from pytest_cbatch.impls import resolve_impl

    plan = build_plan(replace(load_rubric(None), generated_examples=2))
    held: list[int] = []

    class Watched(Judge):
        def run(self, trace: Any, config: Any) -> Any:
            held.append(len(self._runs))
            return super().run(trace, config)

    judge = Watched(resolve_impl("reference"))
    rubric = load_rubric(None)
    contract = Contract({"visible": judge, "hidden": judge}, evaluate.contract_clauses(rubric), plan,
                                  "reference", tmp_path)
    contract.visible()
    contract.finish()
    assert len(plan.cases) > 2 and held and max(held) <= 1, max(held)


def test_an_endless_example_of_the_childs_search_is_a_divergence_not_a_growing_grader() -> None:
    # After the grader's own search fails, it reads the rest of the child's to judge its last example
    # again: a child that streams one example forever is cut off at MAX_EXAMPLE_LINES lines.
    from pytest_cbatch.sandbox.search import MAX_EXAMPLE_LINES, SearchChannel, SearchDiverged

    class Endless:
        label, generation = "submission", 1

        def receive(self, family: str, generation: int) -> dict:
            return {"seg": ["step", []]}

    channel = SearchChannel(Endless(), [])  # type: ignore[arg-type]
    channel.running = True
    channel.ahead.append({"ex": 1})
    with pytest.raises(SearchDiverged, match=f"more than {MAX_EXAMPLE_LINES} lines for one example"):
        channel.finish()
