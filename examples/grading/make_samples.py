"""Build the sample submissions of the grading example: ``python make_samples.py DEST``.

Each sample is a student folder in the published layout (``scheduler_sim.py``
and ``scheduler_faults.py``) made from the kit's reference, so the correct one
is the reference itself laid out as a student would hand it in.  The others
append a few lines to ``scheduler_sim.py`` that replace ``simulate``:

* ``correct``         the reference, unchanged: full marks
* ``buggy_ttft``      reports TTFT 0 instead of null for requests cancelled before a token
* ``buggy_itl``       reports ITL ``[0]`` instead of ``[]`` for one-token outputs
* ``loops_forever``   ``simulate`` never returns
* ``calls_os_exit``   ``simulate`` calls ``os._exit(3)``
* ``prints_50mb``     ``simulate`` prints 50 MB before returning a correct report
* ``deletes_files``   ``simulate`` deletes every file in its working directory, then answers correctly

Any module of the reference folder that the two files import (by plain or
relative import) is copied beside them, so the folder is self-contained.
"""

from __future__ import annotations

import ast
import shutil
import sys
from pathlib import Path

import pytest_cbatch.reference as reference

__all__ = ["OVERLAYS", "make_samples"]

_WRAP = "\n\n# ---- sample submission: {name} ----\n_published_simulate = simulate\n\n\n"

OVERLAYS: dict[str, str] = {
    "correct": "",
    "buggy_ttft": '''def simulate(events, **config):
    report = _published_simulate(events, **config)
    for row in report["requests"].values():
        if row["status"] == "cancelled" and row["ttft_ticks"] is None:
            row["ttft_ticks"] = 0
    return report
''',
    "buggy_itl": '''def simulate(events, **config):
    report = _published_simulate(events, **config)
    for row in report["requests"].values():
        if row["output_tokens"] == 1:
            row["itl_ticks"] = [0]
    return report
''',
    "loops_forever": '''def simulate(events, **config):
    while True:
        pass
''',
    "calls_os_exit": '''def simulate(events, **config):
    import os
    os._exit(3)
''',
    "prints_50mb": '''def simulate(events, **config):
    import sys
    chunk = "x" * (1 << 20)
    for _ in range(50):
        sys.stdout.write(chunk)
    return _published_simulate(events, **config)
''',
    "deletes_files": '''def simulate(events, **config):
    import os
    for root, _dirs, files in os.walk("."):
        for name in files:
            os.remove(os.path.join(root, name))
    return _published_simulate(events, **config)
''',
}

_ENTRY_FILES = ("scheduler_sim.py", "scheduler_faults.py")


def _local_imports(path: Path, folder: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module.split(".")[0])
        elif isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
    return {f"{n}.py" for n in names if (folder / f"{n}.py").is_file()}


def _published_files() -> list[Path]:
    folder = Path(reference.__file__).parent
    wanted, todo = set(), list(_ENTRY_FILES)
    while todo:
        name = todo.pop()
        if name not in wanted:
            wanted.add(name)
            todo += sorted(_local_imports(folder / name, folder))
    return [folder / name for name in sorted(wanted)]


def make_samples(dest: Path, only: tuple[str, ...] | None = None) -> list[Path]:
    """Write one folder per entry of OVERLAYS (or of ``only``) under ``dest``, replacing old ones; return them."""
    files = _published_files()
    made = []
    for name, overlay in OVERLAYS.items():
        if only is not None and name not in only:
            continue
        target = dest / name
        if target.exists():
            shutil.rmtree(target)
        target.mkdir(parents=True)
        for path in files:
            shutil.copyfile(path, target / path.name)
        if overlay:
            with open(target / "scheduler_sim.py", "a", encoding="utf-8") as fh:
                fh.write(_WRAP.format(name=name) + overlay)
        made.append(target)
    return made


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python make_samples.py DEST")
    for folder in make_samples(Path(sys.argv[1])):
        print(folder)
