"""The ``exec:COMMAND`` kind: any language, as a process speaking JSON on stdin and stdout.

The kit writes ``{"trace": [...], "config": {...}}`` on the command's stdin and
reads the report JSON from its stdout.  Exit 0 means a report; exit 3 means
"setting not supported" (stderr is the reason; the test is skipped); any other
non-zero exit means the input was refused (stderr is the message).  It runs in a
new process session under the time limit; on a timeout the whole session (the
command and every process it started) is killed, and so is anything it leaves
behind.  The whole protocol is ``docs/exec-protocol.md``.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
from typing import Any

from ..bounded import Bounds
from ..impls import BrokenOutput, Implementation, ImplementationError, Kind, Refused, SpecRequest, Stopped, Unsupported

__all__ = ["ExecImplementation", "KIND", "PREFIX"]

PREFIX = "exec:"


class ExecImplementation(Implementation):
    """A subprocess speaking JSON on stdin and stdout (any language; ``docs/exec-protocol.md``)."""

    UNSUPPORTED_EXIT = 3

    def __init__(self, spec: str, command: str, limits: Bounds) -> None:
        self.spec = spec
        try:
            self.argv = shlex.split(command)
        except ValueError as exc:  # an unclosed quote
            raise ImplementationError(f"exec: cannot split the command {command!r}: {exc}") from None
        if not self.argv:
            raise ImplementationError("exec: needs a command, e.g. exec:'./my-scheduler --json'")
        self.limits = limits
        self.source = f"subprocess {command!r}, " + (f"timeout {limits.seconds:g} s" if limits.seconds > 0
                                                      else "no timeout")
        self.namespace = None

    def _call(self, trace: list[dict[str, Any]], config: dict[str, Any]) -> dict[str, Any]:
        payload = json.dumps({"trace": trace, "config": config})
        seconds = self.limits.seconds
        try:
            proc = subprocess.Popen(self.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    text=True, start_new_session=True)
        except OSError as exc:
            raise Refused(f"could not start {self.argv[0]!r}: {exc}") from None
        try:
            stdout, stderr = proc.communicate(payload, timeout=seconds if seconds > 0 else None)
        except subprocess.TimeoutExpired:
            _kill_session(proc)
            raise Stopped(f"did not finish within {seconds:g} s ({self.limits.time_option}={seconds:g} changes "
                          f"the limit; 0 disables it); its process session was killed") from None
        finally:
            _kill_session(proc)  # whatever it left running in its session
        proc = subprocess.CompletedProcess(self.argv, proc.returncode, stdout, stderr)
        message = proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else "(no message on stderr)"
        if proc.returncode == self.UNSUPPORTED_EXIT:
            raise Unsupported(f"{self.spec} exited 3 (unsupported): {message}")
        if proc.returncode != 0:
            raise Refused(f"exit status {proc.returncode}: {message}")
        try:
            return json.loads(proc.stdout)
        except json.JSONDecodeError as exc:
            raise BrokenOutput(f"stdout is not JSON ({exc.msg} at line {exc.lineno}): "
                                  f"{proc.stdout[:200]!r}") from None


def _kill_session(proc: subprocess.Popen[str]) -> None:
    """SIGKILL the process session ``proc`` leads (it started one), then reap ``proc`` and close its pipes."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    if proc.returncode is None:
        try:
            proc.communicate(timeout=5)
        except (subprocess.TimeoutExpired, ValueError):
            proc.kill()
            proc.wait()


def _claims(request: SpecRequest) -> bool:
    return request.spec.startswith(PREFIX)


def _build(request: SpecRequest) -> ExecImplementation:
    return ExecImplementation(request.spec, request.spec[len(PREFIX):], request.bounds)


KIND = Kind(order=200, form="exec:COMMAND", claims=_claims, build=_build)
