"""Isolation: a submission's code runs only in a sandbox child process, judged from the parent.

``IsolatedImplementation(spec, load_spec_for(spec), Limits(...))`` is an
``Implementation`` for ``runner.Judge`` and the lifecycle suites; see
``process`` (the child process and its limits), ``child`` (the child's side
of the RPC), ``remote`` and ``proxies`` (the parent's side), ``search``,
``mirror`` and ``mirror_child`` (lifecycle searches, or steps, run by the
child first and judged by the parent from its record; ``lines``, a search's
record as the two sides write and read it), ``bwrap``
(containment with bubblewrap, and the sandbox modes), ``files`` (the
submission's copy, made without following a link) and ``guard`` (a graded
submission's uses of the kit's own code, caught in the child).
"""

from .bwrap import SANDBOX_MODES, bwrap_problem, resolve_mode
from .guard import KitGuard
from .limits import Limits
from .mirror import MirrorDiverged, lifecycle_verdicts_of, mirrored
from .process import LoadSpec, NotContained, Sandbox, SandboxFailure
from .proxies import IsolatedImplementation, load_spec_for, submission_files
from .remote import RemoteObject

__all__ = ["SANDBOX_MODES", "IsolatedImplementation", "KitGuard", "Limits", "LoadSpec", "MirrorDiverged", "NotContained",
           "RemoteObject", "Sandbox", "SandboxFailure", "bwrap_problem", "lifecycle_verdicts_of", "load_spec_for",
           "mirrored", "resolve_mode", "submission_files"]
