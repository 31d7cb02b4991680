"""No process of a submission outlives its grading: the grader adopts every orphan and kills what is left.

A sandbox child is killed with its whole session (``Sandbox.kill``), and under bubblewrap with its whole
PID namespace.  In plain processes, a process that left the session (``setsid``) and its parent (a double
fork) is in neither, and would go on after the submission's results are written, free to rewrite them.
``adopt_orphans()`` makes the calling process a child subreaper (Linux ``PR_SET_CHILD_SUBREAPER``): such a
process becomes its child when its own parent dies, wherever it moved.  ``sweep()`` then kills every
descendant of the calling process and reaps it.  Only a process whose every child is a submission's may
sweep: a grading worker between two submissions, or ``cbatch grade --gradescope`` after its one.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import time

__all__ = ["adopt_orphans", "adopted", "descendants", "sweep"]

_PR_SET_CHILD_SUBREAPER = 36
_adopted = False


def adopt_orphans() -> bool:
    """Make this process the subreaper of its descendants; whether it is now (False off Linux)."""
    global _adopted
    if not _adopted and os.path.isdir("/proc/self"):
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
            _adopted = libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
        except (OSError, AttributeError):
            _adopted = False
    return _adopted


def adopted() -> bool:
    """Whether ``adopt_orphans`` made this process a subreaper (only then can ``sweep`` find every process)."""
    return _adopted


def descendants(pid: int | None = None) -> list[int]:
    """The live (not zombie) descendants of ``pid`` (default: this process), read from ``/proc``."""
    root = os.getpid() if pid is None else pid
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                fields = fh.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue  # gone meanwhile
        if fields and fields[0] != b"Z":
            children.setdefault(int(fields[1]), []).append(int(entry))
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), ()):
            found.append(child)
            todo.append(child)
    return found


def sweep(seconds: float = 10.0) -> int:
    """Kill every descendant of this process and reap the children among them; how many were killed.

    Passes repeat until none is left (a process forking as it dies is found on the next pass), for at most
    ``seconds``; RuntimeError when processes remain after that, so no result is written beside them.
    """
    killed: set[int] = set()
    deadline = time.monotonic() + seconds
    while True:
        _reap()
        alive = descendants()
        if not alive:
            break
        if time.monotonic() > deadline:
            raise RuntimeError(f"{len(alive)} processes of the submission could not be killed: {alive[:8]}")
        for pid in alive:
            try:
                os.kill(pid, signal.SIGKILL)
                killed.add(pid)
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(0.01)
    for pid in killed:  # dead now, each a zombie of ours until reaped: never left to an init that may not reap
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass  # reaped above, or another process's child (its parent reaps it)
    return len(killed)


def _reap() -> None:
    """Collect every child of this process that has exited (the adopted ones no one else waits for)."""
    while True:
        try:
            pid, _status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
