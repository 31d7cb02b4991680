"""SGLang's real Scheduler on CPU (examples/sglang): its own methods run, with a stand-in worker.

Runs only where SGLang and the adapter package are installed (``.ci/sglang-venv`` builds that
environment); elsewhere the whole module is skipped with the reason.  Each test drives
``Scheduler.get_next_batch_to_run`` / ``run_batch`` / ``process_batch_result`` (one pass of
``event_loop_normal``), ``handle_generate_request`` and ``abort_request``, and reads the outcome
from SGLang's own state and its outgoing messages.
"""

from __future__ import annotations

import importlib.util

import pytest

# Looked up, not imported: `import sglang` needs the adapter's triton stand-in first, and once both
# are present an import error must fail the module rather than skip it.
if importlib.util.find_spec("sglang") is None:
    pytest.skip("SGLang is not installed here: build its venv with .ci/sglang-venv", allow_module_level=True)
if importlib.util.find_spec("cbatch_sglang") is None:
    pytest.skip("the SGLang adapter is not installed: pip install -e examples/sglang (in .ci/sglang-venv)",
                allow_module_level=True)

from cbatch_sglang import engine  # noqa: E402
from cbatch_sglang.engine import Engine, EngineSettings, StepRecord  # noqa: E402

SETTINGS = EngineSettings(max_total_tokens=16, max_running_requests=4, chunked_prefill_size=3,
                          max_prefill_tokens=64, context_length=64)


def _drive(e: Engine, limit: int = 60) -> list[StepRecord]:
    steps = []
    for _ in range(limit):
        steps.append(e.step())
        if e.idle():
            return steps
    raise AssertionError(f"SGLang did not go idle in {limit} steps: waiting {e.waiting()}, running {e.running()}")


def _tokens(steps: list[StepRecord], rid: str) -> int:
    return sum(len(ids) for s in steps for o in s.outputs for r, ids in zip(o.rids, o.output_ids) if r == rid)


def _finish(steps: list[StepRecord], rid: str) -> list:
    return [f for s in steps for o in s.outputs for r, f in zip(o.rids, o.finished_reasons) if r == rid and f]


def test_the_scheduler_is_sglangs_own_built_by_its_own_init() -> None:
    e = Engine(SETTINGS)
    assert type(e.sched) is engine.Scheduler
    assert type(e.sched).__module__ == "sglang.srt.managers.scheduler"
    assert e.free_slots() == SETTINGS.max_total_tokens
    assert e.idle()


def test_a_long_prompt_is_prefilled_in_chunks_then_decoded_to_its_length() -> None:
    e = Engine(SETTINGS)
    e.add("a", list(range(10, 18)), 2)  # 8 prompt tokens, chunks of 3
    steps = _drive(e)
    extend = [row for s in steps if s.mode == "EXTEND" for row in s.rows]
    assert extend == [("a", 3, 0), ("a", 3, 3), ("a", 2, 6)]
    assert [s.mode for s in steps if s.mode] == ["EXTEND", "EXTEND", "EXTEND", "DECODE"]
    # no token before the last chunk: SGLang samples only once the whole prompt is in the KV cache
    first = next(i for i, s in enumerate(steps) if s.outputs)
    assert first == 2
    assert _tokens(steps, "a") == 2
    assert [f["type"] for f in _finish(steps, "a")] == ["length"]
    assert e.free_slots() == SETTINGS.max_total_tokens  # every slot back after the finish


def test_abort_during_chunked_prefill_frees_every_slot() -> None:
    e = Engine(SETTINGS)
    e.add("a", list(range(10, 18)), 2)
    first = e.step()
    assert first.rows == [("a", 3, 0)] and e.chunked() == "a"
    assert e.free_slots() == SETTINGS.max_total_tokens - 3
    e.abort("a")
    steps = _drive(e)
    assert [a.rid for s in steps for a in s.aborts] == ["a"]
    assert _tokens(steps, "a") == 0
    assert e.free_slots() == SETTINGS.max_total_tokens


def test_abort_of_a_waiting_request_removes_it_and_runs_the_rest() -> None:
    e = Engine(EngineSettings(max_total_tokens=12, max_running_requests=4, chunked_prefill_size=8,
                              max_prefill_tokens=64, context_length=64))
    e.add("a", [10, 11, 12], 6)
    e.add("b", [20, 21, 22], 6)
    e.step()
    assert e.waiting() == ["b"]  # a's reserved need (3 + 6) leaves too little for b's
    e.abort("b")
    steps = _drive(e)
    assert e.waiting() == []
    assert _tokens(steps, "b") == 0 and _tokens(steps, "a") == 5  # a's first token came with the first step
    assert e.free_slots() == 12


def test_engines_are_built_in_turn_in_one_process() -> None:
    first = Engine(SETTINGS)
    second = Engine(EngineSettings(max_total_tokens=40, max_running_requests=2, chunked_prefill_size=16,
                                   max_prefill_tokens=64, context_length=64))
    assert first.sched is not second.sched
    second.add("x", [1, 2, 3], 1)
    steps = _drive(second)
    assert _tokens(steps, "x") == 1 and second.free_slots() == 40


def test_decode_out_of_slots_retracts_the_newest_request_which_recomputes_and_resumes() -> None:
    # Without ignore_eos SGLang budgets running requests at new_token_ratio (0.7) of their remaining
    # output, so three 30-token requests are admitted into 80 slots that hold only two of them.
    e = Engine(EngineSettings(max_total_tokens=80, max_running_requests=4, chunked_prefill_size=16,
                              max_prefill_tokens=64, context_length=64))
    for i, rid in enumerate("abc"):
        e.add(rid, [10 + 10 * i, 11 + 10 * i], 30, ignore_eos=False)
    steps, retracted_at = [], None
    for _ in range(80):
        steps.append(e.step())
        if retracted_at is None and any(getattr(r, "is_retracted", False) for r in e.sched.waiting_queue):
            retracted_at = len(steps) - 1
            assert e.waiting() == ["c"] and e.running() == ["a", "b"]
            assert e.free_slots() > 2  # c's slots came back
        if e.idle():
            break
    assert retracted_at is not None, "SGLang never retracted: update_running_batch's check_decode_mem held"
    c_extends = [n for s in steps[retracted_at:] for rid, n, _ in s.rows if rid == "c" and s.mode == "EXTEND"]
    assert sum(c_extends) > 2 and max(c_extends) <= 16  # the recompute rebuilds prompt and outputs, in chunks
    assert {rid: _tokens(steps, rid) for rid in "abc"} == {"a": 30, "b": 30, "c": 30}  # nothing emitted twice
    assert e.free_slots() == 80


def test_findings_a_request_that_cannot_be_served() -> None:
    """What SGLang 0.5.23 does with requests that cannot be served as asked (findings; see
    docs/engines/sglang.md): these assert SGLang's behaviour as it is, so a new version that
    changes it fails here and the page gets updated."""
    e = Engine(SETTINGS)  # 16 slots: max_req_len 15, max_req_input_len 10
    assert (e.sched.max_req_len, e.sched.max_req_input_len) == (15, 10)
    e.add("big", list(range(10, 22)), 2)    # prompt 12 > max_req_input_len
    e.add("long", list(range(30, 36)), 12)  # prompt 6: max_new_tokens is cut to fit max_req_len
    assert [r.sampling_params.max_new_tokens for r in e.sched.waiting_queue if r.rid == "long"] == [8]
    first = e.step()
    # the refused prompt still goes through a one-row prefill, and its abort carries a sampled token
    assert first.rows == [("big", 1, 0)]
    ((reason,),) = [[f for r, f in zip(o.rids, o.finished_reasons) if r == "big"] for o in first.outputs]
    assert reason["type"] == "abort" and "exceeds the maximum allowed length" in reason["message"]
    assert _tokens([first], "big") == 1
    # "long" (6 + 8 = 14 slots of 16) is never admitted: the ignore_eos budget keeps refusing it
    for _ in range(20):
        assert e.step().mode is None
    assert e.waiting() == ["long"] and not e.idle() and e.free_slots() == 16


def test_with_pages_of_four_slots_requests_hold_whole_pages_and_give_them_back() -> None:
    e = Engine(EngineSettings(max_total_tokens=32, max_running_requests=4, chunked_prefill_size=4,
                              max_prefill_tokens=64, context_length=64, page_size=4))
    assert e.sched.page_size == 4
    e.add("a", list(range(10, 16)), 5)
    e.add("b", [20, 21, 22], 3)
    seen: dict[str, set[int]] = {"a": set(), "b": set()}
    steps = []
    for _ in range(30):
        steps.append(e.step())
        tables = e.pages()
        for rid, pages in tables.items():
            seen[rid].update(pages)
        held = [p for pages in tables.values() for p in pages]
        assert len(held) == len(set(held)), f"a page held twice: {tables}"
        assert 0 not in held  # the padding page is never handed out
        assert e.free_slots() % 4 == 0  # whole pages only
        if e.idle():
            break
    assert {rid: _tokens(steps, rid) for rid in "ab"} == {"a": 5, "b": 3}
    assert len(seen["a"]) >= 3 and seen["b"]  # a: 6 + 5 - 1 slots need three pages
    assert e.pages() == {} and e.free_slots() == 32
