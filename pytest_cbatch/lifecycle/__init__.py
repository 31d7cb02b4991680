"""KV lifecycle conformance: Hypothesis state machines run against an independent oracle.

The parts are the course's published lifecycle API: ``PagedKV`` (allocator),
``RecomputeRequest`` (preemption with full recomputation) and
``TransferManager`` (KV transfers that outlive cancellation).  Each factory of
``MACHINES`` takes an implementation namespace (a module or any object with
those classes) and returns a ``RuleBasedStateMachine`` that drives only the
published surface and checks the part's clauses (``PART_CLAUSES``) after every
step against an oracle written from the contract alone (``oracle``), which
never imports or mirrors the reference.  A failure raises
``LifecycleViolation``: the message starts with ``[clause id]`` and ends with
the shortest operation sequence found, as runnable Python::

    from pytest_cbatch.lifecycle import lifecycle_verdicts
    verdicts = lifecycle_verdicts("transfer", my_module)   # {clause id: Verdict(status, message)}

Modules: ``clauses`` (ids and statements), ``oracle``, ``machine`` (the shared
base), ``allocator``/``recompute``/``transfer`` (one machine each) and
``verdicts`` (settings, missing parts, per-clause verdicts).
"""

from .allocator import allocator_machine
from .clauses import ABORT_REASONS, LIFECYCLE, LIFECYCLE_CLAUSES, PART_CLAUSES, PARTS, LifecycleClause, LifecycleViolation
from .recompute import recompute_machine
from .transfer import transfer_machine
from .verdicts import (
    MACHINES, MAX_FAILURES, MIN_STEPS, SHRINK_SECONDS, Verdict, lifecycle_settings, lifecycle_verdicts, missing_parts,
    shrink_budget, steady_draws,
)

__all__ = [
    "ABORT_REASONS", "LIFECYCLE", "LIFECYCLE_CLAUSES", "LifecycleClause", "MACHINES", "MAX_FAILURES", "MIN_STEPS",
    "PARTS", "PART_CLAUSES", "SHRINK_SECONDS", "LifecycleViolation", "Verdict", "allocator_machine",
    "lifecycle_settings", "lifecycle_verdicts", "missing_parts", "recompute_machine", "shrink_budget",
    "steady_draws", "transfer_machine",
]
