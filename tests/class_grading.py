"""Test helper: a small class of submissions (examples/grading/make_class.py), a small rubric, and the verdicts
of an output (every results.json and summary.csv row, timing fields aside) to compare runs by."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

from grading_samples import load_example

_module = load_example("make_class.py")

make_class = _module.make_class
MIX = _module.MIX

# Few examples, a short call limit and one failure before a kind of call gives up: the looping submission
# costs one call_seconds, an honest call takes well under it even on a loaded machine.
SMALL_RUBRIC = """\
[grading]
generated_examples = 2
lifecycle_examples = 4
numerics = "off"
[limits]
call_seconds = 5
max_failures = 1
[tests]
"contract.completes" = { points = 3 }
"contract.*" = { points = 1 }
"lifecycle.*" = { points = 1, visibility = "after_due_date" }
"""


def write_rubric(folder: Path, text: str = SMALL_RUBRIC) -> Path:
    path = folder / "rubric.toml"
    path.write_text(text, encoding="utf-8")
    return path


def verdicts(out: Path) -> dict[str, Any]:
    """Everything an output says about its submissions, without the fields that time the run."""
    with open(out / "summary.csv", newline="", encoding="utf-8") as fh:
        table = list(csv.reader(fh))
    header = table[0]
    timing = header.index("execution_time")
    rows = {row[0]: [cell for i, cell in enumerate(row) if i != timing] for row in table[1:]}
    assert len(rows) == len(table) - 1, "a submission has two rows"
    found: dict[str, Any] = {"header": header, "rows": rows}
    for name in rows:
        document = json.loads((out / name / "results.json").read_text(encoding="utf-8"))
        document.pop("execution_time")
        found[name] = {"results.json": document,
                       **{p.name: p.read_bytes() for p in (out / name).iterdir() if p.name != "results.json"}}
    return found
