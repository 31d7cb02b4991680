"""Mutation campaign: the reference files mutated by cosmic-ray, the conformance checks as the killing test.

Usage (from a checkout, with the ``mutation`` extra installed; the machine is shared, so be nice)::

    nice -n 15 python benchmarks/mutation/campaign.py run [--target sim|faults] [--sample 320] [--seed 17]
    nice -n 15 python benchmarks/mutation/campaign.py rejudge   # survivors again, after closing gaps
    python benchmarks/mutation/campaign.py report      # rewrite docs/mutation.md from the results

``run`` copies the target file into ``build/mutation/<target>/`` (the checkout's
reference is never touched: cosmic-ray edits the copy in place), asks
``cosmic-ray init`` for every mutant of the copy, keeps those inside the
target's scope (``SCOPES``: the code the conformance contract judges), draws a
fixed sample of ``--sample`` of them with ``random.Random(seed)`` (in a stable
order, so the same seed and the same file give the same sample), marks the rest
skipped, and lets ``cosmic-ray exec`` run the killing test
(``benchmarks/mutation/kill.py``) on each sampled mutant.  A campaign stopped
half way resumes where it stopped (``run`` again with the same arguments).
``rejudge`` judges the survivors again once gaps are closed.  The outcome of
every sampled mutant goes to
``benchmarks/mutation/results/<target>.json``; ``report`` merges it with the
survivor classes of ``benchmarks/mutation/survivors.toml`` into ``docs/mutation.md``.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import random
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
RESULTS = HERE / "results"
SURVIVORS = HERE / "survivors.toml"
DOC = ROOT / "docs" / "mutation.md"
TRACES_SEED = 20261201
BUDGETS = {"sim": 20, "faults": 60}
"""CPU seconds the killing test may use per mutant (about ten times the unmutated run) before a mutant counts
as timed out (a runaway)."""
WALL_PER_CPU = 30
"""cosmic-ray's own wall-clock timeout, as a multiple of the CPU budget: a backstop on a loaded machine."""
TRACES_PER_ADMISSION = 40


@dataclass(frozen=True)
class Scope:
    """One campaign target: the file, the top-level names (classes, functions, constants) mutated in it,
    the methods left out, and how the killing test judges it."""

    file: str
    summary: str
    names: tuple[str, ...]
    excluded_methods: tuple[str, ...]
    judged_by: str


SCOPES: dict[str, Scope] = {
    # simulate()'s path: validation, the Scheduler as simulate drives it, the report.  Left out: the
    # command line, the demo trace, DEFAULT_CONFIG (the CLI's defaults), PagedKV (the lifecycle
    # allocator, judged by the allocator machine), and Scheduler.step/pool_stats/verify (live serving
    # and check=True only; simulate with the suite's configs never calls them).
    "sim": Scope(
        "scheduler_sim.py",
        "simulate() and what it runs: trace and config validation, the Scheduler (less step, pool_stats, "
        "verify), drive, the report",
        ("SCHEMA_VERSION", "TIME_UNIT", "TRACE_FIELDS", "CONFIG_CHOICES", "_is_int", "_check_line",
         "validate_trace", "validate_config", "_ceil_div", "_Request", "Scheduler", "simulate", "drive"),
        ("step", "pool_stats", "verify"),
        "every report and runner clause on the fixed workloads, the invalid inputs and "
        f"{2 * TRACES_PER_ADMISSION} seeded generated traces",
    ),
    # The two lifecycle parts of the file.  Left out: demo() and the command line (the contract judges
    # the classes, not the demo document).
    "faults": Scope(
        "scheduler_faults.py",
        "RecomputeRequest, Transfer, TransferManager (less demo() and the command line)",
        ("ABORT_REASONS", "_LIVE", "RecomputeRequest", "Transfer", "TransferManager"),
        (),
        "the recompute and transfer lifecycle machines (ci profile: 100 derandomized examples each)",
    ),
}


def scope_lines(source: str, scope: Scope) -> list[tuple[int, int]]:
    """The (first, last) line ranges of the scope's names in ``source``, minus its excluded methods."""
    tree = ast.parse(source)
    included: list[tuple[int, int]] = []
    excluded: list[tuple[int, int]] = []
    found: set[str] = set()
    for node in tree.body:
        names = set(_node_names(node))
        found |= names
        if not names & set(scope.names):
            continue
        included.append((node.lineno, node.end_lineno or node.lineno))
        if isinstance(node, ast.ClassDef):
            excluded += [(m.lineno - len(m.decorator_list), m.end_lineno or m.lineno) for m in node.body
                         if isinstance(m, ast.FunctionDef) and m.name in scope.excluded_methods]
    missing = sorted(set(scope.names) - found)
    if missing:
        raise SystemExit(f"campaign: {scope.file} no longer defines {', '.join(missing)}; update SCOPES")
    return _subtract(included, excluded)


def _node_names(node: ast.stmt) -> list[str]:
    if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
        return [node.name]
    if isinstance(node, ast.Assign):
        return [t.id for t in node.targets if isinstance(t, ast.Name)]
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return [node.target.id]
    return []


def _subtract(included: list[tuple[int, int]], excluded: list[tuple[int, int]]) -> list[tuple[int, int]]:
    lines = {n for a, b in included for n in range(a, b + 1)} - {n for a, b in excluded for n in range(a, b + 1)}
    out: list[tuple[int, int]] = []
    for n in sorted(lines):
        if out and out[-1][1] == n - 1:
            out[-1] = (out[-1][0], n)
        else:
            out.append((n, n))
    return out


def mutant_id(mutation: Any) -> str:
    """A stable name for a mutant: line:column, operator and its occurrence in the file (what cosmic-ray applies)."""
    line, col = mutation.start_pos
    return f"L{line}:{col} {mutation.operator_name}#{mutation.occurrence}"


def generated_traces(seed: int = TRACES_SEED, per_admission: int = TRACES_PER_ADMISSION) -> list[list[Any]]:
    """A fixed list of ``[trace, config]`` drawn from the kit's strategies with a fixed hypothesis seed."""
    from hypothesis import Phase, given, settings
    from hypothesis import seed as hypothesis_seed

    from pytest_cbatch import strategies
    from pytest_cbatch.reference.scheduler_sim import validate_trace

    out: list[list[Any]] = []
    for admissions in (None, ["optimistic"]):
        drawn: list[list[Any]] = []

        @hypothesis_seed(seed)
        @settings(max_examples=per_admission, database=None, deadline=None, phases=[Phase.generate])
        @given(workload=strategies.workloads(admissions=admissions))
        def collect(workload: tuple[list[dict[str, Any]], dict[str, Any]]) -> None:
            drawn.append([validate_trace(workload[0]), dict(workload[1])])

        collect()
        out += drawn[:per_admission]
    return out


def _tool(name: str) -> str:
    found = shutil.which(name, path=os.path.dirname(sys.executable)) or shutil.which(name)
    if not found:
        raise SystemExit(f"campaign: {name} not found; install the extra: pip install -e '.[mutation]'")
    return found


def prepare(target: str, workdir: Path, sample: int, seed: int, budget: int) -> Path:
    """Lay out the copy, the traces, the config and the sampled session; return the session path."""
    from cosmic_ray.work_db import WorkDB, use_db
    from cosmic_ray.work_item import WorkerOutcome, WorkResult

    scope = SCOPES[target]
    folder = workdir / target
    session = workdir / f"{target}.sqlite"
    if session.exists():
        return session
    folder.mkdir(parents=True, exist_ok=True)
    for name in ("scheduler_sim.py", "scheduler_faults.py"):  # the course's layout: both files side by side
        shutil.copyfile(ROOT / "reference" / name, folder / name)
    kill = [sys.executable, str(HERE / "kill.py")]
    if target == "sim":
        traces = workdir / "traces.json"
        traces.write_text(json.dumps(generated_traces()), encoding="utf-8")
        command = kill + ["sim", str(folder / scope.file), "--traces", str(traces)]
    else:
        command = kill + ["faults", str(folder)]
    command += ["--budget", str(budget)]
    config = workdir / f"{target}.toml"
    config.write_text(
        "[cosmic-ray]\n"
        f"module-path = {json.dumps(str(folder / scope.file))}\n"
        f"timeout = {float(budget * WALL_PER_CPU)}\n"
        "excluded-modules = []\n"
        f"test-command = {json.dumps(' '.join(command))}\n"
        "[cosmic-ray.distributor]\n"
        'name = "local"\n',
        encoding="utf-8",
    )
    subprocess.run([_tool("cosmic-ray"), "init", str(config), str(session)], check=True)
    ranges = scope_lines((folder / scope.file).read_text(encoding="utf-8"), scope)
    with use_db(str(session), WorkDB.Mode.open) as db:
        items = list(db.work_items)
        inside = [i for i in items if any(a <= i.mutations[0].start_pos[0] <= b for a, b in ranges)]
        inside.sort(key=lambda i: (tuple(i.mutations[0].start_pos), mutant_id(i.mutations[0])))
        chosen = {i.job_id for i in random.Random(seed).sample(inside, min(sample, len(inside)))}
        db.set_multiple_results([i.job_id for i in items if i.job_id not in chosen],
                                WorkResult(worker_outcome=WorkerOutcome.SKIPPED))
    (workdir / f"{target}.meta.json").write_text(json.dumps(
        {"mutants_total": len(items), "mutants_in_scope": len(inside), "sample": len(chosen), "seed": seed}),
        encoding="utf-8")
    return session


def sessions(target: str, workdir: Path) -> list[Path]:
    """The target's session files: the first one ``prepare`` made, then one per extra worker."""
    return [workdir / f"{target}.sqlite"] + sorted(workdir.glob(f"{target}.w*.sqlite"))


def add_workers(target: str, workdir: Path, workers: int) -> None:
    """Share the target's pending mutants among ``workers`` sessions, each mutating its own copy.

    Worker k gets the pending mutants at positions k, k + workers, ... (in mutant-id order); each
    session marks the others' mutants skipped.  Done once: later runs reuse the sessions.
    """
    import sqlite3

    have = sessions(target, workdir)
    if workers <= 1 or len(have) > 1:
        return
    base, folder, config = have[0], workdir / target, (workdir / f"{target}.toml").read_text(encoding="utf-8")
    with sqlite3.connect(base) as db:
        rows = db.execute("SELECT m.job_id, m.start_pos_row, m.start_pos_col, m.operator_name, m.occurrence "
                          "FROM mutation_specs m LEFT JOIN work_results r ON r.job_id = m.job_id "
                          "WHERE r.job_id IS NULL").fetchall()
    rows.sort(key=lambda r: (r[1], r[2], r[3], r[4]))
    share = {job: i % workers for i, (job, *_rest) in enumerate(rows)}
    skip = "INSERT OR REPLACE INTO work_results (worker_outcome, job_id) VALUES ('SKIPPED', ?)"
    for k in range(1, workers):
        copy_folder, session = workdir / f"{target}.w{k}", workdir / f"{target}.w{k}.sqlite"
        shutil.copytree(folder, copy_folder, dirs_exist_ok=True)
        with sqlite3.connect(base) as src, sqlite3.connect(session) as dst:
            src.backup(dst)
        with sqlite3.connect(session) as db:
            db.execute("UPDATE mutation_specs SET module_path = replace(module_path, ?, ?)",
                       (str(folder) + os.sep, str(copy_folder) + os.sep))
            db.execute("UPDATE work_results SET worker_outcome = 'SKIPPED', test_outcome = NULL, output = NULL, "
                       "diff = NULL")  # judged in the first session
            db.executemany(skip, [(job,) for job, w in share.items() if w != k])
        text = config.replace(str(folder) + os.sep, str(copy_folder) + os.sep).replace(
            str(folder) + " ", str(copy_folder) + " ")
        (workdir / f"{target}.w{k}.toml").write_text(text, encoding="utf-8")
    with sqlite3.connect(base) as db:
        db.executemany(skip, [(job,) for job, w in share.items() if w != 0])


def execute(target: str, workdir: Path) -> None:
    """``cosmic-ray exec`` on every session of the target at once (one process per worker)."""
    procs = []
    for session in sessions(target, workdir):
        config = session.with_suffix(".toml")
        procs.append(subprocess.Popen([_tool("cosmic-ray"), "exec", str(config), str(session)]))
    failed = [p.args for p in procs if p.wait() != 0]
    if failed:
        raise SystemExit(f"campaign: cosmic-ray exec failed: {failed}")


def collect(target: str, workdir: Path) -> dict[str, Any]:
    """The sampled mutants' outcomes: killed (with the first failing check), survived (with the diff), timed out."""
    from cosmic_ray.work_db import WorkDB, use_db

    meta = json.loads((workdir / f"{target}.meta.json").read_text(encoding="utf-8"))
    mutants: dict[str, dict[str, Any]] = {}
    pending = 0
    for session in sessions(target, workdir):
        with use_db(str(session), WorkDB.Mode.open) as db:
            for item, result in db.completed_work_items:
                if result.worker_outcome != "skipped":
                    row = _row(item.mutations[0], result)
                    mutants[row["id"]] = row
            pending += sum(1 for _ in db.pending_work_items)
    return {"target": target, "file": f"reference/{SCOPES[target].file}", "scope": SCOPES[target].summary, **meta,
            "judged_by": SCOPES[target].judged_by, "pending": pending,
            "mutants": sorted(mutants.values(), key=lambda r: (r["line"], r["id"]))}


def _row(mutation: Any, result: Any) -> dict[str, Any]:
    output = (result.output or "").strip()
    if result.worker_outcome != "normal":
        outcome = "incompetent" if result.worker_outcome != "no-test" else "no-test"
    elif result.test_outcome == "survived":
        outcome = "survived"
    elif output == "timeout" or output.startswith("timed out"):
        outcome = "timed out"
    else:
        outcome = "killed"
    row: dict[str, Any] = {"id": mutant_id(mutation), "line": mutation.start_pos[0], "outcome": outcome}
    if outcome == "killed":
        by = next((ln[len("killed: "):] for ln in output.splitlines() if ln.startswith("killed: ")),
                  output.splitlines()[-1] if output else "")
        row["by"] = by.replace(str(ROOT) + "/", "")[:160]  # paths relative to the checkout, as the table shows
    if outcome in ("survived", "incompetent"):
        row["diff"] = _short_diff(result.diff or output)
    return row


def _short_diff(diff: str) -> str:
    return "\n".join(ln for ln in diff.splitlines() if ln[:1] in "+-" and not ln.startswith(("+++", "---")))


def _write(target: str, workdir: Path) -> dict[str, Any]:
    RESULTS.mkdir(exist_ok=True)
    result = collect(target, workdir)
    (RESULTS / f"{target}.json").write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    print(f"{target}: {len(result['mutants'])} judged, {result['pending']} pending -> {RESULTS / (target + '.json')}")
    return result


def run(targets: list[str], workdir: Path, sample: int, seed: int, workers: int) -> None:
    for target in targets:
        prepare(target, workdir, sample, seed, BUDGETS[target])
        add_workers(target, workdir, workers)
        execute(target, workdir)
        _write(target, workdir)


def rejudge(targets: list[str], workdir: Path, workers: int) -> None:
    """Judge every survivor and every timed-out mutant again with the kit and budgets as they are now.

    Adding workloads and checks only adds ways to fail, so a mutant killed before stays killed; a
    timed-out one is judged again so that only a runaway under the CPU budget counts as timed out.
    """
    import sqlite3

    for target in targets:
        gone = 0
        for session in sessions(target, workdir):
            with sqlite3.connect(session) as db:
                gone += db.execute("DELETE FROM work_results WHERE test_outcome = 'SURVIVED' OR (test_outcome = "
                                   "'KILLED' AND (output = 'timeout' OR output LIKE 'timed out%'))").rowcount
            config = session.with_suffix(".toml")
            text = re.sub(r"(?m)^timeout = .*$", f"timeout = {float(BUDGETS[target] * WALL_PER_CPU)}",
                          config.read_text(encoding="utf-8"))
            config.write_text(re.sub(r"--budget \d+", f"--budget {BUDGETS[target]}", text), encoding="utf-8")
        print(f"{target}: judging {gone} survivors and timed-out mutants again")
        add_workers(target, workdir, workers)
        execute(target, workdir)
        _write(target, workdir)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Mutation campaign on the reference files (cosmic-ray).")
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="prepare (or resume) and execute the sampled campaign")
    r.add_argument("--target", choices=list(SCOPES), action="append", help="default: every target")
    r.add_argument("--sample", type=int, default=320, help="mutants drawn per file (default 320)")
    r.add_argument("--seed", type=int, default=17, help="the sampling seed (default 17)")
    r.add_argument("--workdir", type=Path, default=ROOT / "build" / "mutation")
    r.add_argument("--workers", type=int, default=1, help="share a target's mutants among N processes (default 1)")
    c = sub.add_parser("collect", help="write the results of a campaign so far (a running one too)")
    c.add_argument("--target", choices=list(SCOPES), action="append")
    c.add_argument("--workdir", type=Path, default=ROOT / "build" / "mutation")
    j = sub.add_parser("rejudge", help="judge the survivors again with the kit as it is now")
    j.add_argument("--target", choices=list(SCOPES), action="append")
    j.add_argument("--workdir", type=Path, default=ROOT / "build" / "mutation")
    j.add_argument("--workers", type=int, default=1, help="share them among N processes (default 1)")
    sub.add_parser("report", help="rewrite docs/mutation.md from the results and survivors.toml")
    args = parser.parse_args(argv)
    if args.command == "run":
        run(args.target or list(SCOPES), args.workdir, args.sample, args.seed, args.workers)
    elif args.command == "rejudge":
        rejudge(args.target or list(SCOPES), args.workdir, args.workers)
    elif args.command == "collect":
        for target in args.target or list(SCOPES):
            _write(target, args.workdir)
    else:
        from report import write_report

        write_report(RESULTS, SURVIVORS, DOC)
    return 0


if __name__ == "__main__":
    sys.exit(main())
