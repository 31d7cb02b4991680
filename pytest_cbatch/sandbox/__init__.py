"""Isolation: a submission's code runs only in a sandbox child process, judged from the grader.

``IsolatedImplementation(spec, load_spec_for(spec), Limits(...))`` is an
``Implementation`` for ``runner.Judge`` and the lifecycle suites.  The
package is in layers, each importing only those below it (docs/sandbox.md):

- ``protocol``: the wire format both sides share, and the grader's bounds
  on every line the child writes (standard library only);
- ``limits``, ``bwrap``, ``files``, ``guard`` and ``program``: what a child
  may use, its containment, the submission's copy (made without following a
  link), the watch on a submission's uses of the kit's own code, and a
  submission that is a program (the last two standard library only: the
  child loads them by path);
- ``remote``: a submission's objects seen through a channel (both sides);
- the child's side: ``child`` (the process's entry point and its server)
  and ``child_search`` (a lifecycle search run ahead in the child);
- the grader's side: ``process`` (the child process, its limits and its
  pipe), ``search`` (judging a searched lifecycle part; the live channel is
  its fallback) and ``proxies`` (the submission as an ``Implementation``,
  and the live channel).

The names below are loaded on first use, so the child, which imports
``protocol`` through this package, loads nothing of the grader's side.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .bwrap import SANDBOX_MODES, bwrap_problem, resolve_mode
    from .guard import KitGuard
    from .limits import Limits
    from .process import LoadSpec, NotContained, Sandbox
    from .protocol import SandboxFailure
    from .proxies import IsolatedImplementation, load_spec_for, submission_files
    from .remote import RemoteObject
    from .search import SearchDiverged, lifecycle_verdicts_of

_HOMES = {
    "SANDBOX_MODES": "bwrap", "bwrap_problem": "bwrap", "resolve_mode": "bwrap",
    "KitGuard": "guard", "Limits": "limits",
    "LoadSpec": "process", "NotContained": "process", "Sandbox": "process",
    "SandboxFailure": "protocol",
    "IsolatedImplementation": "proxies", "load_spec_for": "proxies", "submission_files": "proxies",
    "RemoteObject": "remote",
    "SearchDiverged": "search", "lifecycle_verdicts_of": "search",
}

__all__ = sorted(_HOMES)


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{home}"), name)
