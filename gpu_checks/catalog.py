"""The names of the numeric checks and of their attention magnitudes (no torch).

Test ids and selections (the shipped suite's ``test_numerics[<check>-<dtype>-<workload>]``) are built
from these tables, so collecting them never imports torch; :mod:`.checks` and :mod:`.attention`
implement what they name.
"""

from __future__ import annotations

from .presets import LEAD_KEY_GAIN

__all__ = ["SCHEDULE_CHECKS", "LEAD_CHECKS", "MAGNITUDES"]

SCHEDULE_CHECKS: tuple[str, ...] = ("oracle_self_test", "backend_parity", "batched_vs_alone", "chunked_vs_whole",
                                    "page_reuse", "row_order", "determinism")
"""The default checks of one schedule; ``large_scores`` is selected explicitly with a q_gain preset."""

LEAD_CHECKS: dict[str, str] = {"later_partition_leads": "late", "first_partition_leads": "early"}
"""Checks that need a ``<hot preset>-<side>`` twin, by the side they need."""

MAGNITUDES: dict[str, tuple[float, float]] = {
    "uniform": (1.0, 1.0),
    "later_leads": (LEAD_KEY_GAIN, 1.0),
    "first_leads": (1.0, LEAD_KEY_GAIN),
}
"""Key gains ``(first split-KV partition, later keys)`` of the large-score batch: ``later_leads``
makes a later partition's max score lead the first's by > 100, ``first_leads`` the reverse."""
