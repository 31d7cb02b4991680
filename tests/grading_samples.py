"""Test helper: the grading example's ``make_samples`` (examples/grading/make_samples.py), loaded by path."""

from __future__ import annotations

import importlib.util
from pathlib import Path

EXAMPLE_DIR = Path(__file__).resolve().parents[1] / "examples" / "grading"

_spec = importlib.util.spec_from_file_location("cbatch_grading_make_samples", EXAMPLE_DIR / "make_samples.py")
assert _spec is not None and _spec.loader is not None
_module = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_module)

make_samples = _module.make_samples
OVERLAYS = _module.OVERLAYS
make_hostile = _module.make_hostile
HOSTILE = _module.HOSTILE
