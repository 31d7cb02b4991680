"""The fork campaign: the vLLM gate run on one-edit bugs and legitimate policy changes of vLLM's scheduler.

Each edit of ``cbatch_vllm.fork_edits`` is applied to a copy of the scheduler or KV cache module
(from the installed vLLM, or from ``--engine-src``: the directory holding a fork's ``vllm``
package); an edit whose text no longer occurs exactly once is reported as not applied, never run
unedited.  The gate a fork's CI runs then runs on it in a child process, with vLLM's own
assertions off (``python -O``, as many deployments run) unless ``--keep-asserts``::

    pytest --cbatch-impl=vllm --cbatch-profile=ci --cbatch-config release_delay=0 \\
        --cbatch-expect=examples/vllm/cbatch-expect.toml --cbatch-expect-strict

The table says, per edit, what it is expected to do (fail / stay green) and what tripped: the
clauses named by failing tests, ``strict`` for a stale expectation, ``completes`` when the
adapter stopped the run (no progress, or an engine exception), ``hung`` past ``--timeout``.
Run it with the Python of the vLLM venv (``.ci/vllm-venv``), from anywhere::

    ~/.cache/pytest-cbatch/vllm-venv/bin/python benchmarks/fork_campaign.py [--edits NAME ...]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from cbatch_vllm import fork
from cbatch_vllm.fork_edits import EDITS, edit_named
from pytest_cbatch.contract import CLAUSES, RUNNER_CLAUSES
from pytest_cbatch.runner import ALL_CLAUSES

ROOT = Path(__file__).resolve().parent.parent
GATE = ["-m", "pytest", "--cbatch-impl=vllm", "--cbatch-profile=ci", "--cbatch-config", "release_delay=0",
        "--cbatch-expect=examples/vllm/cbatch-expect.toml", "--cbatch-expect-strict", "-q", "-p", "no:cacheprovider",
        "-W", "ignore::DeprecationWarning"]
_CLAUSE = re.compile(r"\[([a-z_]+)[\]-]")
KNOWN = {*ALL_CLAUSES, *CLAUSES, *RUNNER_CLAUSES}


@dataclass
class Outcome:
    """What the gate did on one edit."""

    name: str
    kind: str
    tripped: list[str]
    seconds: float
    note: str = ""

    @property
    def verdict(self) -> str:
        caught = [c for c in self.tripped if c.split(" ")[0] in KNOWN - {"completes"}]
        if self.kind == "policy":
            return "ok (green)" if not self.tripped else "WRONG: red on a legitimate change"
        if caught:
            return "ok (clause)"
        return "WRONG: green" if not self.tripped else "WRONG: no clause"


def _tripped(junit: Path) -> list[str]:
    """What the failing tests of a JUnit XML file name: clauses (``completes`` when the adapter stopped
    or the engine raised), ``strict (test)`` for a stale expectation, ``other (test function)`` for a
    failure naming no clause; each with "xN" when N tests name it, most frequent first."""
    counts: dict[str, int] = {}
    for case in ET.parse(junit).iter("testcase"):
        for bad in [*case.iter("failure"), *case.iter("error")]:
            text = f"{case.get('name', '')} {bad.get('message', '')} {bad.text or ''}"
            if "XPASS(strict)" in text:  # the test's clause passed: a stale expectation, not a catch
                names = {f"strict ({case.get('name', '')})"}
            else:
                names = {m for m in _CLAUSE.findall(text) if m in KNOWN}
            if not names:
                names.add(f"other ({case.get('name', '').split('[')[0]})")
            for name in names:
                counts[name] = counts.get(name, 0) + 1
    return [name if n == 1 else f"{name} x{n}" for name, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))]


def run_gate(sources: dict[str, str], *, timeout: float, keep_asserts: bool,
             extra: Sequence[str]) -> tuple[list[str], float, str]:
    """Run the gate with ``sources`` (module -> edited source) overlaid; (tripped, seconds, note)."""
    with tempfile.TemporaryDirectory(prefix="cbatch-fork-") as work:
        overlay = fork.write_overlay(Path(work) / "overlay", sources)
        junit = Path(work) / "gate.xml"
        env = {**os.environ, fork.OVERLAY_ENV: str(overlay), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
               "VLLM_CACHE_ROOT": str(Path(work) / "vllm-cache"), "PYTHONDONTWRITEBYTECODE": "1"}
        cmd = [sys.executable, *([] if keep_asserts else ["-O"]), *GATE, f"--junitxml={junit}", *extra]
        start = time.monotonic()
        try:
            proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return ["hung"], time.monotonic() - start, f"no verdict within {timeout:.0f} s"
        seconds = time.monotonic() - start
        if not junit.exists():
            return ["other: no report"], seconds, proc.stdout[-300:] + proc.stderr[-300:]
        tripped = _tripped(junit)
        if proc.returncode not in (0, 1):
            tripped.append(f"exit {proc.returncode}")
        return tripped, seconds, ""


def main(argv: Sequence[str] | None = None) -> int:
    """The CLI (module docstring); exit 1 when any edit's verdict is wrong or did not apply."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--engine-src", metavar="DIR", help="directory holding the vllm package to edit "
                                                              "(default: the installed vLLM)")
    parser.add_argument("--edits", nargs="*", metavar="NAME", help="only these edits (default: all, after the "
                                                                    "unedited engine)")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per gate run (default 900)")
    parser.add_argument("--keep-asserts", action="store_true", help="run vLLM with its own assertions on")
    parser.add_argument("--list", action="store_true", help="list the edits and exit")
    parser.add_argument("pytest_args", nargs="*", help="more arguments for the gate's pytest (after --)")
    args = parser.parse_args(argv)
    edits = [edit_named(name) for name in args.edits] if args.edits else list(EDITS)
    if args.list:
        for edit in edits:
            print(f"{edit.name:32} {edit.kind:6} {edit.module}: {edit.what}")
        return 0
    rows: list[Outcome] = []
    if not args.edits:
        tripped, seconds, note = run_gate({}, timeout=args.timeout, keep_asserts=args.keep_asserts,
                                          extra=args.pytest_args)
        rows.append(Outcome("(unedited engine)", "policy", tripped, seconds, note))
        _print_row(rows[-1])
    failed = False
    for edit in edits:
        try:
            source = fork.apply(fork.module_file(edit.module, args.engine_src).read_text(encoding="utf-8"), edit)
        except (fork.EditNotApplied, OSError) as exc:
            print(f"{edit.name}: not applied: {exc}", file=sys.stderr)
            failed = True
            continue
        tripped, seconds, note = run_gate({edit.module: source}, timeout=args.timeout,
                                          keep_asserts=args.keep_asserts, extra=args.pytest_args)
        rows.append(Outcome(edit.name, edit.kind, tripped, seconds, note))
        _print_row(rows[-1])
    print()
    print("| edit | expected | what tripped | verdict | s |")
    print("|---|---|---|---|---|")
    for row in rows:
        expected = "green" if row.kind == "policy" else "a clause fails"
        print(f"| `{row.name}` | {expected} | {', '.join(row.tripped) or 'green'} | {row.verdict} | "
              f"{row.seconds:.0f} |")
    return 1 if failed or any(row.verdict.startswith("WRONG") for row in rows) else 0


def _print_row(row: Outcome) -> None:
    print(f"{row.name}: {', '.join(row.tripped) or 'green'} -> {row.verdict} ({row.seconds:.0f} s) {row.note}",
          flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
