"""A submission that is a program (any language): ``simulate`` as one run of its command, in the sandbox child.

Standard library only: the sandbox child imports it (``child.load``) for a
submission whose manifest names a command (``grading.manifest``).  The
protocol is the kit's ``exec:`` one: the trace and config as one JSON document
on stdin; exit 0 with the report as JSON on stdout; exit 3 when a setting is
not supported (the last stderr line says which); any other exit refuses the
input.  The command runs in the submission's working copy, in the child's
process group, under the child's limits, so a call past its time limit is
killed with the whole group; whatever it leaves running in the group is killed
as soon as it exits (its answer is complete then, even if what it left holds
the pipes open).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import threading
from typing import Any

__all__ = ["Program", "ProgramOutputError", "ProgramRefused", "STDERR_HEADING", "find_command", "stderr_stack",
           "UNSUPPORTED_EXIT"]

UNSUPPORTED_EXIT = 3
_STDERR_KEPT = 64 * 1024
STDERR_HEADING = "the program's stderr (its last non-blank lines):"


def stderr_stack(stderr: bytes, lines: int = 15, width: int = 300) -> str:
    """A refusal's ``stack`` that is the program's stderr: ``STDERR_HEADING``, then its last ``lines``
    non-blank lines, each cut to ``width`` characters.  The same text as ``kinds.command.stderr_stack`` (this
    module cannot import the kit; a test keeps the two equal)."""
    text = stderr[-_STDERR_KEPT:].decode("utf-8", "replace")
    tail = [line if len(line) <= width else line[:width - 3] + "..." for line in text.splitlines() if line.strip()]
    return STDERR_HEADING + "\n" + ("\n".join(tail[-lines:]) if tail else "(no message on stderr)")


class ProgramRefused(ValueError):
    """The program exited non-zero (or was killed): it refused the run.  ``cbatch_stack`` is its stderr's
    last lines under ``STDERR_HEADING``, which the child sends as the refusal's stack (``child``)."""

    def __init__(self, message: str, stderr: bytes) -> None:
        super().__init__(message)
        self.cbatch_stack = stderr_stack(stderr)


class ProgramOutputError(Exception):
    """The program exited 0 without a JSON document on stdout (or with one past the size limit)."""

    cbatch_broken = True   # child.Server.simulate answers it as a broken output, not as a refusal


def find_command(argv0: str, folder: str, path: str) -> str | None:
    """Where ``argv0`` is, seen from the sandbox: a file of the submission (a name with a slash, relative
    to ``folder`` and inside it) or a program on ``path``; None when it is not found or not executable."""
    if "/" in argv0:
        target = os.path.realpath(os.path.join(folder, argv0))
        inside = target.startswith(os.path.realpath(folder) + os.sep)
        return target if inside and os.path.isfile(target) and os.access(target, os.X_OK) else None
    return shutil.which(argv0, path=path)


class Program:
    """``simulate(trace, **config)`` by running ``argv`` in ``folder`` (the child's working directory)."""

    def __init__(self, argv: list[str], folder: str, output_bytes: int) -> None:
        found = find_command(argv[0], folder, os.environ.get("PATH", os.defpath))
        if found is None:
            raise FileNotFoundError(f"the manifest's command {argv[0]!r} is not found in the sandbox (a file of "
                                    f"the submission, or a program on PATH={os.environ.get('PATH', '')})")
        self.argv, self.folder, self.output_bytes = argv, folder, output_bytes

    def __call__(self, trace: Any, **config: Any) -> Any:
        payload = json.dumps({"trace": trace, "config": config}).encode()
        proc = subprocess.Popen(self.argv, cwd=self.folder, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE)
        stdout, stderr = _Pipe(proc.stdout, self.output_bytes), _Pipe(proc.stderr, _STDERR_KEPT, tail=True)
        feeder = threading.Thread(target=_feed, args=(proc.stdin, payload), daemon=True)
        feeder.start()
        try:
            code = proc.wait()
        finally:
            # What it left running may hold the pipes open: the answer is complete once the program exits.
            _kill_group_but_self()
        for pipe in (stdout, stderr):
            pipe.thread.join()
        feeder.join()
        if stdout.total > self.output_bytes:
            raise ProgramOutputError(f"the program wrote {stdout.total} bytes on stdout, more than the "
                                     f"{self.output_bytes >> 20} MiB a report may take")
        text = bytes(stderr.kept).decode("utf-8", "replace").strip()
        message = text.splitlines()[-1] if text else "(no message on stderr)"
        if code == UNSUPPORTED_EXIT:
            raise NotImplementedError(f"the program exited 3 (unsupported): {message}")
        if code < 0:
            raise ProgramRefused(f"the program was killed by signal {-code}: {message}", bytes(stderr.kept))
        if code != 0:
            raise ProgramRefused(f"exit status {code}: {message}", bytes(stderr.kept))
        try:
            return json.loads(bytes(stdout.kept))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ProgramOutputError(f"stdout is not JSON ({exc}): {bytes(stdout.kept[:200])!r}") from None


class _Pipe:
    """Reads one of the program's pipes to its end in a thread, keeping its first ``limit`` bytes (a report)
    or, with ``tail``, its last (a message); ``total`` counts them all."""

    def __init__(self, stream: Any, limit: int, tail: bool = False) -> None:
        self.kept, self.total, self.limit, self.tail = bytearray(), 0, limit, tail
        self.thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self.thread.start()

    def _read(self, stream: Any) -> None:
        with stream:
            for chunk in iter(lambda: stream.read1(1 << 16), b""):
                self.total += len(chunk)
                if self.tail:
                    self.kept = (self.kept + chunk)[-self.limit:]
                else:
                    self.kept += chunk[: max(0, self.limit - len(self.kept))]


def _feed(stream: Any, payload: bytes) -> None:
    try:
        with stream:
            stream.write(payload)
    except OSError:   # it exited, or closed stdin, without reading all of it: its answer says the rest
        pass


def _kill_group_but_self() -> None:
    """SIGKILL every other process of this process group: what the program left running."""
    me, group = os.getpid(), os.getpgrp()
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        try:
            if os.getpgid(int(name)) == group:
                os.kill(int(name), signal.SIGKILL)
        except OSError:   # gone already, or not ours to see
            pass
