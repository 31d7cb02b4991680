"""The SGLang adapter (examples/sglang): SGLang's own Scheduler through the contract, and its findings.

Runs only where SGLang and the adapter are installed (``.ci/sglang-venv`` builds that environment;
``.ci/sglang-job`` runs this file there); elsewhere the whole module is skipped with the reason.

Beyond the conformance suite, these tests run every fixed workload and generated traces through
both implementations (``sglang``: ignore_eos; ``sglang-retract``: without) and check that each
violation is one of the documented findings of ``examples/sglang/cbatch-expect*.toml`` (and that
each really occurs), and reproduce each finding on its smallest trace, with the SGLang source line
in the test's docstring.
"""

from __future__ import annotations

import gc
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

# Looked up, not imported: `import sglang` needs the adapter's triton stand-in first, and once both
# are present an import error must fail the module rather than skip it.
if importlib.util.find_spec("sglang") is None:
    pytest.skip("SGLang is not installed here: build its venv with .ci/sglang-venv", allow_module_level=True)
if importlib.util.find_spec("cbatch_sglang") is None:
    pytest.skip("the SGLang adapter is not installed: pip install -e examples/sglang (in .ci/sglang-venv)",
                allow_module_level=True)

from hypothesis import HealthCheck, given, settings  # noqa: E402

from cbatch_sglang import adapter, engine  # noqa: E402
from cbatch_sglang.engine import Engine, EngineSettings  # noqa: E402
from engine_findings import unexplained  # noqa: E402
from pytest_cbatch import strategies  # noqa: E402
from pytest_cbatch.contract import Violation, check_report  # noqa: E402
from pytest_cbatch.impls import resolve_impl  # noqa: E402
from pytest_cbatch.workloads import WORKLOADS, arrival, cancel  # noqa: E402

IMPLS = {"sglang": adapter.SGLANG, "sglang-retract": adapter.SGLANG_RETRACT}


def _config(impl: adapter.Adapter, overrides: dict[str, Any], base: dict[str, Any] | None = None) -> dict[str, Any]:
    """A workload's config as a bare run gives it: the native settings where the workload sets none."""
    config = {**(base or WORKLOADS["demo"].config), **overrides}
    config.update({k: v for k, v in impl.CBATCH_NATIVE_CONFIG.items() if k not in overrides})
    config["admission"] = "reserve" if impl.ignore_eos else "optimistic"
    return config


def _run(impl: adapter.Adapter, trace: list[dict[str, Any]], config: dict[str, Any]) -> dict[str, Any]:
    return impl.simulate(trace, **config)


def _events(report: dict[str, Any], rid: str) -> list[tuple[int, str]]:
    return [(ev["time"], ev["event"]) for ev in report["events"] if ev.get("id") == rid]


# -- the documented findings, as a classifier of violations -----------------------------------------

def _clipped_length(config: dict[str, Any], prompt: int, output: int) -> int:
    """The output SGLang gives a request once it has cut max_new_tokens (scheduler.py,
    init_req_max_new_tokens; mem_cache/allocator/base.py, max_new_tokens_for_memory)."""
    slots, page = config["capacity"] * config["block_size"], config["block_size"]
    paged_prompt = -(-prompt // page) * page
    return max(0, min(output, (slots - 1) - prompt - 1, slots - paged_prompt - page - 1))


def _finding(v: Violation, report: dict[str, Any], trace: list[dict[str, Any]]) -> str | None:
    """Which documented finding explains ``v``, or None."""
    cfg = report["config"]
    slots = cfg["capacity"] * cfg["block_size"]
    line = next((x for x in trace if x["event"] == "arrival" and x["id"] == v.request), None)
    if line is None:
        return None
    prompt, output = line["prompt_tokens"], line["output_tokens"]
    rejected = next((ev for ev in report["events"] if ev["event"] == "rejected" and ev["id"] == v.request), None)
    reason = rejected.get("reason", "") if rejected else ""
    if v.clause == "impossible_rejected" and "context length" in reason and (prompt + output > slots
                                                                              or prompt >= slots):
        return "front_end_length"
    if v.clause in ("impossible_rejected", "pending_sample_fed_once", "finished_outputs_complete") \
            and "maximum allowed length" in reason and prompt >= slots - 1 - 5:
        return "refused_prompt_runs"
    if v.clause == "finished_outputs_complete":
        row = report["requests"][v.request]
        if row["status"] == "finished" and row["output_tokens"] == _clipped_length(cfg, prompt, output) < output:
            return "max_new_tokens_cut"
    # An abort of a running request comes a pass late: the answer is late, and the pass may bring the
    # request's last token, so it ends cancelled with every token it asked for.
    late = "answered at" in v.message or (v.clause == "finished_outputs_complete"
                                           and report["requests"][v.request]["status"] == "cancelled")
    if v.clause in ("cancel_idempotent", "finished_outputs_complete") and late:
        cancels = [x["time"] for x in trace if x["event"] == "cancel" and x["id"] == v.request]
        admitted = [ev["time"] for ev in report["events"] if ev["event"] == "admit" and ev["id"] == v.request]
        if admitted and cancels and admitted[0] <= cancels[0]:
            return "late_abort"
    return None


STALL = re.compile(r"SGLang stalled at tick \d+: \d+ loop passes scheduled nothing while requests wait "
                   r"\((\d+) of (\d+) KV slots free\)")


def _unexplained(impl: adapter.Adapter, trace: list[dict[str, Any]], config: dict[str, Any],
                 seen: set[str]) -> list[str]:
    try:
        report = _run(impl, trace, config)
    except NotImplementedError:
        return []
    except RuntimeError as exc:
        stall = STALL.match(str(exc))
        if stall and stall.group(1) == stall.group(2):  # nothing runs, the pool is empty, requests wait
            seen.add("never_scheduled")
            return []
        return [f"RuntimeError: {exc}"]
    return unexplained(report, trace, config, _finding, seen)


@pytest.mark.parametrize("name", sorted(IMPLS))
def test_fixed_workloads_deviate_only_as_documented(name: str) -> None:
    impl, seen = IMPLS[name], set()
    problems = {w.name: found for w in WORKLOADS.values()
                if (found := _unexplained(impl, list(w.trace), _config(impl, w.overrides), seen))}
    assert problems == {}
    expected = {"front_end_length", "max_new_tokens_cut", "never_scheduled"}
    assert seen == (expected if impl.ignore_eos else expected | {"late_abort"})


@pytest.mark.parametrize("name", sorted(IMPLS))
def test_generated_traces_deviate_only_as_documented(name: str) -> None:
    impl = IMPLS[name]

    @settings(max_examples=40, derandomize=True, database=None, deadline=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(workload=strategies.workloads(admissions=["reserve" if impl.ignore_eos else "optimistic"]))
    def check(workload: tuple[list[dict[str, Any]], dict[str, Any]]) -> None:
        trace, config = workload
        assert _unexplained(impl, trace, _config(impl, {}, config), set()) == []

    check()


# -- the adapter -----------------------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(IMPLS))
def test_the_entry_points_resolve_to_the_adapters(name: str) -> None:
    assert resolve_impl(name).namespace is IMPLS[name]


@pytest.mark.parametrize("name, change, reason", [
    ("sglang", {"release_delay": 1}, "release_delay 1"),
    ("sglang", {"admission": "optimistic"}, "admission 'optimistic'"),
    ("sglang-retract", {"admission": "reserve"}, "admission 'reserve'"),
    ("sglang-retract", {"prefill_chunk": 2}, "below block_size 4"),
    ("sglang", {"capacity": 4096, "block_size": 8}, "exceeds the model's max_position_embeddings"),
])
def test_settings_sglang_cannot_express_are_unsupported(name: str, change: dict[str, Any], reason: str) -> None:
    impl = IMPLS[name]
    config = {**_config(impl, {}), **change}
    with pytest.raises(NotImplementedError, match=reason):
        _run(impl, list(WORKLOADS["demo"].trace), config)


def test_config_mapping() -> None:
    base = {**_config(adapter.SGLANG, {}), "capacity": 8, "block_size": 4, "token_budget": 3, "max_active": 5,
            "prefill_chunk": 64}
    got = adapter.engine_settings(base, ignore_eos=True)
    assert (got.max_total_tokens, got.page_size, got.context_length, got.max_prefill_tokens) == (32, 4, 32, 3)
    assert got.chunked_prefill_size == 3    # SGLang's chunk budget is per batch: at most the token budget
    assert got.max_running_requests == 3    # a decode batch feeds one token per running request
    assert adapter.engine_settings({**base, "policy": "serial"}, ignore_eos=True).max_running_requests == 1


def test_invalid_input_is_refused() -> None:
    trace, config = list(WORKLOADS["demo"].trace), _config(adapter.SGLANG, {})
    with pytest.raises(ValueError, match="prompt_tokens"):
        _run(adapter.SGLANG, [{**trace[0], "prompt_tokens": 0}], config)
    with pytest.raises(ValueError, match="capacity"):
        _run(adapter.SGLANG, trace, {**config, "capacity": 0})


def test_runs_are_deterministic() -> None:
    trace, config = list(WORKLOADS["mixed_endings"].trace), _config(adapter.SGLANG_RETRACT, {"capacity": 4})
    assert _run(adapter.SGLANG_RETRACT, trace, config) == _run(adapter.SGLANG_RETRACT, trace, config)


def test_retraction_is_preemption_then_recompute_and_passes_every_clause() -> None:
    """Without ignore_eos SGLang admits three 32-token requests into 80 slots that hold two; decode runs
    out and ``update_running_batch`` retracts the newest (``ScheduleBatch.retract_decode``), which
    recomputes its prompt and outputs once the others finish."""
    trace = [arrival(0, rid, 2, 30) for rid in "abc"]
    config = _config(adapter.SGLANG_RETRACT, {"capacity": 80, "block_size": 1, "token_budget": 16, "max_active": 4})
    report = _run(adapter.SGLANG_RETRACT, trace, config)
    preempted = [ev for ev in report["events"] if ev["event"] == "preempted"]
    assert [ev["id"] for ev in preempted] == ["c"] and preempted[0]["released_blocks"] > 2
    phases = {row["phase"] for ev in report["events"] if ev["event"] == "dispatch" for row in ev["work"]
              if row["id"] == "c" and ev["time"] > preempted[0]["time"]}
    assert "recompute" in phases
    assert check_report(report, trace, config) == []
    assert {rid: row["output_tokens"] for rid, row in report["requests"].items()} == {"a": 30, "b": 30, "c": 30}


def test_a_cancel_of_a_request_mid_chunked_prefill_is_answered_at_once_and_frees_its_pages() -> None:
    trace = [arrival(0, "victim", 8, 3), cancel(2, "victim")]
    report = _run(adapter.SGLANG, trace, _config(adapter.SGLANG, {}))
    assert _events(report, "victim")[-2:] == [(2, "cancelled"), (2, "release")]
    assert report["requests"]["victim"]["output_tokens"] == 0


def test_an_engine_whose_construction_stopped_midway_leaves_the_next_one_buildable(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A constructor interrupted after SGLang built its process-wide parallel groups (a time limit's
    interrupt, an error) used to make every later Engine fail: "init_parallel_runtime() ran twice"."""
    def interrupted(self: Any) -> None:
        raise KeyboardInterrupt("stopped by a time limit")

    settings_ = EngineSettings(max_total_tokens=16, max_running_requests=2, chunked_prefill_size=4,
                               max_prefill_tokens=16, context_length=16)
    monkeypatch.setattr(engine, "_init_stand_in_worker", interrupted)
    with pytest.raises(KeyboardInterrupt):
        Engine(settings_)
    monkeypatch.undo()
    assert Engine(settings_).free_slots() == 16


def test_engines_built_one_after_another_give_back_their_sockets_and_files() -> None:
    """Each Scheduler opens a ZMQ context (sockets, I/O threads), a load-snapshot file in /dev/shm and
    gloo groups that SGLang's never-ending watchdog thread kept alive: 17 descriptors and a file per
    engine, and a run builds hundreds (gloo then failed: "enforce fail ... device.cc:99")."""
    settings_ = EngineSettings(max_total_tokens=16, max_running_requests=2, chunked_prefill_size=4,
                               max_prefill_tokens=16, context_length=16)
    Engine(settings_).close()
    gc.collect()
    before, files = len(os.listdir("/proc/self/fd")), []
    for _ in range(5):
        e = Engine(settings_)
        files.append(Path(e.sched.load_snapshot_writer.path))
        e.close()
    del e
    gc.collect()
    assert len(os.listdir("/proc/self/fd")) <= before + 2
    assert [f for f in files if f.exists()] == []


def test_the_last_engine_of_a_process_is_closed_at_exit() -> None:
    code = ("from cbatch_sglang.engine import Engine, EngineSettings\n"
            "e = Engine(EngineSettings(max_total_tokens=16, max_running_requests=2, chunked_prefill_size=4, "
            "max_prefill_tokens=16, context_length=16))\n"
            "print(e.sched.load_snapshot_writer.path)\n")
    done = subprocess.run([sys.executable, "-W", "ignore", "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    path = Path(done.stdout.strip().splitlines()[-1])
    assert path.name.startswith("sglang_loads_") and not path.exists()


# -- findings (sglang 0.5.23), each on its smallest trace ---------------------------------------------

@pytest.mark.parametrize("name", sorted(IMPLS))
def test_finding_the_front_end_refuses_a_request_whose_last_token_needs_no_slot(name: str) -> None:
    """``TokenizerManager._validate_one_request`` (managers/tokenizer_manager.py): "(max_new_tokens +
    input_token_num) > _max_req_len" refuses prompt 1 + output 8 in a pool (= context) of 8 slots,
    though the 8th output is never fed and needs no slot."""
    impl = IMPLS[name]
    report = _run(impl, [arrival(0, "big", 1, 8)], _config(impl, {"capacity": 2}))
    (rejected,) = [ev for ev in report["events"] if ev["event"] == "rejected"]
    assert "maximum context length of 8 tokens" in rejected["reason"]


@pytest.mark.parametrize("name", sorted(IMPLS))
def test_finding_max_new_tokens_is_cut_silently_even_to_zero(name: str) -> None:
    """``Scheduler.init_req_max_new_tokens`` (managers/scheduler.py ~2710) and
    ``max_new_tokens_for_memory`` (mem_cache/allocator/base.py ~102: token_capacity - paged_input -
    page_size - 1): prompt 1 asking for 1 token in 2 pages of 4 gets 8 - 4 - 4 - 1 < 0, so 0 tokens,
    and the request "finishes" with reason length; prompt 2 asking for 8 in 5 pages gets 11."""
    impl = IMPLS[name]
    report = _run(impl, [arrival(0, "small", 1, 1)], _config(impl, {"capacity": 2}))
    assert report["requests"]["small"]["status"] == "finished" and report["requests"]["small"]["output_tokens"] == 0
    # (with ignore_eos the cut request then waits forever: see the finding below)
    report = _run(adapter.SGLANG_RETRACT, [arrival(0, "r", 2, 16)], _config(adapter.SGLANG_RETRACT, {"capacity": 5}))
    assert report["requests"]["r"]["output_tokens"] == _clipped_length(report["config"], 2, 16) == 11


def test_finding_an_ignore_eos_request_that_fits_is_never_scheduled() -> None:
    """``PrefillAdder.add_one_req_ignore_eos`` (managers/schedule_policy.py ~1241-1303): the prompt
    rounded up to pages plus a page of overhead plus the whole remaining output must leave more than
    ``IGNORE_EOS_RESERVE_TOKENS`` per request; prompt 5 + output 3 (2 pages) in 4 pages never does,
    with the pool empty, and nothing answers it.  Without ignore_eos it is served."""
    trace, config = [arrival(0, "q", 5, 3)], {"capacity": 4, "max_active": 2}
    with pytest.raises(RuntimeError, match=r"SGLang stalled .* \(16 of 16 KV slots free\); unfinished: q \(queued\)"):
        _run(adapter.SGLANG, trace, _config(adapter.SGLANG, config))
    report = _run(adapter.SGLANG_RETRACT, trace, _config(adapter.SGLANG_RETRACT, config))
    assert report["requests"]["q"]["output_tokens"] == 3


@pytest.mark.parametrize("name", sorted(IMPLS))
def test_finding_a_one_page_pool_refuses_every_prompt_but_never_answers(name: str) -> None:
    """``TpModelWorker.get_worker_info`` (managers/tp_worker.py ~572): max_req_input_len = max_req_len - 5,
    negative for a pool of 4 slots, so the scheduler refuses every prompt; the refusal goes out only
    when the request runs its one-token prefill, which the admission never places."""
    impl = IMPLS[name]
    with pytest.raises(RuntimeError, match=r"\(4 of 4 KV slots free\); unfinished: first \(queued\)"):
        _run(impl, [arrival(0, "first", 1, 1)], _config(impl, {"capacity": 1}))


def test_finding_a_refused_prompt_is_admitted_runs_one_row_and_its_refusal_carries_a_token() -> None:
    """``validate_input_length`` (managers/utils.py ~272: "len(req.origin_input_ids) >=
    max_req_input_len" -> "Input length ... exceeds the maximum allowed length"): a prompt of 11 in 16
    slots passes the front end but reaches max_req_input_len (10); the scheduler cuts it to one token,
    admits it, runs that row and sends its abort (status 400) with a sampled token."""
    report = _run(adapter.SGLANG, [arrival(0, "r", 11, 1)], _config(adapter.SGLANG, {"capacity": 4}))
    assert _events(report, "r") == [(0, "arrival"), (0, "admit"), (1, "token"), (1, "rejected"), (1, "release")]
    rows = [row for ev in report["events"] if ev["event"] == "dispatch" for row in ev["work"]]
    assert rows == [{"id": "r", "phase": "prefill", "input_tokens": 1}]


def test_finding_an_abort_of_a_running_request_is_answered_after_its_next_pass_with_a_token() -> None:
    """``Scheduler.abort_request`` (managers/scheduler.py ~5796, "Abort method 3: set `to_finish` ... The
    request will still run one decode forward pass"): victim, cancelled at t=2 after its prefill,
    waits for other's prefill pass (t=2), decodes once more (t=3), and its abort comes at t=4 after a
    second token."""
    impl = adapter.SGLANG_RETRACT
    report = _run(impl, list(WORKLOADS["cancel_mid_prefill"].trace), _config(impl, {}))
    assert [e for e in _events(report, "victim") if e[1] in ("token", "cancelled")] == [
        (2, "token"), (4, "token"), (4, "cancelled")]


def test_finding_a_chunk_below_a_page_is_never_taken_without_ignore_eos() -> None:
    """``PrefillAdder._select_prefill_admission`` (managers/schedule_policy.py ~1665): "extend_len =
    chunk_tokens_limit // self.page_size * self.page_size" is 0 for a chunk of 2 in pages of 4, so a
    longer prompt is never admitted (the ignore_eos path does take 2-token chunks)."""
    for ignore_eos, scheduled in ((False, False), (True, True)):
        e = Engine(EngineSettings(max_total_tokens=32, max_running_requests=2, chunked_prefill_size=2,
                                  max_prefill_tokens=4, context_length=32, page_size=4))
        e.add("a", [10, 11, 12, 13, 14], 2, ignore_eos=ignore_eos)
        modes = [e.step().mode for _ in range(10)]
        assert any(modes) is scheduled, modes


def test_finding_an_abort_reaches_every_request_whose_id_starts_with_the_aborted_one() -> None:
    """``Scheduler.abort_request`` matches ``req.rid.startswith(recv_req.rid)`` (managers/scheduler.py
    ~5688): aborting "a" also aborts "ab".  SGLang's front end uses uuid4 hex ids, where no id is a
    prefix of another, and so does the adapter (fixed-width ids): a trace's "a" and "ab" stay apart."""
    e = Engine(EngineSettings(max_total_tokens=32, max_running_requests=2, chunked_prefill_size=8,
                              max_prefill_tokens=8, context_length=32))
    e.add("a", [10, 11], 2)
    e.add("ab", [20, 21], 2)
    e.abort("a")
    assert sorted(msg.rid for msg in e.sent()[1]) == ["a", "ab"] and e.waiting() == []
    report = _run(adapter.SGLANG, [arrival(0, "a", 2, 2), arrival(0, "ab", 2, 2), cancel(0, "a")],
                  _config(adapter.SGLANG, {}))
    assert report["requests"]["ab"]["status"] == "finished"
