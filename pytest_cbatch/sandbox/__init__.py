"""Isolation: a submission's code runs only in a sandbox child process, judged from the parent.

``IsolatedImplementation(spec, load_spec_for(spec), Limits(...))`` is an
``Implementation`` for ``runner.Judge`` and the lifecycle suites; see
``process`` (the child process and its limits), ``child`` (the child's side
of the RPC), ``proxies`` (the parent's side) and ``bwrap`` (containment
with bubblewrap, and the sandbox modes).
"""

from .bwrap import SANDBOX_MODES, bwrap_problem, resolve_mode
from .limits import Limits
from .process import LoadSpec, NotContained, Sandbox, SandboxFailure
from .proxies import IsolatedImplementation, RemoteObject, load_spec_for, submission_files

__all__ = ["SANDBOX_MODES", "IsolatedImplementation", "Limits", "LoadSpec", "NotContained", "RemoteObject",
           "Sandbox", "SandboxFailure", "bwrap_problem", "load_spec_for", "resolve_mode", "submission_files"]
