"""Contracts of the reference paged KV allocator, plus seeded runs against a separate page-ledger oracle."""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_cbatch.reference.paged_kv import PagedKV

REFERENCE_DIR = Path(__file__).resolve().parents[2] / "reference"


def pool_with(capacity: int, block_size: int, **owners: list[int]) -> PagedKV:
    pool = PagedKV(capacity, block_size)
    for owner, rows in owners.items():
        pool.create(owner)
        assert pool.append(owner, rows)
    return pool


# ------------------------------------------------------------------ arguments


@pytest.mark.parametrize("capacity,block_size", [(0, 2), (-1, 2), (2, 0), (2.5, 2), (True, 2), (2, "2")])
def test_constructor_rejects_bad_sizes(capacity: object, block_size: object) -> None:
    with pytest.raises(ValueError, match="must be a positive int"):
        PagedKV(capacity, block_size)  # type: ignore[arg-type]


def test_owner_and_pin_errors_change_nothing() -> None:
    pool = pool_with(4, 2, a=[1, 2, 3])
    free = pool.free
    with pytest.raises(ValueError, match="already exists"):
        pool.create("a")
    with pytest.raises(ValueError, match="already exists"):
        pool.fork("a", "a")
    for call in (pool.read, pool.release, pool.pin, lambda o: pool.append(o, [1]), lambda o: pool.fork(o, "b")):
        with pytest.raises(KeyError, match="unknown owner 'nobody'"):
            call("nobody")
    pin_id = pool.pin("a")
    pool.unpin(pin_id)
    for call in (pool.unpin, pool.read_pin):
        with pytest.raises(KeyError, match=f"unknown pin id {pin_id}"):
            call(pin_id)
    with pytest.raises(ValueError, match="tokens must be ints"):
        pool.append("a", [4, True])
    with pytest.raises(ValueError, match="owner must be a str"):
        pool.create(7)  # type: ignore[arg-type]
    assert pool.read("a") == [1, 2, 3] and pool.free == free
    assert "b" not in pool
    pool.check()


# -------------------------------------------------------------- page contract


def test_free_list_is_fifo_and_deterministic() -> None:
    pool = pool_with(4, 2, a=[1, 2, 3], b=[4])
    assert pool.free == (3,)
    pool.release("a")
    assert pool.free == (3, 0, 1)
    pool.create("c")
    assert pool.append("c", [5, 6, 7])
    assert pool.free == (1,)


def test_append_fills_the_tail_in_place_then_allocates() -> None:
    pool = pool_with(3, 2, a=[1])
    assert pool.append("a", [2]) and len(pool.free) == 2
    assert pool.append("a", [3, 4, 5]) and len(pool.free) == 0
    assert pool.read("a") == [1, 2, 3, 4, 5]
    assert pool.append("a", []) and pool.append("a", [6])  # an empty append, then the tail's last row
    pool.check()


def test_failed_append_is_atomic() -> None:
    pool = pool_with(3, 2, a=[1], b=[2, 3])
    assert not pool.append("a", [4, 5, 6, 7])  # needs the tail row plus two new pages; one is free
    assert pool.read("a") == [1] and pool.free == (2,)
    pool.check()


def test_fork_shares_every_page_including_the_partial_tail() -> None:
    pool = pool_with(4, 2, a=[1, 2, 3])
    pool.fork("a", "b")
    assert pool.read("b") == [1, 2, 3] and len(pool.free) == 2
    assert pool.append("b", [4])  # copy-on-write of the shared tail
    assert pool.read("a") == [1, 2, 3] and pool.read("b") == [1, 2, 3, 4] and len(pool.free) == 1
    assert pool.append("a", [5])  # the old tail is private to a again: written in place
    assert pool.read("a") == [1, 2, 3, 5] and len(pool.free) == 1
    pool.release("a")
    assert len(pool.free) == 2  # the shared full page stays with b
    pool.check()


def test_pinned_tail_is_copied_and_the_pin_view_is_frozen() -> None:
    pool = pool_with(4, 2, a=[1, 2, 3])
    pin_id = pool.pin("a")
    assert len(pool.free) == 2
    assert pool.append("a", [4, 5])
    assert pool.read("a") == [1, 2, 3, 4, 5] and pool.read_pin(pin_id) == [1, 2, 3]
    assert len(pool.free) == 0
    pool.release("a")
    assert len(pool.free) == 2 and pool.read_pin(pin_id) == [1, 2, 3]  # pinned pages outlive the owner
    pool.unpin(pin_id)
    assert len(pool.free) == 4
    pool.check()


def test_copy_on_write_without_a_spare_page_fails_atomically() -> None:
    pool = pool_with(2, 2, a=[1, 2, 3])
    pin_id = pool.pin("a")
    assert not pool.append("a", [4])
    assert pool.read("a") == [1, 2, 3] and pool.read_pin(pin_id) == [1, 2, 3] and pool.free == ()
    pool.check()


def test_full_shared_tail_needs_no_copy() -> None:
    pool = pool_with(3, 2, a=[1, 2])
    pool.fork("a", "b")
    assert pool.append("a", [3]) and len(pool.free) == 1
    assert pool.read("b") == [1, 2]


def test_check_reports_corruption_precisely() -> None:
    pool = pool_with(4, 2, a=[1, 2, 3])
    pool._refs[0] = 2  # simulate a lost decrement
    with pytest.raises(AssertionError, match=r"page 0: refcount 2 but 1 table references"):
        pool.check()
    pool._refs[0] = 1
    pool._free.append(0)
    with pytest.raises(AssertionError, match=r"page 0 is both used and free"):
        pool.check()
    pool._free.pop()
    pool._rows[0].pop()
    with pytest.raises(AssertionError, match=r"owner 'a': non-tail page 0 holds 1 of 2 rows"):
        pool.check()


# ---------------------------------------------------------------- as a script


def test_runs_as_a_script_and_imports_as_plain_module() -> None:
    script = subprocess.run([sys.executable, "paged_kv.py"], cwd=REFERENCE_DIR, capture_output=True, text=True)
    assert script.returncode == 0, script.stderr
    assert '"pin": [1, 2, 3]' in script.stdout
    plain = subprocess.run([sys.executable, "-c", "import paged_kv; paged_kv.PagedKV(1, 1).check()"],
                           cwd=REFERENCE_DIR, capture_output=True, text=True)
    assert plain.returncode == 0, plain.stderr


# ------------------------------------------------- seeded runs against a ledger


class Ledger:
    """Separate oracle: pages are Python lists whose identity is the sharing.

    A page is in use while an owner's list or a pin's tuple holds that very
    list; nothing counts references.
    """

    def __init__(self, capacity: int, block_size: int) -> None:
        self.capacity, self.block = capacity, block_size
        self.owners: dict[str, list[list[int]]] = {}
        self.pins: dict[int, tuple[tuple[list[int], ...], list[int]]] = {}  # pin id -> (pages, frozen rows)

    def holders(self, page: list[int]) -> int:
        tables = sum(p is page for table in self.owners.values() for p in table)
        return tables + sum(p is page for pages, _ in self.pins.values() for p in pages)

    def free(self) -> int:
        used = {id(p) for table in self.owners.values() for p in table}
        used |= {id(p) for pages, _ in self.pins.values() for p in pages}
        return self.capacity - len(used)

    def rows(self, owner: str) -> list[int]:
        return [token for page in self.owners[owner] for token in page]

    def append(self, owner: str, tokens: list[int]) -> bool:
        table = self.owners[owner]
        todo = list(tokens)
        tail = table[-1] if table and len(table[-1]) < self.block else None
        copy = bool(tail is not None and todo and self.holders(tail) > 1)
        room = self.block - len(tail) if tail is not None else 0
        fresh = -(-max(0, len(todo) - room) // self.block)
        if fresh + copy > self.free():
            return False
        if copy:
            table[-1] = tail = list(tail)
        if tail is not None:
            tail.extend(todo[:room])
            todo = todo[room:]
        while todo:
            table.append(todo[: self.block])
            todo = todo[self.block:]
        return True


def random_allocator_run(seed: int, operations: int) -> None:
    rng = random.Random(seed)
    capacity, block = rng.randint(1, 8), rng.randint(1, 3)
    pool, ledger = PagedKV(capacity, block), Ledger(capacity, block)
    names = ["a", "b", "c", "d"]
    for step in range(operations):
        live = sorted(ledger.owners)
        absent = [n for n in names if n not in ledger.owners]
        choice = rng.choice(["create", "append", "append", "append", "fork", "pin", "unpin", "release"])
        where = f"seed {seed} step {step} {choice}"
        if choice == "create" and absent:
            owner = rng.choice(absent)
            pool.create(owner)
            ledger.owners[owner] = []
        elif choice == "append" and live:
            owner, tokens = rng.choice(live), [rng.randint(0, 99) for _ in range(rng.randint(0, 5))]
            assert pool.append(owner, tokens) == ledger.append(owner, tokens), where
        elif choice == "fork" and live and absent:
            src, dst = rng.choice(live), rng.choice(absent)
            pool.fork(src, dst)
            ledger.owners[dst] = list(ledger.owners[src])
        elif choice == "pin" and live:
            owner = rng.choice(live)
            ledger.pins[pool.pin(owner)] = (tuple(ledger.owners[owner]), ledger.rows(owner))
        elif choice == "unpin" and ledger.pins:
            pin_id = rng.choice(sorted(ledger.pins))
            pool.unpin(pin_id)
            del ledger.pins[pin_id]
        elif choice == "release" and live:
            owner = rng.choice(live)
            pool.release(owner)
            del ledger.owners[owner]
        pool.check()
        assert len(pool.free) == ledger.free(), where
        for owner in ledger.owners:
            assert pool.read(owner) == ledger.rows(owner), where
        for pin_id, (_, frozen) in ledger.pins.items():
            assert pool.read_pin(pin_id) == frozen, where
    for owner in list(ledger.owners):
        pool.release(owner)
    for pin_id in list(ledger.pins):
        pool.unpin(pin_id)
    assert len(pool.free) == capacity


def test_seeded_allocator_runs_match_the_ledger(request: pytest.FixtureRequest) -> None:
    """25 seeds x 200 operation choices (x10 with --run-slow)."""
    scale = 10 if request.config.getoption("--run-slow", default=False) else 1
    for seed in range(25 * scale):
        random_allocator_run(seed, 200)
