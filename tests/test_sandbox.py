"""The sandbox: a hostile or broken submission fails its own calls, never the grader."""

from __future__ import annotations

import os
import textwrap
import time
from pathlib import Path

import pytest

from pytest_cbatch.impls import ImplementationError
from pytest_cbatch.runner import ALL_CLAUSES, Judge
from pytest_cbatch.sandbox import IsolatedImplementation, Limits, LoadSpec, SandboxFailure, load_spec_for
from pytest_cbatch.workloads import WORKLOADS

DEMO = WORKLOADS["demo"]
# Far above what any call here costs, even on a loaded machine: only the hang test relies on a short limit.
LIMITS = Limits(call_seconds=120, output_kb=64, max_failures=2)
SHORT = Limits(call_seconds=3, output_kb=64, max_failures=2)

_REFERENCE = "from pytest_cbatch.reference.scheduler_sim import simulate as _reference\n"


@pytest.fixture
def published_copy(tmp_path: Path) -> Path:
    """The reference laid out as a student folder (the grading example's ``correct`` sample)."""
    from grading_samples import make_samples

    return make_samples(tmp_path / "samples", only=("correct",))[0]


def isolated(tmp_path: Path, body: str, limits: Limits = LIMITS) -> IsolatedImplementation:
    (tmp_path / "sub.py").write_text(textwrap.dedent(body), encoding="utf-8")
    impl = IsolatedImplementation("sub.py", load_spec_for(str(tmp_path / "sub.py")), limits)
    return impl


def run_demo(impl: IsolatedImplementation):
    return impl.run(list(DEMO.trace), DEMO.config)


def test_a_correct_submission_passes_every_clause_through_the_sandbox(tmp_path: Path, published_copy: Path) -> None:
    impl = IsolatedImplementation("correct", load_spec_for(str(published_copy)), LIMITS)
    assert impl.sources["simulate"] == "scheduler_sim.py"
    judge = Judge(impl)
    verdicts = {cid: judge.judge(cid, list(DEMO.trace), DEMO.config).status for cid in ALL_CLAUSES
                if cid != "invalid_input_refused"}
    assert set(verdicts.values()) == {"pass"}, verdicts
    impl.close()


@pytest.mark.parametrize("body,limits,words", [
    ("import os\ndef simulate(events, **config):\n    os._exit(7)\n", LIMITS, "exited with status 7"),
    ("def simulate(events, **config):\n    while True:\n        pass\n", SHORT, "did not answer within 3 s"),
    ("import sys\ndef simulate(events, **config):\n    sys.stdout.write('x' * (1 << 20))\n    return {}\n",
     LIMITS, "printed more than 64 KiB"),
    ("import json, os, sys\ndef simulate(events, **config):\n"
     "    os.write(json.loads(sys.argv[1])['rpc_out'], b'not json\\n')\n    return {}\n",
     LIMITS, "wrote garbage (Expecting value"),
], ids=["died", "timeout", "flood", "garbage"])
def test_a_broken_call_is_a_clear_failure_and_the_next_call_gets_a_fresh_child(
    tmp_path: Path, body: str, limits: Limits, words: str
) -> None:
    impl = isolated(tmp_path, body, limits)
    out = run_demo(impl)
    failure = out.stopped if words.startswith("did not answer") else out.broken  # a hang is a stop
    assert out.report is None and words in failure, out
    if out.stopped:  # what the run did, as every stop reads: "the run was stopped: it did not answer ..."
        assert out.stopped.startswith("did not answer"), out.stopped
    first_generation = impl.sandbox.generation
    again = run_demo(impl)  # a fresh child: same failure, not a stale or dead channel
    assert words in (again.stopped if words.startswith("did not answer") else again.broken)
    assert impl.sandbox.generation == first_generation + 1
    third = run_demo(impl)  # max_failures=2 in a row: it still runs, at the short limit, and fails the same way
    assert impl.sandbox.generation == first_generation + 2
    if words.startswith("did not answer"):
        assert "did not answer within 1 s" in third.stopped and "short limit of 1 s instead of 3 s" in third.stopped
    else:
        assert words in third.broken and "not run" not in third.broken, third
    impl.close()


def test_sys_exit_and_exceptions_are_not_refusals_unless_they_are(tmp_path: Path) -> None:
    impl = isolated(tmp_path, """
        import sys
        def simulate(events, **config):
            if config["capacity"] == 1:
                sys.exit(2)
            if config["capacity"] == 2:
                raise NotImplementedError("no optimistic admission")
            raise ValueError("bad trace line 1")
    """)
    assert "sys.exit(2)" in impl.run([], {"capacity": 1}).broken
    assert impl.run([], {"capacity": 2}).unsupported
    assert impl.run([], {"capacity": 3}).refused == "ValueError: bad trace line 1"
    impl.close()


def test_input_mutation_in_the_child_is_reported_like_in_process(tmp_path: Path) -> None:
    impl = isolated(tmp_path, _REFERENCE + """
def simulate(events, **config):
    report = _reference(events, **config)
    events[0]["time"] = 99
    return report
""")
    out = run_demo(impl)
    assert out.report is not None and out.mutated == "trace line 0 changed"
    impl.close()


def test_monkeypatching_the_kit_patches_only_the_childs_copy(tmp_path: Path) -> None:
    impl = isolated(tmp_path, """
        import pytest_cbatch.contract as contract
        contract.check_report = lambda *args, **kwargs: []
        def simulate(events, **config):
            return {"garbage": True}
    """)
    result = Judge(impl).judge("schema_valid", list(DEMO.trace), DEMO.config)
    assert result.status == "fail"
    impl.close()


def test_the_child_sees_a_scrubbed_environment_and_its_own_copy(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("CBATCH_GRADER_SECRET", "s3cret")
    (tmp_path / "data.txt").write_text("original", encoding="utf-8")
    impl = isolated(tmp_path, """
        import os
        def simulate(events, **config):
            with open("data.txt", "w") as fh:
                fh.write("rewritten")
            raise ValueError(repr((sorted(os.environ), os.getcwd())))
    """)
    refused = impl.run([], {}).refused
    assert "CBATCH_GRADER_SECRET" not in refused and "s3cret" not in refused
    assert str(tmp_path) not in refused
    assert (tmp_path / "data.txt").read_text(encoding="utf-8") == "original"
    impl.close()


def test_a_hang_kills_the_whole_process_group(tmp_path: Path) -> None:
    marker = f"600.{os.getpid()}{time.monotonic_ns() % 10**6}"  # a sleep argument no other process has
    impl = isolated(tmp_path, f"""
        import subprocess, sys, time
        def simulate(events, **config):
            subprocess.Popen(["sleep", {marker!r}])
            print("grandchild started", flush=True)
            time.sleep(600)
    """, Limits(call_seconds=5, max_failures=1))
    stopped = run_demo(impl).stopped
    assert "did not answer" in stopped and "grandchild started" in stopped, stopped
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and _running(marker):
        time.sleep(0.05)
    assert not _running(marker)
    impl.close()


def _running(argument: str) -> bool:
    """Whether a live (not zombie) process has ``argument`` on its command line."""
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as fh:
                args = fh.read().split(b"\0")
            with open(f"/proc/{entry}/stat", encoding="ascii") as fh:
                state = fh.read().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, NotADirectoryError, ProcessLookupError, PermissionError):
            continue
        if argument.encode() in args and state != "Z":
            return True
    return False


def test_remote_lifecycle_objects_behave_like_local_ones(tmp_path: Path) -> None:
    impl = isolated(tmp_path, """
        class Pool:
            def __init__(self, capacity):
                self.free = list(range(capacity))
                self.tables = {}
            def create(self, owner):
                if owner in self.tables:
                    raise ValueError(f"owner {owner!r} exists")
                self.tables[owner] = Table(owner)
                return self.tables[owner]
        class Table:
            def __init__(self, owner):
                self.owner = owner
        PagedKV = Pool
    """)
    pool = impl.namespace.PagedKV(3)
    assert pool.free == [0, 1, 2] and pool.tables == {}
    table = pool.create("a")
    assert table.owner == "a" and pool.tables == {"a": table}
    with pytest.raises(ValueError, match="owner 'a' exists"):
        pool.create("a")
    assert impl.unsupported_reason({}) and not hasattr(impl.namespace, "TransferManager")
    impl.close()
    with pytest.raises(SandboxFailure):
        pool.free


def test_an_unloadable_submission_is_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ImplementationError, match="SyntaxError"):
        isolated(tmp_path, "def simulate(:\n")
    with pytest.raises(ImplementationError, match="neither a callable 'simulate'"):
        isolated(tmp_path, "x = 1\n")


def test_load_spec_forms(tmp_path: Path) -> None:
    (tmp_path / "scheduler_sim.py").write_text("", encoding="utf-8")
    (tmp_path / "scheduler_faults.py").write_text("", encoding="utf-8")
    (tmp_path / "test_mine.py").write_text("", encoding="utf-8")
    assert load_spec_for(str(tmp_path)) == LoadSpec(str(tmp_path), ("scheduler_sim.py", "scheduler_faults.py"))
    assert load_spec_for("reference") == LoadSpec(None, (), ("pytest_cbatch.reference",))
    assert load_spec_for("pkg.mod:simulate") == LoadSpec(None, (), ("pkg.mod",), attr="simulate")
    with pytest.raises(ImplementationError, match="exec:"):
        load_spec_for("exec:./sched")
    assert os.path.basename(load_spec_for(str(tmp_path / "scheduler_sim.py")).files[0]) == "scheduler_sim.py"


def test_attribute_reads_come_in_one_reply_and_never_go_stale(tmp_path: Path, monkeypatch) -> None:
    impl = isolated(tmp_path, """
        class Page:
            __slots__ = ("owners", "tokens", "unset")
            def __init__(self):
                self.owners, self.tokens = [], 0
        class PagedKV:
            def __init__(self, capacity):
                self.free = list(range(capacity))
                self.pages = {}
                self.reads = 0
            @property
            def counted(self):
                self.reads += 1
                return self.reads
            def take(self, owner):
                page = self.free.pop(0)
                self.pages[page] = Page()
                self.pages[page].owners.append(owner)
                return page
    """)
    sent: list[str] = []
    request = impl.sandbox.request
    monkeypatch.setattr(impl.sandbox, "request", lambda message, *a: sent.append(message["op"]) or request(message, *a))
    pool = impl.namespace.PagedKV(3)
    assert pool.free == [0, 1, 2] and pool.pages == {}
    first = pool.free
    first.append(99)  # a copy: changing it changes nothing remote, nor the next read
    assert pool.free == [0, 1, 2]
    assert pool.take("a") == 0
    assert pool.free == [1, 2]  # the call made the earlier snapshot stale
    page = pool.pages[0]
    assert page.owners == ["a"] and page.tokens == 0
    with pytest.raises(AttributeError):
        page.unset
    before = len(sent)
    assert pool.counted == 1 and pool.counted == 2  # a property runs in the child on every read
    assert len(sent) == before + 2
    reads = [op for op in sent if op == "getattr"]
    # new, then one getattr for the pool (every later read of it, and of its pages, from that reply), the
    # same after take, plus the method lookup, the unset slot and the two property reads.
    assert len(reads) <= 6, sent
    impl.close()


def test_pytest_can_require_bubblewrap(pytester: pytest.Pytester, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "no-bwrap-here"))
    result = pytester.runpytest_subprocess("--cbatch-isolate", "--cbatch-sandbox=bwrap", "--cbatch-impl=reference")
    assert result.ret != 0
    result.stderr.fnmatch_lines(["*sandbox = bwrap is required, but bubblewrap (bwrap) is not installed*"])


@pytest.mark.parametrize("root", ["/opt/python", "/tmp/venv"])
def test_bubblewrap_binds_a_python_under_tmp_into_a_tmpfs_of_its_own(root: str, tmp_path: Path, monkeypatch) -> None:
    """/tmp inside is a link to the private home, unless the Python installation lives under /tmp (a virtual
    environment there): then /tmp is a tmpfs made before that installation is bound into it."""
    from pytest_cbatch.sandbox import bwrap

    monkeypatch.setattr(bwrap.shutil, "which", lambda name: "/usr/bin/bwrap")
    monkeypatch.setattr(bwrap, "_python_roots", lambda modules: [root])
    monkeypatch.setattr(bwrap.os, "geteuid", lambda: 1000)
    argv = list(bwrap.confine(str(tmp_path), str(tmp_path / "work"), True, 8, ()).prefix)
    pairs = list(zip(argv, argv[1:]))
    bind = argv.index(root)
    if root.startswith("/tmp/"):
        assert ("--tmpfs", "/tmp") in pairs and pairs.index(("--tmpfs", "/tmp")) < bind
        assert "/tmp" not in [b for a, b in pairs if a == "--symlink"] and argv.count("/tmp") == 1
    else:
        assert ("--tmpfs", "/tmp") not in pairs and argv[argv.index("/tmp") - 2] == "--symlink"
