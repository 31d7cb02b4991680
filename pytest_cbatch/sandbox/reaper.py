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
_adopted_by = 0  # the process that is a subreaper (a fork is not: the kernel clears it, and this with the pid)


def adopt_orphans() -> bool:
    """Make this process the subreaper of its descendants; whether it is now (False off Linux)."""
    global _adopted_by
    if _adopted_by != os.getpid() and os.path.isdir("/proc/self"):
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
            if libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0:
                _adopted_by = os.getpid()
        except (OSError, AttributeError):
            pass
    return adopted()


def adopted() -> bool:
    """Whether ``adopt_orphans`` made this process a subreaper (only then can ``sweep`` find every process)."""
    return _adopted_by == os.getpid()


def descendants(pid: int | None = None, spare: frozenset[int] = frozenset(), include_zombies: bool = False
                ) -> list[int]:
    """The live descendants of ``pid`` (default: this process), read from ``/proc`` (zombies too with
    ``include_zombies``); none of ``spare`` nor of its descendants."""
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
        if fields and (include_zombies or fields[0] != b"Z"):
            children.setdefault(int(fields[1]), []).append(int(entry))
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in spare:
                found.append(child)
                todo.append(child)
    return found


def sweep(spare: frozenset[int] = frozenset(), seconds: float = 10.0) -> int:
    """Kill every descendant of this process but ``spare`` (what ran before the submission: take
    ``frozenset(descendants())`` first) and their own, reap the children among them; how many were killed.

    Passes repeat until none is left (a process forking as it dies is found on the next pass), for at most
    ``seconds``; RuntimeError when processes remain after that, so no result is written beside them.
    """
    killed: set[int] = set()
    deadline = time.monotonic() + seconds
    while True:
        _reap(spare)
        alive = descendants(spare=spare)
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
    for pid in killed - spare:  # dead now, each a zombie of ours until reaped: never left to an init that may not reap
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass  # reaped above, or another process's child (its parent reaps it)
    return len(killed)


def _reap(spare: frozenset[int]) -> None:
    """Collect the children of this process that have exited (the adopted ones no one else waits for), but
    those another part of the process waits for (``spare``)."""
    for pid in set(descendants(include_zombies=True)) - spare:
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass  # not a child of ours (a grandchild): its parent reaps it, or it is adopted and reaped later
