"""Bounded calls into an implementation: a time limit and a memory limit, in process.

``call(fn, *args, bounds=Bounds(...))`` runs ``fn`` on the calling thread, as
any call, while one shared watchdog thread looks at it every ``POLL_SECONDS``.
When the call has run past ``bounds.seconds``, or the process's resident
memory has grown by more than ``bounds.memory_mib`` MiB over what it was when
the call began, the watchdog

1. captures the calling thread's stack at that moment (``sys._current_frames``):
   the implementation's own frames, file and line, for the failure message;
2. interrupts the thread with ``CallStopped``: on the main thread by sending it
   SIGALRM (``signal.pthread_kill``), whose handler raises, so ``time.sleep``
   and blocking system calls are interrupted too; on any other thread with
   ``PyThreadState_SetAsyncExc`` (taken at the next bytecode);
3. repeats the interruption every ``RESEND_SECONDS`` while the call goes on
   (code that catches it and carries on is interrupted again), and returning
   normally after a stop still raises ``CallStopped``.

``CallStopped`` derives from ``BaseException``, like ``KeyboardInterrupt``:
an implementation's ``except Exception`` does not swallow it, and Hypothesis
does not treat it as a failure to shrink, so a generated test whose
implementation hangs ends at the first stop instead of spending
(examples + shrink steps) x limit.

Why the calling thread, not a worker thread or a child process: the call sees
the very objects it was given (lifecycle objects live across calls, and
mutation of the input is judged), costs nothing extra, and the traceback of a
crash is the ordinary one.  Per call the cost is a dictionary entry and an
uncontended lock (a few microseconds); the watchdog sleeps while no call runs.

Memory is the process's resident set size (``/proc/self/statm``; elsewhere the
peak RSS from ``getrusage``), sampled every poll: an allocation loop is
stopped within about one poll of crossing the limit, so it overshoots by what
it allocates in ``POLL_SECONDS``.  The growth is measured from the RSS sampled
as the call begins (not the watchdog's latest sample, which may be the peak of
a call stopped a moment ago, whose memory has been given back since).

Last resort, for code that ignores the interruption (a C extension that holds
the GIL in a loop, a blocking call that is restarted, code that swallows
``BaseException`` in a loop): ``GRACE_SECONDS`` after the first stop was sent
the watchdog writes the reason and the stack to the terminal and ends the
process (exit status ``EXIT_STATUS``); when the watchdog itself cannot run
(the GIL is never released), ``faulthandler`` ends the process
``seconds + GRACE_SECONDS`` after its last heartbeat, printing every thread's
stack.  Run such code with ``--cbatch-isolate`` (a child process that is
killed instead).  ``bounds.seconds == 0`` disables the time limit (and the
last resort), ``bounds.memory_mib == 0`` the memory limit.
"""

from __future__ import annotations

import _signal  # getsignal without the enum conversion of signal.getsignal: this runs on every call
import faulthandler
import math
import os
import signal
import sys
import threading
import time
import traceback
from dataclasses import dataclass, replace
from types import CodeType, FrameType, TracebackType
from typing import Any, Callable, Iterable, TypeVar

__all__ = ["Bounds", "CallStopped", "CallTimedOut", "DEFAULT_MEMORY_MIB", "DEFAULT_SECONDS", "bounded_machine", "call",
           "configure_last_resort", "crash_traceback", "implementation_frames", "last_stop", "parse_limit", "span"]

DEFAULT_SECONDS = 60.0
"""Default time limit of one call (one ``simulate`` run, one lifecycle example)."""

DEFAULT_MEMORY_MIB = 1024
"""Default limit on how much one call may grow the process's resident memory, in MiB: a runaway's whole
run stays under 2 GiB (a stopped call's memory is given back); an engine that needs more declares it
(``CBATCH_LIMITS``)."""

POLL_SECONDS = 0.05
RESEND_SECONDS = 0.25
GRACE_SECONDS = 10.0
IDLE_SECONDS = 2.0
EXIT_STATUS = 70

_T = TypeVar("_T")
_KIT_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


def parse_limit(value: Any, option: str, unit: str) -> float:
    """A limit the user typed (``--timeout``, ``cbatch_memory``, ...) as seconds or MiB; 0 means no limit.

    ValueError, naming ``option``, for anything but a finite number >= 0: ``nan`` compares false with
    every bound and ``inf`` never fires, so either would silently turn the limit off, as would a
    negative one; "no limit" is said with 0 only.
    """
    try:
        number = float(value) if not isinstance(value, bool) else math.nan
    except (TypeError, ValueError):
        number = math.nan
    if not math.isfinite(number) or number < 0:
        raise ValueError(f"{option} must be 0 (no limit) or a positive, finite number of {unit}, got {value!r}")
    return number


@dataclass(frozen=True)
class Bounds:
    """Limits of one call, and how messages name the options that set them.

    ``seconds`` (wall clock) and ``memory_mib`` (growth of the resident set
    over the call's start); 0 disables either.  ``time_option`` and
    ``memory_option`` are what the user types to change them in the front end
    in use (``--cbatch-timeout`` under pytest, ``--timeout`` for ``cbatch check``).
    ``defaults`` names the limits the user left at their default: an
    implementation may declare its own for those (``declared``).
    """

    seconds: float = DEFAULT_SECONDS
    memory_mib: float = DEFAULT_MEMORY_MIB
    time_option: str = "--cbatch-timeout"
    memory_option: str = "--cbatch-memory"
    defaults: frozenset[str] = frozenset({"seconds", "memory_mib"})

    def declared(self, limits: Any) -> "Bounds":
        """These bounds with an implementation's declared ``CBATCH_LIMITS`` (a mapping with ``seconds`` and/or
        ``memory_mib``, e.g. an engine whose first call starts it) applied to the limits left at default."""
        if type(limits) is not dict:  # declared by the implementation: plain data only (see plain.py)
            return self
        chosen = {k: float(v) for k, v in limits.items() if k in self.defaults and type(v) in (int, float)
                  and 0 <= v < 1e12}
        return replace(self, **chosen) if chosen else self

    @property
    def active(self) -> bool:
        return self.seconds > 0 or self.memory_mib > 0

    def describe(self) -> str:
        time_part = f"{self.seconds:g} s per call" if self.seconds > 0 else "no time limit"
        memory_part = f"{self.memory_mib:g} MiB of memory growth" if self.memory_mib > 0 else "no memory limit"
        return f"{time_part}, {memory_part}"


class CallStopped(BaseException):
    """The watchdog stopped a call: ``reason`` is ``"time"`` or ``"memory"``, ``message`` says what happened
    and which option changes the limit, ``stack`` is the implementation's stack when it was stopped,
    ``script`` (state machines) the operations of the example so far."""

    def __init__(self, message: str = "", *, reason: str = "", stack: str = "") -> None:
        super().__init__(message)
        self.message, self.reason, self.stack = message, reason, stack
        self.script = ""

    def __str__(self) -> str:
        return self.message or "the call was stopped"


class CallTimedOut(Exception):
    """A call that another process stopped at its time limit (a sandbox child that did not answer).

    The call is over by the time this is raised, so it is an ordinary exception, not a ``CallStopped``; it
    is judged as one is: a lifecycle example that meets it ends its part's search there, unshrunk and
    not run again (``lifecycle.StoppedViolation``), since every try would wait out the limit again.
    """


class _Scope:
    """One bounded call in flight on one thread."""

    __slots__ = ("thread", "bounds", "start", "rss0", "stop", "stopped_at", "sent", "main", "entry")

    def __init__(self, bounds: Bounds, entry: CodeType | None) -> None:
        self.thread = threading.get_ident()
        self.bounds = bounds
        self.start = time.monotonic()
        self.rss0: int | None = None
        self.stop: CallStopped | None = None
        self.stopped_at = 0.0
        self.sent = 0.0            # when the interruption was last sent (0: never)
        self.main = self.thread == threading.main_thread().ident
        self.entry = entry         # the frame code the implementation's stack starts below (None: filter)


class _Watchdog:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.scopes: dict[int, _Scope] = {}
        self.wake = threading.Event()
        self.thread: threading.Thread | None = None
        self.pid = 0
        self.rss = 0               # the most recent sample
        self.heartbeat = False     # faulthandler armed

    def enter(self, scope: _Scope) -> None:
        if self.thread is None or self.pid != os.getpid():
            self.pid = os.getpid()
            self.thread = threading.Thread(target=self._loop, name="cbatch-watchdog", daemon=True)
            self.thread.start()
        if scope.main and _SIGNAL is not None and _signal.getsignal(_SIGNAL) is not _on_signal:
            _install_handler()
        if scope.bounds.memory_mib > 0:  # this call's own baseline: the last sample may be a stopped call's peak
            scope.rss0 = _rss()
        if not self.wake.is_set() and scope.bounds.seconds > 0:  # waking from idle
            self._arm_last_resort(scope.bounds.seconds)
        self.scopes[scope.thread] = scope
        if not self.wake.is_set():  # checked after registering: the watchdog clears it, then looks for scopes
            self.wake.set()

    def leave(self, scope: _Scope) -> None:
        while True:  # an interruption that lands in here must not leave the scope registered
            try:
                with self.lock:
                    if self.scopes.get(scope.thread) is scope:
                        del self.scopes[scope.thread]
                    if scope.sent and not scope.main:
                        _set_async_exc(scope.thread, None)  # cancel one not yet delivered
                return
            except CallStopped:
                continue

    def _loop(self) -> None:
        idle_since = time.monotonic()
        while True:
            if not self.scopes:
                if time.monotonic() - idle_since > IDLE_SECONDS:
                    self._disarm_last_resort()
                    self.wake.clear()
                    if not self.scopes:
                        self.wake.wait()
                    idle_since = time.monotonic()
                    continue
            else:
                idle_since = time.monotonic()
            time.sleep(POLL_SECONDS)
            with self.lock:
                scopes = list(self.scopes.values())
                if any(s.bounds.memory_mib > 0 for s in scopes):
                    self.rss = _rss()
                now = time.monotonic()
                for scope in scopes:
                    self._check(scope, now)
                limit = max((s.bounds.seconds for s in scopes), default=0.0)
            if limit > 0:
                self._arm_last_resort(limit)

    def _check(self, scope: _Scope, now: float) -> None:
        bounds = scope.bounds
        if scope.stop is None:
            message = reason = ""
            if bounds.seconds > 0 and now - scope.start >= bounds.seconds:
                reason, message = "time", (f"did not finish within {bounds.seconds:g} s "
                                           f"({bounds.time_option}={bounds.seconds:g} changes the limit; 0 disables it)")
            elif bounds.memory_mib > 0 and scope.rss0 is not None and self.rss - scope.rss0 > bounds.memory_mib * 2**20:
                grown = (self.rss - scope.rss0) / 2**20
                reason, message = "memory", (f"grew the process's memory by {grown:.0f} MiB, past the limit of "
                                             f"{bounds.memory_mib:g} MiB ({bounds.memory_option}={bounds.memory_mib:g} "
                                             f"changes it; 0 disables it)")
            if not reason:
                return
            frame = sys._current_frames().get(scope.thread)
            stack = "".join(traceback.format_list(implementation_frames(_frames(frame), scope.entry)))
            scope.stop, scope.stopped_at = CallStopped(message, reason=reason, stack=stack), now
            _LAST_STOP[scope.thread] = scope.stop
        elif now - scope.sent < RESEND_SECONDS:
            return
        elif now - scope.stopped_at >= GRACE_SECONDS and _LAST_RESORT["enabled"]:
            _last_resort(scope)
        scope.sent = now
        if scope.main and _SIGNAL is not None:
            try:
                signal.pthread_kill(scope.thread, _SIGNAL)
            except (OSError, ValueError):
                _set_async_exc(scope.thread, CallStopped)
        else:
            _set_async_exc(scope.thread, CallStopped)

    def _arm_last_resort(self, seconds: float) -> None:
        if _LAST_RESORT["enabled"]:
            faulthandler.dump_traceback_later(seconds + GRACE_SECONDS, exit=True, file=_LAST_RESORT["fd"])
            self.heartbeat = True

    def _disarm_last_resort(self) -> None:
        if self.heartbeat:
            faulthandler.cancel_dump_traceback_later()
            self.heartbeat = False


_WATCHDOG = _Watchdog()
if hasattr(os, "register_at_fork"):  # a forked child starts with no watchdog (and no lock held by one)
    os.register_at_fork(after_in_child=_WATCHDOG.__init__)
_SIGNAL = getattr(signal, "SIGALRM", None) if hasattr(signal, "pthread_kill") else None
_PREVIOUS: list[Any] = [None]
_LAST_RESORT: dict[str, Any] = {"enabled": True, "fd": 2}
_LAST_STOP: dict[int, CallStopped] = {}


def last_stop() -> CallStopped | None:
    """The most recent stop on this thread (an interruption delivered as a bare ``CallStopped`` class, on a
    thread other than the main one, carries no message: this one does)."""
    return _LAST_STOP.get(threading.get_ident())


def configure_last_resort(*, enabled: bool = True, fd: int = 2) -> dict[str, Any]:
    """Where the last resort writes (a file descriptor of the terminal), or turn it off (another tool,
    such as pytest's ``faulthandler_timeout``, already ends a stuck process); returns the previous
    settings, for ``configure_last_resort(**previous)``."""
    previous = dict(_LAST_RESORT)
    _LAST_RESORT.update(enabled=enabled, fd=fd)
    with _WATCHDOG.lock:
        _WATCHDOG._disarm_last_resort()  # the next heartbeat arms it again, writing to ``fd``
    return previous


def _install_handler() -> None:
    previous = signal.signal(_SIGNAL, _on_signal)  # type: ignore[arg-type]
    _PREVIOUS[0] = previous if previous is not _on_signal else _PREVIOUS[0]


def _on_signal(signum: int, frame: FrameType | None) -> None:
    scope = _WATCHDOG.scopes.get(threading.get_ident())
    if scope is not None and scope.stop is not None:
        raise scope.stop
    previous = _PREVIOUS[0]
    if callable(previous):  # someone else's alarm
        previous(signum, frame)


def _set_async_exc(thread: int, exc: type[BaseException] | None) -> None:
    import ctypes

    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread), ctypes.py_object(exc) if exc else None)


def _last_resort(scope: _Scope) -> None:
    assert scope.stop is not None
    text = (f"\npytest-cbatch: the implementation {scope.stop.message}, and ignored being stopped for "
            f"{GRACE_SECONDS:g} s (it catches BaseException, or is stuck in C code). Ending the process; "
            f"run such code with --cbatch-isolate.\nIts stack when it was stopped:\n{scope.stop.stack}")
    try:
        os.write(_LAST_RESORT["fd"], text.encode("utf-8", "replace"))
    finally:
        os._exit(EXIT_STATUS)


def _rss() -> int:
    """The process's resident set size in bytes."""
    try:
        with open("/proc/self/statm", "rb") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError, AttributeError):
        import resource

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak if sys.platform == "darwin" else peak * 1024


def _frames(frame: FrameType | None) -> list[tuple[FrameType, int]]:
    out = []
    while frame is not None:
        out.append((frame, frame.f_lineno))
        frame = frame.f_back
    return out[::-1]


def implementation_frames(frames: Iterable[tuple[FrameType, int]],
                          entry: CodeType | None = None) -> traceback.StackSummary:
    """The implementation's part of a stack (outermost first): the frames below the one running ``entry``,
    or, without ``entry``, every frame outside this kit, pytest, pluggy and Hypothesis."""
    frames = list(frames)
    if entry is not None:
        below = [i for i, (f, _) in enumerate(frames) if f.f_code is entry]
        if below:
            frames = frames[below[-1] + 1:]
    else:
        frames = [(f, n) for f, n in frames if not _foreign(f.f_code.co_filename)]
    return traceback.StackSummary.extract(frames)


def _foreign(filename: str) -> bool:
    path = os.path.abspath(filename)
    if path.startswith(_KIT_DIR) and not path.startswith(os.path.join(_KIT_DIR, "examples")):
        return True
    parts = path.split(os.sep)
    return any(p in ("_pytest", "pluggy", "hypothesis") for p in parts)


def crash_traceback(exc: BaseException, entry: CodeType | None = None) -> str:
    """``exc``'s traceback from the implementation's first frame on (below the frame running ``entry``,
    default ``call``), ending in the exception line: what the implementation's author needs to see."""
    tb: TracebackType | None = exc.__traceback__
    entry = entry or _ENTRY
    walk = tb
    while walk is not None:
        if walk.tb_frame.f_code is entry:
            tb = walk.tb_next
        walk = walk.tb_next
    lines = traceback.format_list(traceback.extract_tb(tb)) if tb is not None else []
    return "".join(lines + traceback.format_exception_only(type(exc), exc))


def call(fn: Callable[..., _T], *args: Any, bounds: Bounds | None = None, **kwargs: Any) -> _T:
    """``fn(*args, **kwargs)`` under ``bounds`` (default ``Bounds()``); CallStopped when stopped.

    A call made while this thread is already inside a bounded call or span is
    bounded by that one.
    """
    bounds = Bounds() if bounds is None else bounds
    if not bounds.active or threading.get_ident() in _WATCHDOG.scopes:
        return fn(*args, **kwargs)
    scope = _Scope(bounds, _ENTRY)
    _WATCHDOG.enter(scope)
    try:
        try:
            result = fn(*args, **kwargs)
        finally:
            _WATCHDOG.leave(scope)
    except BaseException as exc:
        if scope.stop is None:
            raise
        _forget(exc)  # whatever the implementation turned the interruption into
    if scope.stop is not None:  # raised here, outside the handler: nothing of the stopped call comes along
        raise _forget(scope.stop)
    return result


def _forget(exc: BaseException) -> BaseException:
    """``exc`` without its traceback, the frames it held cleared: a stopped call's locals (all it allocated)
    are given back at once, not when a collection finds the cycle, and the stack lives on as text only."""
    traceback.clear_frames(exc.__traceback__)
    exc.__traceback__ = None
    return exc


_ENTRY = call.__code__


class span:
    """A bounded stretch of code on this thread (``with span(bounds): ...``): what ``call`` does for one
    call, for a sequence of calls, such as one lifecycle example.  Its stack keeps the frames outside
    the kit, pytest and Hypothesis.  ``stopped`` is the CallStopped, if it was stopped."""

    def __init__(self, bounds: Bounds | None = None) -> None:
        self.bounds = Bounds() if bounds is None else bounds
        self.scope: _Scope | None = None
        self.stopped: CallStopped | None = None

    def __enter__(self) -> "span":
        self.open()
        return self

    def open(self) -> None:
        if self.bounds.active and threading.get_ident() not in _WATCHDOG.scopes:
            self.scope = _Scope(self.bounds, None)
            _WATCHDOG.enter(self.scope)

    def close(self) -> CallStopped | None:
        scope, self.scope = self.scope, None
        if scope is not None:
            _WATCHDOG.leave(scope)
            self.stopped = scope.stop
        return self.stopped

    def __exit__(self, kind: Any, exc: BaseException | None, tb: Any) -> None:
        stopped = self.close()
        if stopped is not None and exc is not None:
            _forget(exc)
        if stopped is not None and exc is not stopped:
            raise _forget(stopped) from None


def bounded_machine(cls: type[_T], bounds: Bounds) -> type[_T]:
    """A subclass of the Hypothesis state machine ``cls`` whose every example (one instance, from its
    creation to its teardown) runs in a ``span(bounds)``.  A stopped example skips ``cls.teardown``
    (it would call into the stuck implementation again) and leaves the instance's ``script``, when it has
    one, on the CallStopped, and the CallStopped on the class's ``stops`` list, when it has one (should
    Hypothesis report an error of its own for the example the stop cut short)."""

    class Bounded(cls):  # type: ignore[valid-type, misc]
        def __init__(self) -> None:
            super().__init__()
            self._cbatch_span = span(bounds)
            self._cbatch_span.open()

        def teardown(self) -> None:
            scope = self._cbatch_span.scope
            try:
                if scope is None or scope.stop is None:
                    super().teardown()
            finally:
                stopped = self._cbatch_span.close()
                if stopped is not None:
                    stopped.script = "\n".join(getattr(self, "script", ()))
                    getattr(self, "stops", []).append(stopped)

    Bounded.__name__ = Bounded.__qualname__ = cls.__name__
    Bounded.__doc__ = cls.__doc__
    return Bounded  # type: ignore[return-value]
