"""A submission that is a program (any language): ``simulate`` as one run of its command, in the sandbox child.

Standard library only: the sandbox child imports it (``child.load``) for a
submission whose manifest names a command (``grading.manifest``).  The
protocol is the kit's ``exec:`` one: the trace and config as one JSON document
on stdin; exit 0 with the report as JSON on stdout; exit 3 when a setting is
not supported (the last stderr line says which); any other exit refuses the
input.  The command runs in the submission's working copy, in the child's
process group, under the child's limits, so a call past its time limit is
killed with the whole group; whatever it leaves running in the group when it
answers is killed before the next call.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
from typing import Any

__all__ = ["Program", "ProgramOutputError", "find_command", "UNSUPPORTED_EXIT"]

UNSUPPORTED_EXIT = 3
_STDERR_KEPT = 4096


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
        try:
            stdout, stderr = proc.communicate(payload)
        finally:
            _kill_group_but_self()
        if len(stdout) > self.output_bytes:
            raise ProgramOutputError(f"the program wrote {len(stdout)} bytes on stdout, more than the "
                                     f"{self.output_bytes >> 20} MiB a report may take")
        text = stderr[-_STDERR_KEPT:].decode("utf-8", "replace").strip()
        message = text.splitlines()[-1] if text else "(no message on stderr)"
        code = proc.returncode
        if code == UNSUPPORTED_EXIT:
            raise NotImplementedError(f"the program exited 3 (unsupported): {message}")
        if code < 0:
            raise ValueError(f"the program was killed by signal {-code}: {message}")
        if code != 0:
            raise ValueError(f"exit status {code}: {message}")
        try:
            return json.loads(stdout)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ProgramOutputError(f"stdout is not JSON ({exc}): {stdout[:200]!r}") from None


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
