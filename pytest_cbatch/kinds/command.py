"""The ``exec:COMMAND`` kind: any language, as a process speaking JSON on stdin and stdout.

The kit writes ``{"trace": [...], "config": {...}}`` on the command's stdin and
reads the report JSON from its stdout.  Exit 0 means a report; exit 3 declines
the workload as not supported (stderr is the reason): settled by the kit's
probe with the same settings (``impls.Implementation.run``): the workload is
skipped when the probe is declined too, else it fails ``completes``; any other
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
from ..plain import NotPlain, loads

__all__ = ["ExecImplementation", "KIND", "PREFIX", "STDERR_HEADING", "exec_report", "stderr_stack", "stderr_tail"]

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
        payload = json.dumps({"trace": trace, "config": config}).encode("utf-8")
        seconds, short = self._time_limit(self.limits.seconds)
        try:
            proc = subprocess.Popen(self.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    start_new_session=True)
        except OSError as exc:
            raise Refused(f"could not start {self.argv[0]!r}: {exc}") from None
        try:
            stdout, stderr = proc.communicate(payload, timeout=seconds if seconds > 0 else None)
        except subprocess.TimeoutExpired:
            _kill_session(proc)
            raise Stopped(f"did not finish within {seconds:g} s ({self.limits.time_option}={self.limits.seconds:g} "
                          f"changes the limit; 0 disables it){short}; its process session was killed") from None
        finally:
            _kill_session(proc)  # whatever it left running in its session
        return exec_report(self.spec, proc.returncode, stdout, stderr)


STDERR_LINES = 15
"""How many of an ``exec:`` program's last stderr lines a failure shows (a crash's traceback, not only the
last line, which for Node is its version banner)."""
STDERR_HEADING = "the program's stderr (its last non-blank lines):"
"""The first line of a refusal's ``stack`` that is a program's stderr, not a Python traceback: failure texts
show it as the title of what follows (``explain.stack_lines``).  ``sandbox.program`` holds the same line."""


def stderr_tail(stderr: bytes, lines: int = STDERR_LINES, width: int = 300) -> str:
    """The last ``lines`` non-blank lines of a program's stderr, each cut to ``width`` characters, bytes
    that are not UTF-8 replaced; "(no message on stderr)" when there is none."""
    text = stderr[-64 * 1024:].decode("utf-8", "replace")
    tail = [line if len(line) <= width else line[:width - 3] + "..." for line in text.splitlines() if line.strip()]
    return "\n".join(tail[-lines:]) if tail else "(no message on stderr)"


def stderr_stack(stderr: bytes) -> str:
    """A refusal's ``stack`` that is the program's stderr: ``STDERR_HEADING``, then its last lines."""
    return f"{STDERR_HEADING}\n{stderr_tail(stderr)}"


def exec_report(spec: str, returncode: int, stdout: bytes, stderr: bytes) -> Any:
    """The report an ``exec:`` program's exit status and output amount to, or the exception that says why
    there is none (Unsupported for exit 3, Refused for another non-zero exit, BrokenOutput for stdout
    that is not JSON); the document is plain data (``plain.loads``)."""
    if returncode == ExecImplementation.UNSUPPORTED_EXIT:
        raise Unsupported(f"{spec} exited 3 (unsupported): {stderr_tail(stderr, 1)}")
    if returncode != 0:
        raise Refused(f"exit status {returncode}: {stderr_tail(stderr, 1)}", stderr_stack(stderr))
    try:
        return loads(stdout)
    except NotPlain as exc:
        what = f"holds at {exc.path} {exc.problem}" if exc.path else f"is {exc.problem}"
        raise BrokenOutput(f"stdout {what}: {stdout[:200]!r}") from None


def _kill_session(proc: subprocess.Popen[bytes]) -> None:
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
