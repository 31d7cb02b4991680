"""Batched-vs-unbatched logits checks on a small seeded transformer (needs torch).

Importing this package does not import torch; the public names below load
their module (and torch) on first use.  See README.md in this folder.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "CheckResult": "checks",
    "TOLERANCES": "checks",
    "SCHEDULE_CHECKS": "catalog",
    "run_schedule_checks": "checks",
    "run_preemption_check": "checks",
    "run_invariance_checks": "checks",
    "run_attention_parity": "attention",
    "mutant_kill_matrix": "checks",
    "BUGS": "bugs",
    "BUG_REGIMES": "bugs",
    "REGIMES": "bugs",
    "size_parameters": "sizes",
    "boundaries_reached": "sizes",
    "EngineConfig": "engine",
    "ScheduleError": "engine",
    "run_schedule": "engine",
    "PRESETS": "model",
    "Model": "model",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
