"""A class graded in pieces: ``--shard I/N`` and ``cbatch grade merge``, checked by each output's run record.

``shard_of(name, n)`` puts a submission in shard ``1 + (first 8 bytes of
SHA-256(name), big-endian) mod n``: it depends on the name alone, so every CI
job computes the same split without seeing the others, and adding a student
moves no other one.  Every ``cbatch grade`` output holds ``grading.json``, its
run record: the kit's version, fingerprints of the rubric and of the workloads
graded (generated and hidden included), the shard, every submission of the
folder with a digest of its files, and the ones graded in this output.
``merge(outputs, out)`` joins shard outputs into what one run over the whole
folder writes, after checking that they were made by the same kit with the
same rubric and workloads from the same files, that no submission is graded
twice and none is missing; on any refusal nothing is written.
"""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from .plan import Plan
from .results import write_json
from .rubric import Rubric

__all__ = ["RECORD", "MergeError", "RunRecord", "kit_version", "merge", "parse_shard", "plan_fingerprint",
           "rubric_fingerprint", "shard_of"]

RECORD = "grading.json"
_FORMAT = 1


class MergeError(ValueError):
    """Outputs that cannot be merged; the message names the outputs and submissions at fault."""


def parse_shard(text: str) -> tuple[int, int]:
    """``"I/N"`` as ``(I, N)`` with 1 <= I <= N; ValueError otherwise."""
    index, sep, count = text.partition("/")
    if not sep or not index.isdigit() or not count.isdigit() or not 1 <= int(index) <= int(count):
        raise ValueError(f"--shard must be I/N with 1 <= I <= N (e.g. 2/4), got {text!r}")
    return int(index), int(count)


def shard_of(name: str, count: int) -> int:
    """The shard (1..count) of submission ``name``: a hash of the name alone, the same on every machine."""
    return 1 + int.from_bytes(hashlib.sha256(name.encode("utf-8")).digest()[:8], "big") % count


def kit_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("pytest-cbatch")
    except PackageNotFoundError:  # run from a checkout without installing it
        return "unknown"


def rubric_fingerprint(rubric: Rubric) -> str:
    """SHA-256 of everything in the rubric that decides a score (not where the file or its traces live)."""
    fields = dataclasses.asdict(rubric)
    fields.pop("source")
    fields.pop("hidden_traces")  # their contents are in the plan's fingerprint
    return _sha(fields)


def plan_fingerprint(plan: Plan) -> str:
    """SHA-256 of every workload and invalid input graded, in order, and whether hidden ones are shown."""
    return _sha({"cases": [[c.label, c.kind, c.trace, c.config] for c in plan.cases],
                 "invalid": [[c.label, c.trace, c.config] for c in plan.invalid],
                 "hidden_visible": plan.hidden_visible, "hidden_outcome": plan.hidden_outcome})


def _sha(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=repr).encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class RunRecord:
    """``grading.json``: what a merge checks. ``submissions`` maps every name of the folder to its files' digest."""

    kit: str
    rubric: str
    plan: str
    submissions: Mapping[str, str]
    graded: tuple[str, ...]
    shard: str | None = None

    def document(self) -> dict[str, Any]:
        return {"format": _FORMAT, "kit": self.kit, "rubric": self.rubric, "plan": self.plan,
                "shard": self.shard, "submissions": dict(sorted(self.submissions.items())),
                "graded": sorted(self.graded)}

    def write(self, out: Path) -> None:
        write_json(out / RECORD, self.document())

    @classmethod
    def read(cls, out: Path) -> "RunRecord":
        """The record of output ``out``; MergeError when it is missing or malformed."""
        path = out / RECORD
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise MergeError(f"{out}: no {RECORD}, so not an output of `cbatch grade` (or of an older kit)") from None
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise MergeError(f"{path}: unreadable ({exc})") from None
        ok = (isinstance(doc, dict) and doc.get("format") == _FORMAT
              and all(isinstance(doc.get(k), str) for k in ("kit", "rubric", "plan"))
              and isinstance(doc.get("submissions"), dict)
              and all(isinstance(k, str) and isinstance(v, str) for k, v in doc["submissions"].items())
              and isinstance(doc.get("graded"), list) and all(isinstance(n, str) for n in doc["graded"])
              and set(doc["graded"]) <= set(doc["submissions"]) and (doc.get("shard") is None
                                                                     or isinstance(doc.get("shard"), str)))
        if not ok:
            raise MergeError(f"{path}: not a run record of format {_FORMAT}")
        return cls(doc["kit"], doc["rubric"], doc["plan"], doc["submissions"], tuple(doc["graded"]), doc["shard"])


def merge(outputs: Sequence[Path], out: Path) -> RunRecord:
    """Join ``outputs`` into ``out`` (absent or empty); MergeError, with nothing written, when they do not fit."""
    if len(outputs) < 1:
        raise MergeError("give the outputs to merge")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise MergeError(f"{out}: exists and is not an empty folder; merge into a new one")
    records = [RunRecord.read(o) for o in outputs]
    first = records[0]
    for name, what in (("kit", "kit versions"), ("rubric", "rubrics"), ("plan", "workloads (generated or hidden)"),
                       ("submissions", "submission folders (names or files differ)")):
        values = {str(getattr(r, name)) for r in records}
        if len(values) > 1:
            which = ", ".join(f"{o} ({_short(getattr(r, name))})" for o, r in zip(outputs, records))
            raise MergeError(f"the outputs were made with different {what}: {which}; grade every shard with the "
                             f"same kit, rubric, traces and submissions")
    owner: dict[str, Path] = {}
    for output, record in zip(outputs, records):
        for name in record.graded:
            if name in owner:
                raise MergeError(f"submission {name} is graded in both {owner[name]} and {output}; each must be "
                                 f"in exactly one output (a shard given twice, or two different splits?)")
            owner[name] = output
    missing = sorted(set(first.submissions) - set(owner))
    if missing:
        raise MergeError(f"{len(missing)} submission(s) are in no output: {', '.join(missing[:10])}"
                         f"{' ...' if len(missing) > 10 else ''}; is a shard's output missing?")
    header, rows = _summary_rows(outputs, records)
    merged = RunRecord(first.kit, first.rubric, first.plan, first.submissions, tuple(owner))
    _write_merged(out, owner, header, rows, merged)
    return merged


def _short(value: Any) -> str:
    text = value if isinstance(value, str) else _sha(value)
    return text[:12]


def _summary_rows(outputs: Sequence[Path], records: Sequence[RunRecord]) -> tuple[list[str], list[list[str]]]:
    header: list[str] | None = None
    rows: list[list[str]] = []
    for output, record in zip(outputs, records):
        path = output / "summary.csv"
        try:
            with open(path, newline="", encoding="utf-8") as fh:
                table = list(csv.reader(fh))
        except (OSError, UnicodeDecodeError, csv.Error) as exc:
            raise MergeError(f"{path}: unreadable ({exc})") from None
        if not table:
            raise MergeError(f"{path}: empty")
        names = [row[0] for row in table[1:] if row]
        if sorted(names) != sorted(record.graded):
            raise MergeError(f"{path}: its rows ({len(names)}) are not the submissions its {RECORD} says it graded")
        for name in names:
            if not (output / name / "results.json").is_file():
                raise MergeError(f"{output / name / 'results.json'}: missing")
        if not names:
            continue  # an empty shard's header names no test
        if header is not None and table[0] != header:
            raise MergeError(f"{path}: its columns differ from the other outputs'")
        header = table[0]
        rows += [row for row in table[1:] if row]
    return header or ["submission", "score", "max_score", "execution_time"], sorted(rows, key=lambda r: r[0])


def _write_merged(out: Path, owner: Mapping[str, Path], header: list[str], rows: list[list[str]],
                  record: RunRecord) -> None:
    """Build the merged output beside ``out`` and move it into place only when complete."""
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.merging-", dir=out.parent))
    try:
        os.chmod(staging, 0o755)  # as a folder `cbatch grade` makes, not mkdtemp's private one
        for name, source in sorted(owner.items()):
            shutil.copytree(source / name, staging / name, symlinks=True)
        with open(staging / "summary.csv", "w", newline="", encoding="utf-8") as fh:
            writer = csv.writer(fh)
            writer.writerow(header)
            writer.writerows(rows)
        record.write(staging)
        if out.exists():
            out.rmdir()  # empty, checked above
        os.replace(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
