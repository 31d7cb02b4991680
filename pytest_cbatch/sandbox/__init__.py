"""Isolation: a submission's code runs only in a sandbox child process, judged from the parent.

``IsolatedImplementation(spec, load_spec_for(spec), Limits(...))`` is an
``Implementation`` for ``runner.Judge`` and the lifecycle suites; see
``process`` (the child process and its limits), ``child`` (the child's side
of the RPC) and ``proxies`` (the parent's side).
"""

from .limits import Limits
from .process import LoadSpec, Sandbox, SandboxFailure
from .proxies import IsolatedImplementation, RemoteObject, load_spec_for, submission_files

__all__ = ["IsolatedImplementation", "Limits", "LoadSpec", "RemoteObject", "Sandbox", "SandboxFailure",
           "load_spec_for", "submission_files"]
