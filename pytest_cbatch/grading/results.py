"""Grading results: one test per clause or check, written as Gradescope results.json and a summary CSV."""

from __future__ import annotations

import csv
import html
import io
import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from .. import untrusted

__all__ = ["SubmissionResult", "TestResult", "write_json", "write_summary"]


@dataclass
class TestResult:
    """One Gradescope test: ``name`` as the rubric matches it, ``passed`` or not, its output text.

    ``unjudged`` says why the test could not be judged on this submission (it
    then scores 0; the output is written from it once the points are known).
    """

    name: str
    passed: bool
    output: str
    max_score: float = 0.0
    visibility: str = "visible"
    tags: list[str] = field(default_factory=list)
    unjudged: str | None = None
    picture: str | None = None  # the failure's picture (an HTML fragment): Gradescope shows it above the text

    @property
    def score(self) -> float:
        return self.max_score if self.passed else 0.0

    def gradescope(self) -> dict[str, Any]:
        """This test in results.json: with a picture, the output is HTML (the picture, then the text in a
        ``<pre>``) and ``output_format`` says so; otherwise plain text."""
        out = {"name": self.name, "score": self.score, "max_score": self.max_score,
               "status": "passed" if self.passed else "failed", "output": self.output,
               "visibility": self.visibility, "tags": list(self.tags)}
        if self.picture and not self.passed:
            out["output"] = f'{self.picture}\n<pre style="white-space:pre-wrap;overflow-wrap:anywhere">{html.escape(self.output)}</pre>'
            out["output_format"] = "html"
        return out


@dataclass
class SubmissionResult:
    """Everything graded for one submission."""

    name: str
    tests: list[TestResult]
    output: str
    execution_time: float
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def score(self) -> float:
        return sum(t.score for t in self.tests)

    @property
    def max_score(self) -> float:
        return sum(t.max_score for t in self.tests)

    def gradescope(self) -> dict[str, Any]:
        """The Gradescope autograder results document (schemas/gradescope-results.schema.json)."""
        return {"score": self.score, "execution_time": round(self.execution_time, 3), "output": self.output,
                "visibility": "visible", "stdout_visibility": "hidden",
                "extra_data": {"cbatch": {"submission": self.name, "max_score": self.max_score, **self.extra}},
                "tests": [t.gradescope() for t in self.tests]}


def write_json(path: Path, document: Any) -> None:
    """Write ``document`` atomically (a reader never sees half a file), every string valid Unicode
    (``untrusted.document``: a submission's text may hold lone surrogates)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    _replace(path, (json.dumps(untrusted.document(document), indent=2) + "\n").encode("utf-8"))


def write_summary(path: Path, results: Sequence[SubmissionResult]) -> None:
    """``summary.csv``: a row per submission (name, score, max, seconds, flags) and a column per test (its score).

    ``flags`` lists what the instructor should look at (a refused link, an import of the kit, what the copy
    left out), ``; ``-separated; empty for an ordinary submission.  Every text cell is ``untrusted.cell``:
    a flag quotes the submission's own file names, and no cell is one a spreadsheet evaluates.
    """
    names: list[str] = []
    for result in results:
        names += [t.name for t in result.tests if t.name not in names]
    buffer = io.StringIO(newline="")
    writer = csv.writer(buffer)
    writer.writerow(["submission", "score", "max_score", "execution_time", "flags", *names])
    for result in sorted(results, key=lambda r: r.name):
        scores = {t.name: t.score for t in result.tests}
        writer.writerow([untrusted.cell(result.name), _num(result.score), _num(result.max_score),
                         round(result.execution_time, 3), untrusted.cell("; ".join(result.extra.get("flags", []))),
                         *(_num(scores[n]) if n in scores else "" for n in names)])
    _replace(path, buffer.getvalue().encode("utf-8"))


def _replace(path: Path, data: bytes) -> None:
    """Put ``data`` at ``path`` atomically: a temporary file beside it, created anew (never through a link
    left there), then renamed over whatever ``path`` was; nothing half-written is left on failure."""
    tmp = path.with_name(path.name + ".tmp")
    if tmp.is_symlink() or tmp.exists():
        tmp.unlink()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _num(value: float) -> str:
    return f"{value:g}"
