"""Test helper: the grading example's ``make_samples`` (examples/grading/make_samples.py), loaded by path, and the loader."""

from __future__ import annotations

import importlib.util
from pathlib import Path

EXAMPLE_DIR = Path(__file__).resolve().parents[1] / "examples" / "grading"


def load_example(filename: str):
    """A module of examples/grading, loaded by path (the folder is not a package)."""
    spec = importlib.util.spec_from_file_location(f"cbatch_grading_{filename[:-3]}", EXAMPLE_DIR / filename)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_module = load_example("make_samples.py")

make_samples = _module.make_samples
OVERLAYS = _module.OVERLAYS
make_hostile = _module.make_hostile
HOSTILE = _module.HOSTILE


def published(folder: Path, overlay: str = "") -> Path:
    """A correct submission folder in the published layout: the reference's two files, with ``overlay``
    appended to scheduler_sim.py."""
    import pytest_cbatch.reference.scheduler_faults as reference_faults
    import pytest_cbatch.reference.scheduler_sim as reference_sim

    folder.mkdir(parents=True)
    (folder / "scheduler_sim.py").write_text(Path(reference_sim.__file__).read_text(encoding="utf-8") + overlay,
                                             encoding="utf-8")
    (folder / "scheduler_faults.py").write_text(Path(reference_faults.__file__).read_text(encoding="utf-8"),
                                                encoding="utf-8")
    return folder
