"""Reference scheduler simulator and lifecycle model (standard library only).

Installed as ``pytest_cbatch.reference``; this package is the built-in
implementation ``--cbatch-impl=reference``: the scheduler's ``simulate`` and
the lifecycle parts ``PagedKV`` (from ``scheduler_sim``), ``RecomputeRequest``
and ``TransferManager`` (from ``scheduler_faults``).
"""

from .scheduler_faults import RecomputeRequest, TransferManager
from .scheduler_sim import PagedKV, simulate

__all__ = ["PagedKV", "RecomputeRequest", "TransferManager", "simulate"]
