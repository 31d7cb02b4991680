"""Build a class of N submissions in a fixed mix: ``python make_class.py DEST N``.

Submission ``i`` is of kind ``MIX[i % len(MIX)]`` and named ``s<i>_<kind>``
(``s007_loops_forever``): folders in the published layout made by
``make_samples`` (correct, two buggy, one that loops forever, one that calls
``os._exit``) and one-file submissions (``<name>.py``): the reference
scheduler in one file, and one that crashes on import.  The grading tests
(one machine, shards, Ray) and ``benchmarks/bench_class.py`` grade such classes.
"""

from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path

import pytest_cbatch.reference as reference

__all__ = ["MIX", "make_class"]

_spec = importlib.util.spec_from_file_location("cbatch_grading_make_samples",
                                               Path(__file__).with_name("make_samples.py"))
assert _spec is not None and _spec.loader is not None
_samples = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_samples)

MIX = ("correct", "buggy_ttft", "file_correct", "loops_forever", "buggy_itl", "calls_os_exit", "file_crashes")
_CRASH_ON_IMPORT = "raise RuntimeError('this submission crashes as it is imported')\n"


def make_class(dest: Path, count: int) -> list[Path]:
    """Write ``count`` submissions under ``dest`` (created; old ones of the same names replaced); return them."""
    dest.mkdir(parents=True, exist_ok=True)
    made = []
    for i in range(count):
        kind = MIX[i % len(MIX)]
        name = f"s{i:03d}_{kind}"
        if kind == "file_correct":
            made.append(Path(shutil.copyfile(Path(reference.__file__).with_name("scheduler_sim.py"),
                                             dest / f"{name}.py")))
        elif kind == "file_crashes":
            (dest / f"{name}.py").write_text(_CRASH_ON_IMPORT, encoding="utf-8")
            made.append(dest / f"{name}.py")
        else:
            made.append(_samples._write(dest / name, kind, _samples.OVERLAYS[kind]))
    return made


if __name__ == "__main__":
    if len(sys.argv) != 3 or not sys.argv[2].isdigit():
        sys.exit("usage: python make_class.py DEST N")
    for path in make_class(Path(sys.argv[1]), int(sys.argv[2])):
        print(path)
