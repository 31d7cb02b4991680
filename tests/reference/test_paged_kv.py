"""The reference PagedKV (in scheduler_sim.py): the published allocator, page by page."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from pytest_cbatch.reference.scheduler_sim import Page, PagedKV

REFERENCE_DIR = Path(__file__).resolve().parents[2] / "reference"


def pool_with(capacity: int, block_size: int, **owners: list[int]) -> PagedKV:
    pool = PagedKV(capacity, block_size)
    for owner, rows in owners.items():
        pool.create(owner)
        for token in rows:
            pool.append(owner, token)
    return pool


def snapshot(pool: PagedKV) -> tuple[object, ...]:
    pages = {pid: (set(p.owners), set(p.pins), list(p.tokens)) for pid, p in pool.pages.items()}
    return sorted(pool.free), pages, {o: list(t) for o, t in pool.tables.items()}, dict(pool.transfers)


@pytest.mark.parametrize("capacity,block_size", [(0, 2), (-1, 2), (2, 0), (2.5, 2), (True, 2), (2, "2")])
def test_constructor_rejects_bad_sizes(capacity: object, block_size: object) -> None:
    with pytest.raises(ValueError, match="must be an integer >= 1"):
        PagedKV(capacity, block_size)  # type: ignore[arg-type]


def test_lowest_free_page_first_and_freed_pages_return() -> None:
    pool = pool_with(4, 2, a=[1, 2, 3], b=[4])
    assert pool.tables == {"a": [0, 1], "b": [2]} and pool.free == [3]
    pool.release("a")
    pool.create("c")
    pool.append("c", 5)
    assert pool.tables["c"] == [0] and sorted(pool.free) == [1, 3]
    assert pool.pages[2] == Page({"b"}, set(), [4])


def test_append_fills_the_tail_in_place_and_returns_none() -> None:
    pool = pool_with(3, 2, a=[1])
    assert pool.append("a", 2) is None and len(pool.free) == 2
    pool.append("a", 3)
    assert pool.read("a") == [1, 2, 3] and pool.tables["a"] == [0, 1]
    pool.check()


def test_append_without_a_free_page_raises_and_changes_nothing() -> None:
    pool = pool_with(1, 2, a=[1, 2])
    before = snapshot(pool)
    with pytest.raises(MemoryError):
        pool.append("a", 3)
    assert snapshot(pool) == before
    with pytest.raises(ValueError, match="must be an int"):
        pool.append("a", [3])  # type: ignore[arg-type]


def test_fork_shares_every_page_including_the_partial_tail() -> None:
    pool = pool_with(4, 2, a=[1, 2, 3])
    pool.fork("a", "b")
    assert pool.tables["b"] == pool.tables["a"] == [0, 1] and len(pool.free) == 2
    assert pool.pages[1].owners == {"a", "b"}
    pool.append("b", 4)  # copy-on-write of the shared partial tail
    assert pool.read("a") == [1, 2, 3] and pool.read("b") == [1, 2, 3, 4]
    assert pool.tables["b"] == [0, 2] and pool.pages[1].owners == {"a"}
    with pytest.raises(ValueError, match="exists"):
        pool.fork("a", "b")
    pool.check()


def test_a_pinned_partial_tail_is_copied_and_the_pinned_view_is_frozen() -> None:
    pool = pool_with(4, 2, a=[1, 2, 3])
    assert pool.pin("a", "t") == (0, 1) and pool.transfers == {"t": (0, 1)}
    pool.append("a", 4)
    assert pool.read("a") == [1, 2, 3, 4] and pool.tables["a"] == [0, 2]
    assert [t for p in pool.transfers["t"] for t in pool.pages[p].tokens] == [1, 2, 3]
    pool.release("a")
    assert sorted(pool.pages) == [0, 1] and pool.pages[0].pins == {"t"}  # pins keep pages without owners
    pool.unpin("t")
    assert not pool.pages and sorted(pool.free) == [0, 1, 2, 3]


def test_copy_on_write_without_a_spare_page_fails_atomically() -> None:
    pool = pool_with(2, 2, a=[1, 2, 3])
    pool.pin("a", "t")
    before = snapshot(pool)
    with pytest.raises(MemoryError):
        pool.append("a", 4)
    assert snapshot(pool) == before


def test_a_full_shared_tail_needs_no_copy() -> None:
    pool = pool_with(3, 2, a=[1, 2])
    pool.fork("a", "b")
    pool.append("b", 3)
    assert pool.tables["b"] == [0, 1] and pool.pages[0].owners == {"a", "b"}


def test_names_and_unknown_owners() -> None:
    pool = pool_with(4, 2, a=[1])
    pool.pin("a", "t")
    before = snapshot(pool)
    with pytest.raises(ValueError):
        pool.create("a")
    with pytest.raises(ValueError):
        pool.pin("a", "t")
    for call in (pool.read, pool.release, lambda o: pool.append(o, 1), lambda o: pool.fork(o, "z"),
                 lambda o: pool.pin(o, "u")):
        with pytest.raises(KeyError, match="unknown owner 'nobody'"):
            call("nobody")
    with pytest.raises(KeyError, match="unknown pin"):
        pool.unpin("nope")
    assert snapshot(pool) == before
    assert pool.pin("a", "second") == (0,)  # a second pin of the same pages is fine


def test_check_reports_corruption() -> None:
    pool = pool_with(3, 2, a=[1, 2, 3])
    pool.check()
    pool.free.append(0)
    with pytest.raises(AssertionError, match="both free and allocated"):
        pool.check()
    pool = pool_with(3, 2, a=[1, 2, 3])
    pool.pages[0].tokens.pop()
    with pytest.raises(AssertionError, match="page 0 holds 1 of 2 rows"):
        pool.check()


def test_scheduler_sim_loads_by_path_alone_from_any_directory(tmp_path: Path) -> None:
    """The course's tests load scheduler_sim.py with spec_from_file_location, its folder not on sys.path."""
    code = (
        "import importlib.util, sys\n"
        f"path = {str(REFERENCE_DIR / 'scheduler_sim.py')!r}\n"
        "spec = importlib.util.spec_from_file_location('sim_under_test', path)\n"
        "module = importlib.util.module_from_spec(spec); spec.loader.exec_module(module)\n"
        "pool = module.PagedKV(2, 1); pool.create('a'); pool.append('a', 7); pool.check()\n"
        "assert pool.read('a') == [7] and pool.free == [1]\n"
    )
    run = subprocess.run([sys.executable, "-I", "-c", code], cwd=tmp_path, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
