"""One sandboxed child process per submission, restarted after any failure.

``Sandbox.request(message, family)`` sends one RPC request and returns the
child's reply, or raises ``SandboxFailure`` saying what went wrong: a call
past its wall-clock limit, a child that died (its signal or exit status), a
flood of output, a reply that is not one JSON line, a lifecycle call after
``max_failures`` failed ones in a row or any call once ``submission_seconds``
are used up (the breaker, kind ``breaker``: not run).  A ``simulate`` call
after ``max_failures`` failed ones in a row still runs, at the short limit
(``breaker.short_seconds``), until one succeeds; every byte of a
reply passes ``protocol.ReplyReader`` first.  The child runs in a
fresh temporary working directory holding a copy of the submission, with a
scrubbed environment, its own session (killed as a whole), and rlimits it
applies to itself before importing anything of the submission; in ``bwrap``
mode it also runs inside bubblewrap (see ``bwrap``).  ``Sandbox._command`` is
the one place the child's command line is built.
"""

from __future__ import annotations

import fcntl
import json
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from typing import Any

from .. import untrusted
from ..bounded import CallTimedOut
from ..breaker import short_seconds
from .bwrap import Confinement, confine, kit_folders, resolve_mode
from .files import SubmissionRefused, copy_submission
from .guard import KitGuard
from .limits import Deadline, Limits, child_environment
from .protocol import ReplyReader, SandboxFailure, encode_line

__all__ = ["CHILD_MODULE", "LoadSpec", "NotContained", "Sandbox", "SandboxFailure", "SandboxTimeout"]

CHILD_MODULE = "pytest_cbatch.sandbox.child"
_PIPE_BYTES = 1 << 20  # the child's reply pipe (Linux allows this much by default)
_OUTPUT_KEPT = 4096  # bytes of the child's output kept for messages
_SIGNALS = {
    signal.SIGXCPU: "exceeded its CPU-time limit",
    signal.SIGXFSZ: "wrote a file past the file-size limit",
    signal.SIGKILL: "was killed (SIGKILL)",
    signal.SIGSEGV: "crashed (SIGSEGV)",
    signal.SIGABRT: "aborted (SIGABRT)",
}


class NotContained(UserWarning):
    """Warned once per process when ``auto`` mode finds no working bubblewrap (see ``bwrap.not_contained_notice``)."""


_warned: list[str] = []


def _announce(notice: str) -> None:
    if not _warned:
        _warned.append(notice)
        warnings.warn(notice, NotContained, stacklevel=3)


class SandboxTimeout(SandboxFailure, CallTimedOut):
    """A call past its wall-clock limit (kind ``timeout``): the child was killed, the call is over."""


@dataclass(frozen=True)
class LoadSpec:
    """What the child imports: files from a copied folder, or module names from the environment."""

    folder: str | None = None          # a folder (or one file) copied into the working directory
    files: tuple[str, ...] = ()        # file names inside ``folder``, imported in this order
    modules: tuple[str, ...] = ()      # importable module names
    attr: str | None = None            # attribute path on the first module
    command: tuple[str, ...] = ()      # a program's argv instead (its manifest's exec; see ``program``)
    unsupported: tuple[str, ...] = ()  # settings its manifest declares it does not support (``support``)


@dataclass
class _Output:
    """The child's stdout and stderr: the first bytes kept, the rest only counted."""

    kept: bytearray = field(default_factory=bytearray)
    total: int = 0

    def add(self, data: bytes) -> None:
        self.total += len(data)
        room = _OUTPUT_KEPT - len(self.kept)
        if room > 0:
            self.kept += data[:room]

    def tail_note(self) -> str:
        if not self.total:
            return ""
        text = untrusted.text(self.kept.decode("utf-8", "replace").strip(), None)  # its bytes: shown escaped
        more = f" (first {len(self.kept)} of {self.total} bytes)" if self.total > len(self.kept) else ""
        return f"\n  its output{more}:\n    " + "\n    ".join(text.splitlines()[-12:])


class Sandbox:
    """A restartable child process running one submission; see the module docstring."""

    def __init__(self, load: LoadSpec, limits: Limits, label: str = "submission", mode: str = "auto",
                 runtimes: tuple[str, ...] = (), guard: KitGuard | None = None,
                 deadline: Deadline | None = None) -> None:
        """``mode``: ``auto``, ``bwrap`` or ``process`` (see ``bwrap.resolve_mode``; ValueError if bwrap is
        required and cannot run); ``self.mode`` is the one in use.  ``runtimes``: folders of language
        runtimes the child may use besides ``/usr`` (bound read-only; their ``bin`` first on its PATH).
        ``guard``: watch the submission's uses of the kit's code, reported into ``guard.found`` (see
        ``guard``); None for no watch.  ``deadline``: the submission's clock when several children and the
        grader's own work share ``submission_seconds`` (``Deadline``); without one, only this child's calls
        count."""
        self.load = load
        self.guard = guard
        self.deadline = deadline
        self.limits = limits
        self.label = label
        self.runtimes = runtimes
        self.mode, notice = resolve_mode(mode)
        if notice:
            _announce(notice)
        self.generation = 0          # bumped on every start, so stale handles are recognised
        self.description: dict[str, Any] | None = None
        self.seconds_used = 0.0
        self.left_out: list[str] = []  # what the copy left out (links, FIFOs, ...): see ``files``
        self._stack = ""  # the child's last ``{"stack": ...}`` line of the current request
        self._failures: dict[str, list[str]] = {}
        self._proc: subprocess.Popen[bytes] | None = None
        self._dir: str | None = None
        self._rpc_out = self._rpc_in = -1
        self._output = _Output()
        self._replies = self._reader()  # replies read, not yet returned
        self._selector: selectors.BaseSelector | None = None

    # ----------------------------------------------------------- lifecycle

    def describe(self) -> dict[str, Any]:
        """Start the child if needed and return what it found (``parts``, ``sources``, ``simulate``)."""
        if self._proc is None:
            self._start()
        assert self.description is not None
        return self.description

    def _start(self) -> None:
        self.close()
        self.generation += 1
        self._dir = tempfile.mkdtemp(prefix="cbatch-sandbox-")
        work, home = os.path.join(self._dir, "work"), os.path.join(self._dir, "home")
        os.mkdir(home)
        if self.load.folder:
            try:
                self.left_out = copy_submission(self.load.folder, work, self.load.files)
            except SubmissionRefused as exc:
                raise SandboxFailure("load", f"the {self.label} is refused: {exc}") from None
        else:
            os.mkdir(work)
        p2c_r, p2c_w = os.pipe()
        c2p_r, c2p_w = os.pipe()
        _widen(c2p_r)
        try:
            argv, preexec, cwd, env = self._command(work, home, {"rpc_in": p2c_r, "rpc_out": c2p_w})
            self._proc = subprocess.Popen(
                argv, cwd=cwd, env=env, preexec_fn=preexec,
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                pass_fds=(p2c_r, c2p_w), start_new_session=True,
            )
        except OSError as exc:
            os.close(p2c_w)
            os.close(c2p_r)
            raise SandboxFailure("load", f"cannot start the sandbox of the {self.label} ({self.mode}): {exc}") from None
        finally:
            os.close(p2c_r)
            os.close(c2p_w)
        self._rpc_out, self._rpc_in = p2c_w, c2p_r
        os.set_blocking(self._rpc_out, False)
        self._output = _Output()
        self._replies = self._reader()
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._rpc_in, selectors.EVENT_READ, "rpc")
        self._selector.register(self._proc.stdout, selectors.EVENT_READ, "output")
        try:
            reply = self._exchange(None, max(0.0, self.limits.import_seconds - self.limits.call_seconds))
        except SandboxTimeout as exc:
            limit = max(self.limits.import_seconds, self.limits.call_seconds)
            raise SandboxTimeout("timeout", f"importing the {self.label} did not finish within {limit:g} s "
                                            f"(limit import_seconds){self._output.tail_note()}") from exc
        if "load_failed" in reply:
            self.kill()
            raise SandboxFailure("load", f"importing the {self.label} failed: {untrusted.text(reply['load_failed'])}\n"
                                         f"{untrusted.text(reply.get('traceback', ''), 4000)}".rstrip())
        self.description = reply.get("ok")
        if not isinstance(self.description, dict):
            self.kill()
            raise SandboxFailure("garbage", f"the start-up reply of the {self.label} is not a description: {reply!r:.200}")

    def _command(self, work: str, home: str, fds: dict[str, int]
                 ) -> tuple[list[str], Any, str, dict[str, str]]:
        """``(argv, preexec_fn, cwd, env)`` of the child: ``python -I -m CHILD_MODULE CONFIG``, in bubblewrap
        or not."""
        confinement: Confinement | None = None
        if self.mode == "bwrap":
            assert self._dir is not None
            copied = sum(os.path.getsize(os.path.join(r, f)) for r, _d, fs in os.walk(work) for f in fs
                         if not os.path.islink(os.path.join(r, f)))
            tmpfs_mb = 4 * self.limits.file_mb + (copied >> 20) + 1
            reference = self.guard is None or not self.guard.refuse
            confinement = confine(self._dir, work, bool(self.load.folder), tmpfs_mb, self.load.modules,
                                  self.runtimes, reference)
            work, home = confinement.work, confinement.home
        config = {
            **fds, "limits": self.limits.rlimits(), "home": home,
            "copy_from": confinement.copy_from if confinement else None,
            "load": {"folder": work if self.load.folder else None,
                     "files": [os.path.join(work, f) for f in self.load.files],
                     "modules": list(self.load.modules), "attr": self.load.attr,
                     "command": list(self.load.command), "output_bytes": self.limits.reply_mb << 20},
            "guard": self.guard.config(kit_folders()) if self.guard is not None else None,
            "stack_after": _stack_after(self.limits.call_seconds),
        }
        argv = [sys.executable, "-I", "-m", CHILD_MODULE, json.dumps(config)]
        env = child_environment(home, self.runtimes)
        if confinement is None:
            return argv, None, work, env
        return [*confinement.prefix, *argv], confinement.preexec, "/", env

    def alive(self) -> bool:
        """Whether the child is running (its objects still exist)."""
        return self._proc is not None

    def kill(self) -> None:
        """Kill the child's whole session and reap it; the next request starts a fresh child."""
        proc, self._proc = self._proc, None
        if self._selector is not None:
            self._selector.close()
            self._selector = None
        if proc is not None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()
        for fd in (self._rpc_out, self._rpc_in):
            if fd >= 0:
                os.close(fd)
        self._rpc_out = self._rpc_in = -1

    def close(self) -> None:
        """Kill the child and delete its working directory."""
        self.kill()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def tally(self) -> tuple[float, dict[str, list[str]]]:
        """What the limits have counted so far: seconds of calls, and each family's recent failures."""
        return self.seconds_used, {family: list(failed) for family, failed in self._failures.items()}

    def rewind(self, tally: tuple[float, dict[str, list[str]]]) -> None:
        """Forget what the limits counted since ``tally``: the calls since then were a try of the kit's
        that it makes again another way (see ``search.lifecycle_verdicts_of``)."""
        self.seconds_used = tally[0]
        self._failures = {family: list(failed) for family, failed in tally[1].items()}

    # ------------------------------------------------------------- requests

    def request(self, message: dict[str, Any], family: str, generation: int | None = None,
                extra_seconds: float = 0.0) -> dict[str, Any]:
        """Send ``message``; return the reply dict or raise SandboxFailure (the child is then restarted lazily).

        ``generation``: the message names objects of that child, so it fails when that child is gone.
        ``extra_seconds``: added to the call limit for the first reply line (work of the kit's, not of
        the submission's, comes before it).
        """
        self._admit(family, generation)
        return self._reply(family, encode_line(message), extra_seconds)

    def call_limit(self, family: str) -> tuple[float, str]:
        """The next ``family`` call's limit in seconds, and why it is short ("" when it is not): after
        ``max_failures`` failed simulate calls in a row, the next run at ``breaker.short_seconds``."""
        full, recent = self.limits.call_seconds, self._failures.get(family, [])
        if family != "simulate" or len(recent) < self.limits.max_failures or short_seconds(full) >= full:
            return full, ""
        return short_seconds(full), (f" (the short limit of {short_seconds(full):g} s instead of {full:g} s: its "
                                     f"last {len(recent)} calls in a row failed; a call that succeeds restores the "
                                     f"full limit; limit max_failures sets how many)")

    def receive(self, family: str, generation: int) -> dict[str, Any]:
        """The next line of a reply that spans several (a searched lifecycle part), like ``request``."""
        if self._replies and self._proc is not None and generation == self.generation:
            return self._replies.pop()  # already read: nothing to wait for or account
        self._admit(family, generation)
        return self._reply(family, None)

    def _admit(self, family: str, generation: int | None) -> None:
        """Raise SandboxFailure if a request of ``family`` naming objects of ``generation`` cannot be made now."""
        if generation is not None and (self._proc is None or generation != self.generation):
            raise SandboxFailure("died", f"the objects of the {self.label} are gone: its process was restarted after "
                                         f"an earlier failure")
        recent = self._failures.get(family, [])
        if family != "simulate" and len(recent) >= self.limits.max_failures:
            raise SandboxFailure("breaker", f"not run: the last {len(recent)} {family} calls of the {self.label} all "
                                            f"failed (the last: {recent[-1]})")
        if self.seconds_used >= self.limits.submission_seconds:
            raise SandboxFailure("breaker", f"not run: the {self.label} used up its "
                                            f"{self.limits.submission_seconds:g} s of calls (limit submission_seconds)")
        if self.deadline is not None and self.deadline.passed():
            raise SandboxFailure("breaker", f"not run: the {self.label} used up its {self.deadline.seconds:g} s "
                                            f"(limit submission_seconds: its calls and the grader's work on what "
                                            f"they returned, all its workloads together)")

    def _reply(self, family: str, payload: bytes | None, extra_seconds: float = 0.0) -> dict[str, Any]:
        try:
            if self._proc is None:
                self._start()
            reply = self._exchange(payload, extra_seconds, self.call_limit(family))
        except SandboxFailure as exc:
            self._failures.setdefault(family, []).append(str(exc).splitlines()[0])
            self.kill()
            raise
        self._failures.pop(family, None)
        if "exited" in reply:  # the child survived a SystemExit, but its state is suspect
            self.kill()
        return reply

    def _exchange(self, payload: bytes | None, extra_seconds: float = 0.0,
                  limit: tuple[float, str] | None = None) -> dict[str, Any]:
        """Write ``payload`` (unless None) and read one reply line, draining output, within the call limit
        (``limit``: its seconds and why they are short, see ``call_limit``; default the full limit)."""
        assert self._proc is not None and self._proc.stdout is not None
        seconds, short = limit or (self.limits.call_seconds, "")
        start = time.monotonic()
        deadline = start + seconds + extra_seconds
        output_limit = self.limits.output_kb * 1024
        pending = memoryview(payload or b"")
        if payload is not None:
            self._stack = ""
        sel = self._selector
        assert sel is not None
        if pending:  # a request usually fits the pipe at once: write it now, wait for room only if not
            try:
                pending = pending[os.write(self._rpc_out, pending):]
            except BlockingIOError:
                pass
            except BrokenPipeError:
                raise self._died() from None
        if pending:
            sel.register(self._rpc_out, selectors.EVENT_WRITE, "write")
        try:
            while True:
                if self._replies:
                    return self._replies.pop()
                left = deadline - time.monotonic()
                if left <= 0:
                    raise SandboxTimeout("timeout", f"the {self.label} did not answer within "
                                                    f"{seconds:g} s "
                                                    f"({self.limits.term('call_seconds')}){short}"
                                         + self._output.tail_note(), self._stack)
                for key, _ in sel.select(left):
                    if key.data == "write":
                        try:
                            sent = os.write(self._rpc_out, pending)
                        except BrokenPipeError:
                            raise self._died() from None
                        pending = pending[sent:]
                        if not pending:
                            sel.unregister(self._rpc_out)
                    elif key.data == "output":
                        data = os.read(self._proc.stdout.fileno(), 65536)
                        if not data:
                            sel.unregister(self._proc.stdout)
                        self._output.add(data)
                        if self._output.total > output_limit:
                            raise SandboxFailure("flood", f"the {self.label} printed more than "
                                                          f"{self.limits.output_kb} KiB (limit output_kb); killed"
                                                 + self._output.tail_note())
                    else:
                        data = os.read(self._rpc_in, 1 << 20)
                        if not data:
                            raise self._died()
                        self._replies.feed(data)
        finally:
            if pending and self._rpc_out in sel.get_map():
                sel.unregister(self._rpc_out)
            self.seconds_used += time.monotonic() - start

    def _reader(self) -> ReplyReader:
        return ReplyReader(self.label, self.limits.reply_mb << 20, self.limits.term("reply_mb"), self._aside)

    def _aside(self, line: dict[str, Any]) -> bool:
        """Take a line of the child's that is no reply: the guard's report of a use of the kit, or where the
        call is (should it reach its limit).  Whether ``line`` was one."""
        if len(line) != 1:
            return False
        if "kit" in line:
            if self.guard is not None:
                self.guard.take(line["kit"])
            return True
        if "stack" in line:
            self._stack = line["stack"][-4000:] if isinstance(line["stack"], str) else ""
            return True
        return False

    def _died(self) -> SandboxFailure:
        assert self._proc is not None
        try:
            # It is exiting: a loaded machine may take seconds to get there, and its status says what happened.
            code = self._proc.wait(timeout=min(10.0, self.limits.call_seconds))
        except subprocess.TimeoutExpired:
            return SandboxFailure("died", f"the {self.label} closed its RPC channel" + self._output.tail_note())
        if self.mode == "bwrap" and code > 128:  # bubblewrap reports a child killed by signal N as 128 + N
            code = 128 - code
        if code < 0:
            try:
                what = _SIGNALS.get(signal.Signals(-code), f"was killed by {signal.Signals(-code).name}")
            except ValueError:
                what = f"was killed by signal {-code}"
        else:
            what = f"exited with status {code} (sys.exit or os._exit)"
        return SandboxFailure("died", f"the {self.label} {what}" + self._output.tail_note())


def _stack_after(call_seconds: float) -> float:
    """When the child sends its stack during a call: late in the call, early enough to arrive before the limit."""
    return max(call_seconds * 0.8, call_seconds - 2.0)


def _widen(fd: int) -> None:
    """Give the child's reply pipe room for a search's lines to stream ahead (Linux; elsewhere nothing)."""
    try:
        fcntl.fcntl(fd, getattr(fcntl, "F_SETPIPE_SZ"), _PIPE_BYTES)
    except (AttributeError, OSError):  # another system, or a lower pipe-max-size: the default size works
        pass
