"""Resource limits for a sandboxed submission, and the environment it runs in."""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Mapping

__all__ = ["Limits", "child_environment", "sandbox_path"]

_MIB = 1 << 20


@dataclass
class Deadline:
    """One submission's clock for ``Limits.submission_seconds``, shared by every child of it (the hidden
    workloads' own included): wall time since grading began, so the grader's judging, shrinking and
    numerics on the submission's reports count as much as its calls.  A call asked once it ``passed`` is
    not run."""

    seconds: float
    start: float = field(default_factory=time.monotonic)

    def passed(self) -> bool:
        return time.monotonic() - self.start >= self.seconds


@dataclass(frozen=True)
class Limits:
    """What one sandboxed submission may use.

    ``call_seconds`` is the wall-clock limit of one call (a ``simulate`` run or
    one lifecycle method call); ``import_seconds`` that of the start-up import
    of the submission (at least ``call_seconds``: a loaded machine imports
    slowly, and an honest submission must not fail for it); ``cpu_seconds``,
    ``memory_mb`` (address space), ``processes`` and ``file_mb`` (largest file
    written) are ``setrlimit`` limits of the child process, which is restarted
    after any failure (inside bubblewrap ``processes`` counts the sandbox's
    own processes, and binds a root grader too); ``output_kb`` bounds what it
    may print in all (stdout and stderr together) before it is killed;
    ``reply_mb`` bounds one reply.
    After ``max_failures`` consecutive failed ``simulate`` calls the next ones
    still run, each at a short limit (``breaker.short_seconds``: a tenth of
    ``call_seconds``, 1 to 10 s) until one succeeds, so every workload is run
    and a loop costs seconds, not the full limit, a call; after as many failed
    lifecycle calls the rest of those fail at once.  ``submission_seconds``
    caps the wall time of all calls together: the calls after it are not
    run (and a workload not run counts as not passed).
    """

    call_seconds: float = 10.0
    cpu_seconds: int = 120
    memory_mb: int = 2048
    processes: int = 64
    file_mb: int = 16
    output_kb: int = 1024
    reply_mb: int = 64
    max_failures: int = 3
    submission_seconds: float = 900.0
    import_seconds: float = 60.0
    names: tuple[tuple[str, str], ...] = ()  # (field, the front end's option for it): how messages name a limit

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any], where: str = "limits") -> "Limits":
        """Limits from a mapping of field names (e.g. a rubric's ``[limits]`` table); ValueError names a bad key."""
        known = {f.name: f.type for f in fields(cls) if f.name != "names"}
        unknown = sorted(set(values) - set(known))
        if unknown:
            raise ValueError(f"{where}: unknown key(s) {', '.join(unknown)}; known: {', '.join(known)}")
        for key, value in values.items():
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise ValueError(f"{where}.{key}: must be a positive number, got {value!r}")
        return cls(**values)

    def rlimits(self) -> dict[str, list[int]]:
        """``resource`` limit names to ``[soft, hard]``, as the child applies them before importing anything."""
        return {
            "RLIMIT_CPU": [int(self.cpu_seconds), int(self.cpu_seconds) + 1],
            "RLIMIT_AS": [self.memory_mb * _MIB] * 2,
            "RLIMIT_NPROC": [self.processes] * 2,
            "RLIMIT_FSIZE": [self.file_mb * _MIB] * 2,
            "RLIMIT_CORE": [0, 0],
        }

    def term(self, key: str) -> str:
        """How a message names limit ``key``: the option the user set it with (``names``), else the rubric term."""
        return dict(self.names).get(key) or f"limit {key}"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def describe(self) -> str:
        return (f"{self.call_seconds:g} s per call, {self.cpu_seconds} s CPU, {self.memory_mb} MiB address space, "
                f"{self.processes} processes, {self.file_mb} MiB per file, {self.output_kb} KiB of output")


SYSTEM_PATH = "/usr/local/bin:/usr/bin:/bin"
"""Where the child finds programs: the system's, under ``/usr`` (all the sandbox shows of the system)."""


def sandbox_path(runtimes: tuple[str, ...] = ()) -> str:
    """The child's PATH: each runtime's ``bin`` folder (or the runtime folder itself), then the system's."""
    first = [os.path.join(r, "bin") if os.path.isdir(os.path.join(r, "bin")) else r for r in runtimes]
    return ":".join([*first, SYSTEM_PATH])


def child_environment(home: str, runtimes: tuple[str, ...] = ()) -> dict[str, str]:
    """A minimal environment: no variable of the grader's (tokens, paths to hidden traces) reaches the child."""
    return {
        "PATH": sandbox_path(runtimes),
        "HOME": home,
        "TMPDIR": home,
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
    }
