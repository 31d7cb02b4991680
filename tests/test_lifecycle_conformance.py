"""The lifecycle machines pass every correct implementation and catch every broken one by its own clause.

Correct: the reference, the two variants that make the other choice on every
freedom (``lifecycle_variant``, ``lifecycle_plain``), and the published files as a student has them (a folder holding
copies of scheduler_sim.py and scheduler_faults.py).  Broken: every namespace
of examples/broken_lifecycle.py.  The machines run directly under small
derandomized settings, not through the plugin, so these results do not depend
on a Hypothesis profile.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import Phase, seed, settings
from hypothesis.stateful import run_state_machine_as_test

from pytest_cbatch.examples import lifecycle_plain, lifecycle_variant
from pytest_cbatch.examples.broken_lifecycle import BROKEN
from pytest_cbatch.lifecycle import (
    LIFECYCLE,
    LIFECYCLE_CLAUSES,
    MACHINES,
    PART_CLAUSES,
    PARTS,
    LifecycleViolation,
    lifecycle_settings,
    lifecycle_verdicts,
    missing_parts,
)
from pytest_cbatch.lifecycle.machine import surface_names
from pytest_cbatch.lifecycle.verdicts import search_here
from pytest_cbatch.reference import scheduler_faults
from seed_lifecycle_examples import SEED_EXAMPLES

REFERENCE_DIR = Path(__file__).resolve().parent.parent / "reference"
BASE = settings(max_examples=40, derandomize=True, database=None, deadline=None, print_blob=False)
# No shrink phase where detection, clause ids and scripts are tested: shrinking a failure costs tens of seconds.
NO_SHRINK = settings(BASE, phases=(Phase.explicit, Phase.generate))
DETECT = lifecycle_settings(NO_SHRINK)



def broken_part(namespace: object) -> str:
    """The one part whose class the broken namespace replaces (a broken pool is judged by the allocator)."""
    parts = [p for p, name in PARTS.items() if getattr(namespace, name) is not getattr(scheduler_faults, name)]
    if namespace.PagedKV is not scheduler_faults.PagedKV:  # type: ignore[attr-defined]
        parts = ["allocator"]
    assert len(parts) == 1, parts
    return parts[0]


@pytest.fixture(scope="module")
def published_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A student's folder: the two published files side by side, nothing else."""
    folder = tmp_path_factory.mktemp("course")
    for name in ("scheduler_sim.py", "scheduler_faults.py"):
        shutil.copy(REFERENCE_DIR / name, folder / name)
    return folder


CORRECT = [("reference", scheduler_faults), ("variant", lifecycle_variant), ("plain", lifecycle_plain)]


@pytest.mark.parametrize("part", list(PARTS))
@pytest.mark.parametrize("name,namespace", CORRECT)
def test_correct_implementations_pass_every_clause(name: str, namespace: object, part: str,
                                                  request: pytest.FixtureRequest) -> None:
    """20 derandomized runs per part, each short and at full length (400 with --run-slow)."""
    slow = request.config.getoption("--run-slow", default=False)
    verdicts = lifecycle_verdicts(part, namespace, settings(BASE, max_examples=400 if slow else 20))
    assert set(verdicts) == set(PART_CLAUSES[part])
    failed = {cid: v.message for cid, v in verdicts.items() if v.status != "pass"}
    assert not failed, "\n".join(failed.values())


def test_abort_reason_is_judged_on_every_seed() -> None:
    """lifecycle.abort_reason is judged in every seeded search of a correct transfer part, even a brief one
    (an invalid reason was only one draw in 24 of one rule, and about a fifth of random seeds never reached
    it: not judged, 0 points in grading)."""
    brief = settings(max_examples=2, database=None, deadline=None, print_blob=False)
    unjudged = []
    for draw in range(10):
        verdicts = lifecycle_verdicts("transfer", scheduler_faults, brief,
                                      search=lambda machine, stage, draw=draw: search_here(seed(draw)(machine), stage))
        if verdicts["lifecycle.abort_reason"].status != "pass":
            unjudged.append((draw, verdicts["lifecycle.abort_reason"].message))
    assert not unjudged, unjudged


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_broken_lifecycle_is_caught_by_its_clause(name: str) -> None:
    namespace, clause = BROKEN[name]
    with pytest.raises(LifecycleViolation) as caught:
        run_state_machine_as_test(MACHINES[broken_part(namespace)](namespace), settings=DETECT)
    assert caught.value.clause == clause, str(caught.value)
    assert str(caught.value).startswith(f"[{clause}] ")


def test_verdicts_isolate_one_bug_from_the_other_clauses() -> None:
    namespace, clause = BROKEN["abort_any_reason"]
    verdicts = lifecycle_verdicts("transfer", namespace, NO_SHRINK)
    assert verdicts[clause].status == "fail" and verdicts[clause].message.startswith(f"[{clause}] ")
    assert {cid for cid, v in verdicts.items() if v.status != "pass"} == {clause}


def test_verdicts_stop_after_the_bound_and_say_so() -> None:
    namespace, _ = BROKEN["append_without_cow"]
    verdicts = lifecycle_verdicts("allocator", namespace, NO_SHRINK, max_failures=1)
    statuses = sorted(v.status for v in verdicts.values())
    assert statuses.count("fail") == 1 and "pass" not in statuses
    assert all("stopped after 1 failing clauses" in v.message for v in verdicts.values() if v.status == "skip")


def test_verdicts_skip_a_missing_part_and_refuse_an_unknown_one() -> None:
    only_pool = SimpleNamespace(PagedKV=scheduler_faults.PagedKV)
    assert {v.status for v in lifecycle_verdicts("transfer", only_pool, BASE).values()} == {"skip"}
    with pytest.raises(ValueError, match="unknown lifecycle part"):
        lifecycle_verdicts("scheduler", scheduler_faults, BASE)


def test_falsifying_example_replays_as_python() -> None:
    """The replay of a failure runs as a script and fails on its last line, on that implementation."""
    namespace, clause = BROKEN["second_cancel_raises"]
    with pytest.raises(LifecycleViolation) as caught:
        run_state_machine_as_test(MACHINES["recompute"](namespace), settings=DETECT)
    *steps, last = caught.value.replay.splitlines()
    assert last.endswith(".cancel()") and caught.value.clause == clause
    scope = {name: getattr(namespace, name) for name in ("PagedKV", *PARTS.values())}
    exec("\n".join(steps), scope)  # everything before the violation runs cleanly
    with pytest.raises(RuntimeError, match="already cancelled"):
        exec(last, scope)


def test_every_clause_belongs_to_a_part_and_is_one_line() -> None:
    assert {clause for _, clause in BROKEN.values()} <= set(LIFECYCLE_CLAUSES)
    assert set().union(*PART_CLAUSES.values()) == set(LIFECYCLE_CLAUSES)
    for clause, statement in LIFECYCLE_CLAUSES.items():
        assert clause.startswith("lifecycle.") and statement and "\n" not in statement


def test_every_declared_read_and_compare_is_named_by_its_statement() -> None:
    assert set(LIFECYCLE) == set(LIFECYCLE_CLAUSES)
    for cid, declared in LIFECYCLE.items():
        assert declared.statement == LIFECYCLE_CLAUSES[cid]
        for what, words in [*declared.reads.items(), *declared.compares.items()]:
            assert words in declared.statement, f"{cid}: {what!r} is declared as named by {words!r}, which its " \
                                                f"statement does not say"


def test_the_machines_read_exactly_what_each_clause_declares() -> None:
    """Run every part on implementations of both forms (objects, plain dicts) and log each published name
    a check reads: per clause it is exactly the names its declaration lists (so a statement change that
    drops a name, or a check that reads a new one, fails here)."""
    read: dict[str, set[str]] = {cid: set() for cid in LIFECYCLE}
    config = lifecycle_settings(settings(NO_SHRINK, max_examples=20))
    for namespace in (scheduler_faults, lifecycle_plain):
        for part, factory in MACHINES.items():
            machine = factory(namespace)
            machine.read_log = log = set()
            run_state_machine_as_test(machine, settings=config)
            for cid, name in log:
                read[cid].add(name)
    for cid, declared in LIFECYCLE.items():
        names = set().union(set(), *map(surface_names, declared.reads))
        assert read[cid] == names, f"{cid}: the check reads {sorted(read[cid])}, its declaration {sorted(names)}"


@pytest.mark.parametrize("name", ["lifecycle_variant", "lifecycle_plain"])
def test_request_events_compares_no_value_the_statement_leaves_open(name: str) -> None:
    """preempted{retained_tokens} is read (it must be there) but never compared: the variants count it differently."""
    declared = LIFECYCLE["lifecycle.request_events"]
    assert "e['retained_tokens']" in declared.reads
    assert not any("retained_tokens" in surface_names(what) for what in declared.compares)
    namespace = {"lifecycle_variant": lifecycle_variant, "lifecycle_plain": lifecycle_plain}[name]
    pool = namespace.PagedKV(4, 2)
    request = namespace.RecomputeRequest(pool, "r", [1, 2, 3])
    request.resume()
    request.sample(7)
    request.preempt()
    retained = [e["retained_tokens"] for e in request.events if e["event"] == "preempted"]
    assert retained == [{"lifecycle_variant": 3, "lifecycle_plain": 4}[name]]


def test_missing_parts_names_what_is_absent() -> None:
    assert missing_parts(scheduler_faults) == {}
    assert set(missing_parts(None)) == set(PARTS)
    only_pool = missing_parts(SimpleNamespace(PagedKV=scheduler_faults.PagedKV))
    assert set(only_pool) == {"recompute", "transfer"}
    assert "RecomputeRequest" in only_pool["recompute"] and "PagedKV" not in only_pool["recompute"]


@pytest.mark.parametrize("example", sorted(SEED_EXAMPLES))
def test_seed_examples_run_verbatim_in_the_published_folder(published_folder: Path, example: str) -> None:
    run = subprocess.run([sys.executable, "-c", SEED_EXAMPLES[example]], cwd=published_folder,
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr


@pytest.mark.parametrize("example", sorted(SEED_EXAMPLES))
def test_seed_examples_run_against_the_variant(example: str) -> None:
    scope = {"PagedKV": lifecycle_variant.PagedKV, "RecomputeRequest": lifecycle_variant.RecomputeRequest,
             "TransferManager": lifecycle_variant.TransferManager}
    body = "\n".join(line for line in SEED_EXAMPLES[example].splitlines() if not line.startswith("from "))
    exec(compile(body, f"<seed example {example}>", "exec"), scope)


def test_published_files_pass_the_suite_by_file_path(published_folder: Path) -> None:
    """``--cbatch-impl=path/to/scheduler_faults.py`` (no :attr) is that module, its folder on sys.path."""
    target = published_folder / "scheduler_faults.py"
    runner = published_folder.parent / f"{published_folder.name}-runner"
    runner.mkdir(exist_ok=True)
    (runner / "conftest.py").write_text(  # a smaller derandomized profile keeps this run short
        "from hypothesis import settings\n"
        "settings.register_profile('brief', max_examples=10, derandomize=True, database=None)\n"
    )
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", f"--cbatch-impl={target}",
         "-k", "test_lifecycle", "--hypothesis-profile=brief"],
        cwd=runner, capture_output=True, text=True, timeout=300,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    assert "3 passed" in run.stdout, run.stdout[-2000:]
