"""Hostile submissions (examples/grading/make_samples.py HOSTILE) against the bubblewrap sandbox.

Each hostile sample answers correctly but first tries one attack on the
grader and raises whatever it got hold of.  Under plain process isolation the
attacks work (the control tests show it, so these tests can fail); inside
bubblewrap each finds nothing: full marks, nothing of the grader in its
results.json, no connection, no file written, no fork past the limit.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from grading_samples import EXAMPLE_DIR, HOSTILE, make_hostile, make_samples

from pytest_cbatch.runner import ALL_CLAUSES
from pytest_cbatch.sandbox import IsolatedImplementation, Limits, bwrap_problem, load_spec_for
from pytest_cbatch.workloads import WORKLOADS

PROCESSES = 32
FULL = len(ALL_CLAUSES)  # the rubric below: 1 point per test
# The scheduler part only: each attack runs in simulate, and the lifecycle searches of the same folders
# would add seconds of bubblewrap children and no attack.
RUBRIC = f"""
[grading]
generated_examples = 0
parts = ["scheduler"]
sandbox = "bwrap"
[limits]
call_seconds = 120
processes = {PROCESSES}
max_failures = 2
[tests]
"contract.*" = {{ points = 1 }}
"""
needs_bwrap = pytest.mark.skipif(bwrap_problem() is not None, reason=f"no working bubblewrap: {bwrap_problem()}")


class _Listener:
    """A TCP server on 127.0.0.1 that records every connection it accepts, until stopped."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.received: list[bytes] = []
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self.stopped.is_set():
            try:
                conn, _ = self.sock.accept()
            except socket.timeout:
                continue
            with conn:
                conn.settimeout(5)
                try:
                    self.received.append(conn.recv(256) or b"<connected>")
                except OSError:
                    self.received.append(b"<connected>")

    def stop(self) -> None:
        self.stopped.set()
        self.thread.join(timeout=10)
        self.sock.close()


@pytest.fixture(scope="module")
def arena(tmp_path_factory: pytest.TempPathFactory):
    """Submissions (two honest, every hostile one), hidden traces and the targets they aim at."""
    root = tmp_path_factory.mktemp("hostile")
    hidden = root / "hidden"
    shutil.copytree(EXAMPLE_DIR / "hidden", hidden)
    outside = root / "outside"
    outside.mkdir()
    outside.chmod(0o777)  # writable by anyone: only the sandbox's mount namespace keeps a write out
    subs = root / "submissions"
    make_samples(subs, only=("correct", "buggy_ttft"))
    listener = _Listener()
    targets = {
        "port": listener.port,
        "read": [str(hidden), str(subs / "correct"), str(EXAMPLE_DIR / "hidden")],
        "write": [str(outside / "pwned.txt"), str(subs / "correct" / "pwned.py"),
                  str(subs / "writes_outside" / "pwned.txt")],
        "fork_cap": 4 * PROCESSES,
    }
    make_hostile(subs, targets)
    yield root, targets, listener
    listener.stop()


def _run_demo(folder: Path, mode: str):
    """One run of the demo workload by the submission in ``folder``, in the sandbox mode ``mode``."""
    impl = IsolatedImplementation(folder.name, load_spec_for(str(folder)),
                                  Limits(call_seconds=120, processes=PROCESSES), mode=mode)
    try:
        return impl.run(list(WORKLOADS["demo"].trace), WORKLOADS["demo"].config)
    finally:
        impl.close()


def _leak(outcome) -> str:
    return outcome.refused or outcome.broken or ""


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_without_bubblewrap_the_attack_works(arena, name: str) -> None:
    """The control: plain process isolation contains none of these (the fork bomb only for a root grader)."""
    root, targets, listener = arena
    if name == "fork_bomb" and os.geteuid() != 0:
        pytest.skip("RLIMIT_NPROC binds a non-root grader even without bubblewrap")
    before = len(listener.received)
    outcome = _run_demo(root / "submissions" / name, "process")
    assert outcome.report is None and "LEAKED" in _leak(outcome), outcome
    if name == "phones_home":  # the listener thread records the connection on its own time: wait for it
        deadline = time.monotonic() + 60
        while len(listener.received) <= before and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(listener.received) > before
    for path in targets["write"]:
        Path(path).unlink(missing_ok=True)


@needs_bwrap
@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_inside_bubblewrap_the_attack_finds_nothing(arena, name: str) -> None:
    root, targets, listener = arena
    before = len(listener.received)
    outcome = _run_demo(root / "submissions" / name, "bwrap")
    assert outcome.report is not None, _leak(outcome)
    assert len(listener.received) == before
    assert not any(Path(path).exists() for path in targets["write"])


@pytest.fixture(scope="module")
def graded(arena):
    """``cbatch grade`` of every submission, as its own process with a secret in its environment."""
    root, _targets, _listener = arena
    if bwrap_problem() is not None:
        pytest.skip(f"no working bubblewrap: {bwrap_problem()}")
    rubric = root / "rubric.toml"
    rubric.write_text(RUBRIC, encoding="utf-8")
    token = secrets.token_hex(16)
    env = {**os.environ, "CBATCH_GRADER_TOKEN": token}
    argv = [sys.executable, "-m", "pytest_cbatch.cli", "grade", str(root / "submissions"), "--out", str(root / "out"),
            "--rubric", str(rubric), "--traces", str(root / "hidden"), "--jobs", "2", "--quiet"]
    connections = len(_listener.received)
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, done.stdout + done.stderr
    return root / "out", token, connections


def _results(out: Path, name: str) -> tuple[dict, str]:
    text = (out / name / "results.json").read_text(encoding="utf-8")
    return json.loads(text), text


def test_graded_in_bubblewrap_every_hostile_sample_scores_full_and_leaks_nothing(arena, graded) -> None:
    root, targets, listener = arena
    out, token, connections = graded
    hidden_lines = [line for p in (root / "hidden").glob("*.jsonl")
                    for line in p.read_text(encoding="utf-8").splitlines() if line.strip()]
    for name in HOSTILE:
        doc, text = _results(out, name)
        assert "LEAKED" not in text, (name, text[:2000])
        assert token not in text and "--traces" not in text, name
        assert not any(line in text for line in hidden_lines), name
        assert "crowded_cancels" not in text, name
        assert doc["score"] == FULL and doc["extra_data"]["cbatch"]["max_score"] == FULL, (name, doc["output"])
        assert "contained by bubblewrap" in doc["output"]
    assert listener.received[connections:] == []
    assert not any(Path(path).exists() for path in targets["write"])


def test_graded_beside_hostile_samples_the_honest_scores_are_unchanged(graded) -> None:
    out, _token, _connections = graded
    correct, _ = _results(out, "correct")
    buggy, _ = _results(out, "buggy_ttft")
    assert correct["score"] == FULL
    failed = {t["name"] for t in buggy["tests"] if t["score"] < t["max_score"]}
    assert failed == {"contract.ttft_null_on_cancel"} and buggy["score"] == FULL - 1
