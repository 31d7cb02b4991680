"""The reference lifecycle model (reference/scheduler_faults.py): the published API, its exercises and its demo.

The seed's two printed examples run verbatim (beside the module and against
the installed one); its five exercises are checked with their exact answers;
the fault matrix and every refusal the published text names are covered.
Randomized conformance is tests/test_lifecycle_conformance.py's job.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_cbatch.reference.scheduler_faults import (
    ABORT_REASONS,
    PagedKV,
    RecomputeRequest,
    TransferManager,
    demo,
    main,
)
from seed_lifecycle_examples import SEED_EXAMPLES

REFERENCE_DIR = Path(__file__).resolve().parents[2] / "reference"


def active(pool: PagedKV, owner: str, prompt: list[int], *samples: int) -> RecomputeRequest:
    request = RecomputeRequest(pool, owner, prompt)
    assert request.resume()
    for token in samples:
        request.sample(token)
    return request


def source(pool: PagedKV, owner: str, rows: list[int]) -> str:
    pool.create(owner)
    for token in rows:
        pool.append(owner, token)
    return owner


@pytest.mark.parametrize("example", sorted(SEED_EXAMPLES))
def test_printed_example_runs_verbatim_beside_the_module(example: str) -> None:
    run = subprocess.run([sys.executable, "-c", SEED_EXAMPLES[example]], cwd=REFERENCE_DIR,
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr


@pytest.mark.parametrize("example", sorted(SEED_EXAMPLES))
def test_printed_example_runs_against_the_installed_module(example: str) -> None:
    installed = SEED_EXAMPLES[example].replace("from scheduler_faults import",
                                               "from pytest_cbatch.reference.scheduler_faults import")
    exec(compile(installed, f"<seed example {example}>", "exec"), {})


# ------------------------------------------------------------------- requests


def test_three_histories_stay_apart() -> None:
    pool = PagedKV(4, 2)
    request = active(pool, "r", [10, 11, 12], 20, 21)
    assert request.committed == [10, 11, 12, 20] and pool.read("r") == request.committed
    request.preempt()
    assert request.outputs == [20, 21] and "r" not in pool.tables
    assert request.resume() and request.recomputed_rows == 4 and pool.read("r") == [10, 11, 12, 20]
    assert request.events == [
        {"event": "resumed", "recomputed_rows": 0},
        {"event": "emit", "index": 0, "token": 20},
        {"event": "emit", "index": 1, "token": 21},
        {"event": "preempted", "retained_tokens": 4},
        {"event": "resumed", "recomputed_rows": 4},
    ]
    request.check()


@pytest.mark.parametrize("owner,prompt", [("", [1]), ("r", []), ("r", [1, "2"]), ("r", [True]), ("r", 5)])
def test_bad_requests_are_refused(owner: str, prompt: object) -> None:
    with pytest.raises(ValueError):
        RecomputeRequest(PagedKV(2, 2), owner, prompt)  # type: ignore[arg-type]


def test_calls_in_the_wrong_state_raise_value_error() -> None:
    pool = PagedKV(4, 2)
    pool.create("taken")
    with pytest.raises(ValueError):
        RecomputeRequest(pool, "taken", [1])
    request = RecomputeRequest(pool, "r", [1])
    for call in (lambda: request.sample(1), request.preempt):
        with pytest.raises(ValueError):
            call()
    assert request.resume()
    for call in (request.resume, lambda: request.sample(1.5)):
        with pytest.raises(ValueError):
            call()
    request.preempt()
    pool.create("r")  # someone reused the name while the request was suspended
    with pytest.raises(ValueError):
        request.resume()
    pool.release("r")
    request.cancel()
    request.cancel()  # idempotent: records nothing more
    assert request.events[-1] == {"event": "cancelled"} and request.events[-2]["event"] == "preempted"
    with pytest.raises(ValueError):
        request.resume()


def test_failed_replay_releases_everything_and_a_later_retry_succeeds() -> None:
    pool = PagedKV(3, 2)
    request = active(pool, "r", [1, 2, 3], 4)
    request.preempt()
    source(pool, "squatter", [9, 9, 9])  # leaves one page: the two-page replay starts and cannot finish
    assert not request.resume()
    assert request.state == "preempted" and "r" not in pool.tables and len(pool.free) == 1
    assert request.events[-1] == {"event": "resume_blocked", "rows": 3} and request.recomputed_rows == 0
    pool.release("squatter")
    assert request.resume() and request.recomputed_rows == 3


def test_failed_decode_allocation_propagates_and_emits_nothing() -> None:
    pool = PagedKV(2, 2)
    request = active(pool, "r", [1, 2], 3)
    source(pool, "x", [7])
    with pytest.raises(MemoryError):
        request.sample(4)
    assert request.outputs == [3] and pool.read("r") == [1, 2]
    assert [e for e in request.events if e["event"] == "emit"] == [{"event": "emit", "index": 0, "token": 3}]


# ------------------------------------------------------------------ transfers


@pytest.mark.parametrize("reason", ABORT_REASONS)
def test_every_abort_reason_retains_pages_until_drained(reason: str) -> None:
    pool = PagedKV(4, 2)
    manager = TransferManager(pool)
    key = manager.begin(source(pool, "s", [1, 2, 3]), "room")
    pool.release("s")
    assert manager.abort(key, reason) and manager.records[key].reason == reason
    assert len(pool.free) == 0 and manager.records[key].state == "draining" and key not in pool.tables
    assert manager.acknowledge_drained(key) and len(pool.free) == 4 and manager.rooms == {}


def test_abort_reasons_default_and_refusals() -> None:
    pool = PagedKV(4, 2)
    manager = TransferManager(pool)
    key = manager.begin(source(pool, "s", [1]), "room")
    with pytest.raises(ValueError):
        manager.abort(key, "cancelled")  # checked first, even for a live key
    with pytest.raises(ValueError):
        manager.abort("_transfer/99", "reboot")  # and for an unknown one
    assert manager.records[key].state == "in_flight"
    assert manager.abort(key) and manager.records[key].reason == "cancel"


def test_keys_generation_and_begin_refusals() -> None:
    pool = PagedKV(4, 2)
    manager = TransferManager(pool)
    assert manager.generation == 0
    source(pool, "s", [1, 2, 3])
    pool.create("empty")
    for room, owner in ((" ", "s"), ("", "s"), ("room", "empty")):
        with pytest.raises(ValueError):
            manager.begin(owner, room)
    with pytest.raises(KeyError):
        manager.begin("nobody", "room")
    assert manager.generation == 0
    first = manager.begin("s", "room")
    assert first == "_transfer/1" and manager.generation == 1
    assert manager.records[first].destination_pages == pool.transfers[first + "/destination"] == (2, 3)
    with pytest.raises(ValueError):
        manager.begin("s", "room")  # the room is live
    before = (sorted(pool.free), dict(pool.transfers), set(pool.tables))
    with pytest.raises(MemoryError):
        manager.begin("s", "other")  # needs two pages, none is free
    assert (sorted(pool.free), dict(pool.transfers), set(pool.tables)) == before
    assert manager.generation == 2 and "other" not in manager.rooms
    assert manager.abort(first) and manager.acknowledge_drained(first)
    assert manager.begin("s", "room") == "_transfer/3"  # the failed reservation used generation 2


def test_publication_before_read_and_callbacks_that_do_not_apply() -> None:
    pool = PagedKV(6, 2)
    manager = TransferManager(pool)
    key = manager.begin(source(pool, "s", [1, 2, 3]), "room")
    with pytest.raises(ValueError):
        manager.read(key)
    with pytest.raises(KeyError):
        manager.read("_transfer/9")
    assert pool.read(key) == [0, 0, 0]  # placeholder rows, never published
    for call in (manager.acknowledge_drained, manager.release_output):
        assert call(key) is False
    assert manager.complete(key) is True and manager.read(key) == [1, 2, 3]
    assert manager.complete(key) is False and manager.abort(key, "timeout") is False
    assert manager.events[-1] == {"event": "completion_ignored", "key": key}
    assert manager.release_output(key) is True and manager.release_output(key) is False
    with pytest.raises(ValueError):
        manager.read(key)
    manager.check()


# ------------------------------------------------------------ seed exercises


def test_exercise_1_without_a_drain_acknowledgement_four_pages_stay_allocated() -> None:
    pool = PagedKV(4, 2)
    request = active(pool, "r", [1, 2, 3])
    manager = TransferManager(pool)
    key = manager.begin("r", "room-a")
    request.cancel()
    assert manager.abort(key, "cancel")
    assert request.state == "cancelled" and len(pool.pages) == 4 and not pool.tables


def test_exercise_2_completion_then_abort_and_the_reverse() -> None:
    pool = PagedKV(8, 2)
    manager = TransferManager(pool)
    first = manager.begin(source(pool, "s", [1, 2, 3]), "room-a")
    assert manager.complete(first) and manager.read(first) == [1, 2, 3]
    assert not manager.abort(first, "cancel")
    assert manager.release_output(first) and first not in pool.tables
    second = manager.begin("s", "room-a")
    assert manager.abort(second, "cancel") and not manager.complete(second)
    with pytest.raises(ValueError):
        manager.read(second)
    assert manager.acknowledge_drained(second) and manager.records[second].state == "drained"
    with pytest.raises(ValueError):
        manager.read(second)


def test_exercise_3_append_during_transfer_copies_the_tail() -> None:
    pool = PagedKV(8, 2)
    manager = TransferManager(pool)
    key = manager.begin(source(pool, "s", [1, 2, 3]), "room")
    pool.append("s", 4)
    assert pool.read("s") == [1, 2, 3, 4] and pool.tables["s"][-1] not in pool.transfers[key + "/source"]
    assert manager.complete(key) and manager.read(key) == [1, 2, 3]


def test_exercise_3_without_a_spare_page_append_fails_and_both_views_hold() -> None:
    pool = PagedKV(4, 2)
    manager = TransferManager(pool)
    key = manager.begin(source(pool, "s", [1, 2, 3]), "room")
    with pytest.raises(MemoryError):
        pool.append("s", 4)
    assert pool.read("s") == [1, 2, 3] and manager.complete(key) and manager.read(key) == [1, 2, 3]


def test_exercise_4_a_stale_completion_cannot_touch_the_new_attempt() -> None:
    pool = PagedKV(8, 2)
    manager = TransferManager(pool)
    old = manager.begin(source(pool, "s", [1, 2, 3]), "room-a")
    assert manager.abort(old, "timeout") and manager.acknowledge_drained(old)
    new = manager.begin("s", "room-a")
    before = (manager.records[new].destination_pages, dict(pool.transfers), sorted(pool.free))
    assert not manager.complete(old)
    assert manager.records[new].state == "in_flight"
    assert (manager.records[new].destination_pages, dict(pool.transfers), sorted(pool.free)) == before


def test_exercise_5_the_built_in_report() -> None:
    report = demo()
    assert report["outputs"] == [20, 21, 22]
    assert report["received_rows"] == [10, 11, 12, 20, 21]
    assert report["recomputed_rows"] == 4
    assert report["retained_pages_before_drain_ack"] == 4
    assert report["free_pages_at_end"] == 8
    assert report["schema_version"] == 1 and report["model"] == "CPU lifecycle accounting; no timing model"
    assert [e["event"] for e in report["transfer_events"]] == [
        "begin", "abort", "completion_ignored", "drained", "begin", "completion_ignored", "ready", "output_released"]
    assert report["transfer_events"][1] == {"event": "abort", "key": "_transfer/1", "reason": "timeout"}
    assert report == json.loads(json.dumps(report))


# --------------------------------------------------------------------- CLI


def test_cli_prints_with_indent_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 0
    out = capsys.readouterr().out
    assert out == json.dumps(demo(), indent=2) + "\n"


def test_cli_writes_the_report(tmp_path: Path) -> None:
    target = tmp_path / "faults.json"
    assert main(["--output", str(target)]) == 0
    assert json.loads(target.read_text()) == demo()


def test_cli_cannot_write_exits_1_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--output", str(tmp_path / "missing" / "faults.json")]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot write" in err


def test_standalone_script_runs_beside_scheduler_sim(tmp_path: Path) -> None:
    target = tmp_path / "faults.json"
    script = [sys.executable, "scheduler_faults.py"]
    written = subprocess.run([*script, "--output", str(target)], cwd=REFERENCE_DIR, capture_output=True, text=True)
    assert written.returncode == 0 and written.stdout == "", written.stderr
    printed = subprocess.run(script, cwd=REFERENCE_DIR, capture_output=True, text=True)
    assert printed.returncode == 0 and json.loads(printed.stdout) == json.loads(target.read_text()) == demo()
    bad = subprocess.run([*script, "--nope"], cwd=REFERENCE_DIR, capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1
