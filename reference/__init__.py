"""Reference scheduler simulator and lifecycle model (standard library only).

Installed as ``pytest_cbatch.reference``; this package is the built-in
implementation ``--cbatch-impl=reference``: the scheduler's ``simulate`` and
the lifecycle parts ``PagedKV``, ``RecomputeRequest`` and ``TransferManager``.
"""

from .paged_kv import PagedKV
from .scheduler_faults import RecomputeRequest, TransferManager
from .scheduler_sim import simulate

__all__ = ["PagedKV", "RecomputeRequest", "TransferManager", "simulate"]
