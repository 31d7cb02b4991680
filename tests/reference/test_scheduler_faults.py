"""Executable contracts of the preemption/recompute and KV-transfer lifecycle (reference/scheduler_faults.py).

Covers the seed's two printed examples verbatim, its five exercises with
observable answers, the fault matrix, the command line, and seeded random runs
against output-history and token-history oracles written here.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pytest_cbatch.reference import scheduler_faults
from pytest_cbatch.reference.scheduler_faults import (
    ABORT_REASONS,
    PagedKV,
    RecomputeRequest,
    TransferManager,
    TransferNotReady,
    demo,
    main,
)

REFERENCE_DIR = Path(__file__).resolve().parents[2] / "reference"

RECOMPUTE_EXAMPLE = """\
from scheduler_faults import PagedKV, RecomputeRequest

pool = PagedKV(capacity=4, block_size=2)
request = RecomputeRequest(pool, "r", [10, 11, 12])
assert request.resume()
request.sample(20)
request.sample(21)
request.preempt()
assert len(pool.free) == 4
assert request.resume()
assert request.recomputed_rows == 4
assert pool.read("r") == [10, 11, 12, 20]
request.sample(22)
assert request.outputs == [20, 21, 22]
request.cancel()
assert len(pool.free) == 4
"""

LEDGER_EXAMPLE = """\
from scheduler_faults import PagedKV, RecomputeRequest, TransferManager

pool = PagedKV(4, 2)
request = RecomputeRequest(pool, "r", [1, 2, 3])
assert request.resume()
manager = TransferManager(pool)
old = manager.begin("r", "room-a")
request.preempt()
assert manager.abort(old, "consumer_failure")
assert len(pool.free) == 0
assert not request.resume()
assert not manager.complete(old)
assert manager.acknowledge_drained(old)
assert len(pool.free) == 4
assert request.resume()
new = manager.begin("r", "room-a")
assert new != old
assert not manager.complete(old)
assert manager.complete(new)
assert manager.read(new) == [1, 2, 3]
manager.release_output(new)
request.cancel()
assert len(pool.free) == 4
"""


def active_request(pool: PagedKV, owner: str, prompt: list[int], *samples: int) -> RecomputeRequest:
    request = RecomputeRequest(pool, owner, prompt)
    assert request.resume()
    for token in samples:
        assert request.sample(token)
    return request


def source(pool: PagedKV, owner: str, rows: list[int]) -> str:
    pool.create(owner)
    assert pool.append(owner, rows)
    return owner


def in_use(pool: PagedKV) -> int:
    return pool.capacity - len(pool.free)


# ------------------------------------------------------------ printed examples


@pytest.mark.parametrize("example", [RECOMPUTE_EXAMPLE, LEDGER_EXAMPLE], ids=["recompute", "ledger"])
def test_printed_example_runs_verbatim_beside_the_module(example: str) -> None:
    run = subprocess.run([sys.executable, "-c", example], cwd=REFERENCE_DIR, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr


@pytest.mark.parametrize("example", [RECOMPUTE_EXAMPLE, LEDGER_EXAMPLE], ids=["recompute", "ledger"])
def test_printed_example_runs_against_the_installed_module(example: str) -> None:
    installed = example.replace("from scheduler_faults import", "from pytest_cbatch.reference.scheduler_faults import")
    assert installed != example
    exec(compile(installed, "<seed example>", "exec"), {})


# --------------------------------------------------------- three histories


def test_three_histories_stay_apart() -> None:
    pool = PagedKV(4, 2)
    request = active_request(pool, "r", [10, 11, 12], 20, 21)
    assert request.prompt == (10, 11, 12)
    assert request.outputs == [20, 21]
    assert pool.read("r") == [10, 11, 12, 20]  # 21 is sampled but not fed back yet
    request.preempt()
    assert request.state == "preempted" and request.outputs == [20, 21] and "r" not in pool
    assert request.resume()
    assert pool.read("r") == [10, 11, 12, 20] and request.recomputed_rows == 4
    emitted = [(e["index"], e["token"]) for e in request.events if e["event"] == "emit"]
    assert emitted == [(0, 20), (1, 21)]  # the replay emitted nothing
    request.check()


def test_request_states_and_misuse() -> None:
    pool = PagedKV(4, 2)
    with pytest.raises(ValueError, match="prompt"):
        RecomputeRequest(pool, "empty", [])
    request = RecomputeRequest(pool, "r", [1])
    assert request.state == "queued" and not request.preempt()
    with pytest.raises(RuntimeError, match="while queued"):
        request.sample(5)
    assert request.resume() and request.resume()  # resuming an active request changes nothing
    assert request.recomputed_rows == 0 and len(pool.free) == 3
    request.cancel()
    request.cancel()
    assert request.state == "cancelled" and not request.resume() and not request.preempt()
    assert [e["event"] for e in request.events] == ["resume", "cancel"]
    assert len(pool.free) == 4
    request.check()


def test_failed_decode_allocation_emits_nothing() -> None:
    pool = PagedKV(2, 2)
    request = active_request(pool, "r", [1, 2, 3], 20, 21)  # rows [1, 2, 3, 20]: both pages full
    assert not request.sample(22)  # committing 21 needs a third page
    assert request.outputs == [20, 21] and pool.read("r") == [1, 2, 3, 20] and pool.free == ()
    assert request.events[-1] == {"event": "decode_failed", "token": 22}
    request.check()


def test_failed_replay_leaks_nothing_and_a_later_retry_succeeds() -> None:
    pool = PagedKV(2, 2)
    request = active_request(pool, "r", [1, 2, 3], 20)
    request.preempt()
    competitor = source(pool, "competitor", [9])  # one resident page; the replay needs two
    events = len(request.events)
    assert not request.resume()
    assert request.state == "preempted" and request.recomputed_rows == 0 and "r" not in pool
    assert len(pool.free) == 1 and request.events[events:] == [{"event": "resume_failed", "rows": 3}]
    pool.release(competitor)
    assert request.resume() and request.recomputed_rows == 3 and pool.read("r") == [1, 2, 3]
    assert request.sample(21) and pool.read("r") == [1, 2, 3, 20]
    request.check()


def test_recomputation_blocked_by_pinned_pages() -> None:
    pool = PagedKV(3, 2)
    request = active_request(pool, "r", [1, 2, 3])
    pin_id = pool.pin("r")
    request.preempt()
    assert len(pool.free) == 1 and not request.resume()
    pool.unpin(pin_id)
    assert request.resume() and request.recomputed_rows == 3


# ----------------------------------------------------- transfer state machine


def test_publication_before_read() -> None:
    pool = PagedKV(4, 2)
    manager = TransferManager(pool)
    key = manager.begin(source(pool, "s", [1, 2, 3]), "room")
    with pytest.raises(TransferNotReady, match="in_flight"):
        manager.read(key)
    assert manager.complete(key) and manager.read(key) == [1, 2, 3]
    assert manager.release_output(key)
    with pytest.raises(TransferNotReady, match="released"):
        manager.read(key)
    with pytest.raises(TransferNotReady, match="unknown"):
        manager.read(999)
    manager.check()


@pytest.mark.parametrize("reason", ABORT_REASONS)
def test_every_abort_reason_retains_pages_until_drained(reason: str) -> None:
    pool = PagedKV(4, 2)
    manager = TransferManager(pool)
    key = manager.begin(source(pool, "s", [1, 2, 3]), "room")
    pool.release("s")  # the producer is gone, but the transport may still read its pages
    assert manager.abort(key, reason)
    assert manager.records[key].state == "aborted" and manager.records[key].reason == reason
    assert in_use(pool) == 4
    assert not manager.complete(key) and not manager.release_output(key)  # never becomes ready
    with pytest.raises(TransferNotReady):
        manager.read(key)
    assert manager.acknowledge_drained(key) and len(pool.free) == 4
    assert not manager.acknowledge_drained(key)  # duplicate acknowledgement
    manager.check()


def test_unknown_abort_reason_is_rejected() -> None:
    pool = PagedKV(4, 2)
    manager = TransferManager(pool)
    key = manager.begin(source(pool, "s", [1]), "room")
    with pytest.raises(ValueError, match="unknown abort reason 'reboot'"):
        manager.abort(key, "reboot")
    assert manager.records[key].state == "in_flight"


def test_duplicate_room_is_rejected_until_drain_or_release() -> None:
    pool = PagedKV(8, 2)
    manager = TransferManager(pool)
    src = source(pool, "s", [1, 2])
    first = manager.begin(src, "room")
    free = len(pool.free)
    assert manager.begin(src, "room") is None
    assert manager.records[first + 1].state == "rejected" and manager.records[first + 1].reason == "room_busy"
    assert len(pool.free) == free and manager.rooms == {"room": first}
    assert manager.complete(first)
    assert manager.begin(src, "room") is None  # published but not yet released
    assert manager.release_output(first)
    second = manager.begin(src, "room")
    assert second == first + 3 and manager.abort(second, "timeout")
    assert manager.begin(src, "room") is None  # aborted but not yet drained
    assert manager.acknowledge_drained(second)
    assert manager.begin(src, "room") == second + 2
    manager.check()


def test_stale_duplicate_and_unknown_callbacks_change_nothing() -> None:
    pool = PagedKV(8, 2)
    manager = TransferManager(pool)
    key = manager.begin(source(pool, "s", [1, 2, 3]), "room")
    assert manager.complete(key)
    state = (pool.free, {k: vars(r).copy() for k, r in manager.records.items()}, dict(manager.rooms))
    for callback in (manager.complete, manager.acknowledge_drained, lambda k: manager.abort(k, "cancelled")):
        assert not callback(key)  # duplicate completion; drain of a published transfer; abort lost the race
    for callback in (manager.complete, manager.acknowledge_drained, manager.release_output,
                     lambda k: manager.abort(k, "timeout")):
        assert not callback(12345)
    assert (pool.free, {k: vars(r) for k, r in manager.records.items()}, manager.rooms) == state
    assert manager.read(key) == [1, 2, 3]
    assert manager.release_output(key) and not manager.release_output(key)
    manager.check()


def test_begin_rolls_back_a_partial_reservation() -> None:
    pool = PagedKV(4, 2)
    manager = TransferManager(pool)
    src = source(pool, "s", [1, 2, 3])  # two pages; the destination would need two more
    source(pool, "x", [9])
    assert manager.begin(src, "room") is None
    record = manager.records[1]
    assert (record.state, record.reason) == ("rejected", "no_pages")
    assert len(pool.free) == 1 and manager.rooms == {} and "transfer:1" not in pool
    assert pool.append(src, [4])  # the tail is private again: no copy-on-write page needed
    assert len(pool.free) == 1
    pool.release("x")
    assert manager.begin(src, "room") == 2  # the failed attempt consumed key 1
    manager.check()


def test_unknown_source_consumes_no_key() -> None:
    manager = TransferManager(PagedKV(2, 2))
    with pytest.raises(KeyError, match="unknown owner 'ghost'"):
        manager.begin("ghost", "room")
    assert manager.records == {}


# ------------------------------------------------ exercises with observable answers


def test_exercise_1_without_a_drain_acknowledgement_pages_stay_allocated() -> None:
    pool = PagedKV(4, 2)
    request = active_request(pool, "r", [1, 2, 3])
    manager = TransferManager(pool)
    key = manager.begin("r", "room-a")
    request.preempt()
    assert manager.abort(key, "cancelled")
    assert request.state != "active"
    assert in_use(pool) == 4  # expecting these free now would encode a use-after-free
    pool.check()
    manager.check()


def test_exercise_2_completion_then_abort_and_the_reverse() -> None:
    pool = PagedKV(8, 2)
    manager = TransferManager(pool)
    src = source(pool, "s", [1, 2, 3])
    first = manager.begin(src, "room-a")
    assert manager.complete(first) and not manager.abort(first, "cancelled")
    assert manager.read(first) == [1, 2, 3]
    assert manager.release_output(first) and "transfer:1" not in pool and len(pool.free) == 6

    second = manager.begin(src, "room-a")
    assert manager.abort(second, "cancelled") and not manager.complete(second)
    with pytest.raises(TransferNotReady):
        manager.read(second)
    assert manager.acknowledge_drained(second)
    with pytest.raises(TransferNotReady, match="drained"):
        manager.read(second)
    manager.check()


def test_exercise_3_append_during_transfer_copies_the_tail() -> None:
    pool = PagedKV(5, 2)
    manager = TransferManager(pool)
    key = manager.begin(source(pool, "s", [1, 2, 3]), "room")
    assert pool.append("s", [4]) and len(pool.free) == 0  # one copy-on-write page for the partial tail
    assert pool.read("s") == [1, 2, 3, 4]
    assert manager.complete(key) and manager.read(key) == [1, 2, 3]
    manager.check()


def test_exercise_3_without_a_spare_page_append_fails_and_both_views_hold() -> None:
    pool = PagedKV(4, 2)
    manager = TransferManager(pool)
    key = manager.begin(source(pool, "s", [1, 2, 3]), "room")
    assert not pool.append("s", [4])
    assert pool.read("s") == [1, 2, 3] and manager.records[key].snapshot == (1, 2, 3)
    assert manager.complete(key) and manager.read(key) == [1, 2, 3]
    manager.check()


def test_exercise_4_a_stale_completion_cannot_touch_the_new_attempt() -> None:
    pool = PagedKV(8, 2)
    manager = TransferManager(pool)
    src = source(pool, "s", [1, 2, 3])
    attempt_a = manager.begin(src, "room")
    assert manager.abort(attempt_a, "timeout") and manager.acknowledge_drained(attempt_a)
    attempt_b = manager.begin(src, "room")
    free = pool.free
    assert not manager.complete(attempt_a)
    assert manager.records[attempt_b].state == "in_flight" and pool.free == free
    with pytest.raises(TransferNotReady):
        manager.read(attempt_b)
    manager.check()


def test_exercise_5_the_built_in_report() -> None:
    report = demo()
    assert report["summary"] == {
        "outputs": [20, 21, 22],
        "received_rows": [10, 11, 12, 20, 21],
        "recomputed_rows": 4,
        "pages_retained_before_first_drain": 4,
        "free_pages_at_end": 8,
    }
    assert report["config"]["capacity"] == 8
    assert report["trace"][-1]["free_pages"] == 8
    assert json.loads(json.dumps(report)) == report == demo()


# ----------------------------------------------------------------- command line


def test_cli_writes_the_report_atomically(tmp_path: Path) -> None:
    target = tmp_path / "faults.json"
    assert main(["--output", str(target)]) == 0
    assert json.loads(target.read_text()) == demo()
    assert os.listdir(tmp_path) == ["faults.json"]


def test_cli_prints_without_output(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 0
    assert json.loads(capsys.readouterr().out) == demo()


def test_cli_leaves_no_file_when_writing_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "faults.json"
    target.write_text("previous")

    def refuse(src: str, dst: str) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(scheduler_faults.os, "replace", refuse)
    assert main(["--output", str(target)]) == 1
    assert target.read_text() == "previous" and os.listdir(tmp_path) == ["faults.json"]
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "No space left on device" in err


def test_cli_rejects_a_missing_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--output", str(tmp_path / "missing" / "faults.json")]) == 1
    assert not (tmp_path / "missing").exists()
    assert capsys.readouterr().err.count("\n") == 1


@pytest.mark.parametrize("argv", [["--bogus"], ["--output"]], ids=["unknown-option", "missing-value"])
def test_cli_bad_arguments_exit_non_zero_with_one_line(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "error:" in err


def test_standalone_script_runs_from_the_repository_root(tmp_path: Path) -> None:
    root = REFERENCE_DIR.parent
    target = tmp_path / "faults.json"
    script = [sys.executable, str(Path("reference") / "scheduler_faults.py")]
    written = subprocess.run([*script, "--output", str(target)], cwd=root, capture_output=True, text=True)
    assert written.returncode == 0 and written.stdout == "", written.stderr
    printed = subprocess.run(script, cwd=root, capture_output=True, text=True)
    assert printed.returncode == 0 and json.loads(printed.stdout) == json.loads(target.read_text()) == demo()
    bad = subprocess.run([*script, "--nope"], cwd=root, capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1


# ------------------------------------------------------------ seeded random runs


def run_scale(request: pytest.FixtureRequest) -> int:
    return 10 if request.config.getoption("--run-slow", default=False) else 1


def random_recompute_run(seed: int, choices: int) -> None:
    """Requests and private competitors only, so pages in use follow from row counts alone."""
    rng = random.Random(seed)
    capacity, block = rng.randint(2, 8), rng.randint(1, 3)
    pool = PagedKV(capacity, block)
    requests: list[RecomputeRequest] = []
    expected: dict[str, dict[str, Any]] = {}  # owner -> prompt, outputs, state, recomputed
    competitors: dict[str, int] = {}  # owner -> rows
    tokens = iter(range(1000, 10**6))

    def rows(owner: str) -> list[int]:
        oracle = expected[owner]
        return oracle["prompt"] + oracle["outputs"][:-1]

    def pages(count: int) -> int:
        return -(-count // block)

    made = 0
    while made < choices:
        live = [r for r in requests if expected[r.owner]["state"] != "cancelled"]
        active = [r for r in live if expected[r.owner]["state"] == "active"]
        choice = rng.choice(["admit", "resume", "resume", "sample", "sample", "sample", "preempt", "preempt",
                             "cancel", "occupy", "vacate"])
        where = f"seed {seed} choice {made} {choice}"
        used = sum(pages(len(rows(r.owner))) for r in active) + sum(pages(n) for n in competitors.values())
        free = capacity - used
        if choice == "admit" and len(live) < 3:
            owner = f"r{len(requests)}"
            prompt = [rng.randint(0, 9) for _ in range(rng.randint(1, 5))]
            requests.append(RecomputeRequest(pool, owner, prompt))
            expected[owner] = {"prompt": prompt, "outputs": [], "state": "queued", "recomputed": 0}
        elif choice == "resume" and requests:
            request = rng.choice(live if live and rng.random() < 0.9 else requests)
            oracle = expected[request.owner]
            fits = pages(len(rows(request.owner))) <= free
            want = oracle["state"] == "active" or (oracle["state"] in ("queued", "preempted") and fits)
            assert request.resume() == want, where
            if want and oracle["state"] == "preempted":
                oracle["recomputed"] += len(rows(request.owner))
            oracle["state"] = "active" if want else oracle["state"]
        elif choice == "sample" and active:
            made += 1
            request = rng.choice(active)
            oracle = expected[request.owner]
            committed = len(rows(request.owner))
            want = not oracle["outputs"] or committed % block != 0 or free >= 1
            token = next(tokens)
            assert request.sample(token) == want, where
            if want:
                oracle["outputs"].append(token)
        elif choice == "preempt" and active:
            made += 1
            request = rng.choice(active if rng.random() < 0.9 else requests)  # now and then a no-op
            oracle = expected[request.owner]
            assert request.preempt() == (oracle["state"] == "active"), where
            oracle["state"] = "preempted" if oracle["state"] == "active" else oracle["state"]
        elif choice == "cancel" and requests:
            request = rng.choice(requests)
            request.cancel()
            expected[request.owner]["state"] = "cancelled"
        elif choice == "occupy" and len(competitors) < 2:
            owner, count = f"x{next(tokens)}", rng.randint(1, 4)
            pool.create(owner)
            if pool.append(owner, list(range(count))):
                competitors[owner] = count
            else:
                pool.release(owner)
            assert (owner in competitors) == (pages(count) <= free), where
        elif choice == "vacate" and competitors:
            owner = rng.choice(sorted(competitors))
            pool.release(owner)
            del competitors[owner]
        else:
            continue
        pool.check()
        for request in requests:
            oracle = expected[request.owner]
            request.check()
            assert request.state == oracle["state"], where
            assert request.outputs == oracle["outputs"], where
            assert request.recomputed_rows == oracle["recomputed"], where
            if oracle["state"] == "active":
                assert pool.read(request.owner) == rows(request.owner), where
        used = sum(pages(len(rows(r.owner))) for r in requests if expected[r.owner]["state"] == "active")
        assert len(pool.free) == capacity - used - sum(pages(n) for n in competitors.values()), where
    for request in requests:
        request.cancel()
    for owner in competitors:
        pool.release(owner)
    assert len(pool.free) == capacity


def test_seeded_preempt_sample_runs_match_the_output_history_oracle(request: pytest.FixtureRequest) -> None:
    """40 seeds x 50 preempt/sample choices (x10 with --run-slow)."""
    for seed in range(40 * run_scale(request)):
        random_recompute_run(seed, 50)


def random_transfer_run(seed: int, choices: int) -> None:
    """Sources, transfers and callbacks (stale ones included) against a token-history oracle."""
    rng = random.Random(seed)
    capacity, block = rng.randint(2, 10), rng.randint(1, 3)
    pool = PagedKV(capacity, block)
    manager = TransferManager(pool)
    histories: dict[str, list[int]] = {}
    transfers: dict[int, dict[str, Any]] = {}  # key -> source rows at begin, state, room
    last_key = 0
    needs = {"complete": "in_flight", "abort": "in_flight", "acknowledge_drained": "aborted",
             "release_output": "ready"}
    leads = {"complete": "ready", "abort": "aborted", "acknowledge_drained": "drained",
             "release_output": "released"}
    for made in range(choices):
        choice = rng.choice(["append", "append", "release", "begin", "begin", *needs, "read"])
        where = f"seed {seed} choice {made} {choice}"
        if choice == "append":
            owner = rng.choice(["s0", "s1"])
            if owner not in histories:
                pool.create(owner)
                histories[owner] = []
            rows = [rng.randint(0, 99) for _ in range(rng.randint(1, 3))]
            space = -len(histories[owner]) % block
            fresh = -(-max(0, len(rows) - space) // block)
            free = len(pool.free)
            appended = pool.append(owner, rows)
            if appended:
                histories[owner] += rows
            # a partial tail may need a copy when a transfer pins it; nothing else may decide the outcome
            assert fresh <= free if appended else fresh + (space > 0) > free, where
        elif choice == "release" and histories:
            owner = rng.choice(sorted(histories))
            pool.release(owner)
            del histories[owner]
        elif choice == "begin" and histories:
            owner, room = rng.choice(sorted(histories)), rng.choice(["room-a", "room-b"])
            busy = any(t["room"] == room and t["state"] in ("in_flight", "ready", "aborted")
                       for t in transfers.values())
            fits = -(-len(histories[owner]) // block) <= len(pool.free)
            key = manager.begin(owner, room)
            if busy or not fits:
                assert key is None, where
            else:
                assert key is not None and key > last_key, where
                transfers[key] = {"rows": list(histories[owner]), "state": "in_flight", "room": room}
                last_key = key
        elif choice in needs and transfers:
            key = rng.choice([*transfers, 10**6])
            state = transfers.get(key, {}).get("state")
            reason = (rng.choice(ABORT_REASONS),) if choice == "abort" else ()
            assert getattr(manager, choice)(key, *reason) == (state == needs[choice]), where
            if state == needs[choice]:
                transfers[key]["state"] = leads[choice]
        elif choice == "read" and transfers:
            key = rng.choice(list(transfers))
            if transfers[key]["state"] == "ready":
                assert manager.read(key) == transfers[key]["rows"], where
            else:
                with pytest.raises(TransferNotReady):
                    manager.read(key)
        else:
            continue
        manager.check()
        for owner, rows in histories.items():
            assert pool.read(owner) == rows, where
    for key, transfer in transfers.items():
        if transfer["state"] == "in_flight":
            assert manager.abort(key, "cancelled")
            transfer["state"] = "aborted"
        if transfer["state"] == "aborted":
            assert manager.acknowledge_drained(key)
        elif transfer["state"] == "ready":
            assert manager.release_output(key)
    for owner in histories:
        pool.release(owner)
    assert len(pool.free) == capacity and manager.rooms == {}


def test_seeded_lifecycle_runs_match_the_token_history_oracle(request: pytest.FixtureRequest) -> None:
    """30 seeds x 100 lifecycle choices (x10 with --run-slow)."""
    for seed in range(30 * run_scale(request)):
        random_transfer_run(seed, 100)
