"""The pinned verdicts of ``check_report``: cases, how each is judged, and the snapshot file.

A case is a trace and config; every shipped broken scheduler and the reference
run it, and seeded corruptions of the reference's report (an event dropped,
duplicated or moved, a number nudged) are judged too.  The snapshot in
``data/contract_violations.json`` holds the cases and, per (source, case), the
sorted violations as ``[clause, request, event index, message]``.  It was
captured from the checker before its indexing was rewritten, so
``test_contract_snapshot`` fails if a change to how clauses are computed
changes any verdict.  A deliberate change to what a clause judges refreshes it:

    python tests/contract_snapshot.py   # rewrites tests/data/contract_violations.json
"""

from __future__ import annotations

import copy
import json
import random
import sys
from pathlib import Path
from typing import Any, Callable, Iterator

SNAPSHOT = Path(__file__).resolve().parent / "data" / "contract_violations.json"
GENERATED = 30     # seeded generated cases besides the fixed workloads
CORRUPTIONS = 6    # seeded corruptions of the reference's report per case
SKIPPED = {"nondeterministic_pages"}  # its report differs on every run: nothing to pin

Row = list[Any]


def generated_cases(count: int = GENERATED, seed: int = 2026) -> list[dict[str, Any]]:
    """Small seeded traces under tight pools, both admission policies, so preemption and blocking happen."""
    rng = random.Random(seed)
    cases = []
    for n in range(count):
        trace, t = [], 0
        for i in range(rng.randint(1, 8)):
            t += rng.randint(0, 3)
            trace.append({"time": t, "event": "arrival", "id": f"r{i}", "prompt_tokens": rng.randint(1, 16),
                          "output_tokens": rng.randint(1, 12)})
            for _ in range(rng.choice((0, 0, 0, 1, 2))):
                trace.append({"time": t + rng.randint(0, 20), "event": "cancel", "id": f"r{i}"})
        trace.sort(key=lambda line: line["time"])
        config = {"capacity": rng.randint(1, 16), "block_size": rng.randint(1, 8),
                  "token_budget": rng.randint(1, 12), "max_active": rng.randint(1, 6),
                  "prefill_chunk": rng.randint(1, 8), "release_delay": rng.randint(0, 3),
                  "policy": rng.choice(("continuous", "serial")),
                  "admission": rng.choice(("reserve", "optimistic"))}
        cases.append({"name": f"generated_{n}", "trace": trace, "config": config})
    return cases


def all_cases() -> list[dict[str, Any]]:
    """The fixed workloads (as they are now) and the generated cases."""
    from pytest_cbatch.workloads import WORKLOADS

    fixed = [{"name": w.name, "trace": list(w.trace), "config": w.config} for w in WORKLOADS.values()]
    return fixed + generated_cases()


def _nudge(report: dict[str, Any], rng: random.Random) -> None:
    """Change one integer field of one event, dispatch row or request row by one."""
    places: list[tuple[dict[str, Any], str]] = []
    for ev in report["events"]:
        places += [(ev, k) for k, v in ev.items() if type(v) is int and k != "time"]
        for row in ev.get("work", ()):
            places += [(row, k) for k, v in row.items() if type(v) is int]
    for row in report["requests"].values():
        places += [(row, k) for k, v in row.items() if type(v) is int]
    if places:
        target, key = rng.choice(places)
        target[key] = max(0, target[key] + rng.choice((-1, 1)))


def corruptions(report: dict[str, Any], count: int, seed: int) -> Iterator[dict[str, Any]]:
    """``count`` seeded corruptions of ``report`` (drop, duplicate, move or retime an event, nudge a number)."""
    rng = random.Random(seed)
    for _ in range(count):
        bad = copy.deepcopy(report)
        events = bad["events"]
        kind = rng.choice(("drop", "duplicate", "move", "retime", "nudge", "nudge"))
        if kind == "nudge" or len(events) < 2:
            _nudge(bad, rng)
        else:
            i = rng.randrange(len(events))
            if kind == "drop":
                del events[i]
            elif kind == "duplicate":
                events.insert(i, copy.deepcopy(events[i]))
            elif kind == "move":
                events.insert(rng.randrange(len(events)), events.pop(i))
            else:
                events[i]["time"] = max(0, events[i]["time"] + rng.choice((-1, 1)))
        yield bad


def _rows(violations: list[Any]) -> list[Row]:
    return sorted(([v.clause, v.request, v.event_index, v.message] for v in violations),
                  key=lambda r: json.dumps(r))


def verdicts(cases: list[dict[str, Any]],
             check: Callable[..., list[Any]] | None = None) -> dict[str, list[Row]]:
    """``"source/case" -> violations`` for every non-empty verdict; ``check`` defaults to ``check_report``."""
    from pytest_cbatch.contract import check_report
    from pytest_cbatch.examples.broken_schedulers import BROKEN
    from pytest_cbatch.reference.scheduler_sim import simulate

    check = check or check_report
    sources = {"reference": simulate, **{n: fn for n, (fn, _) in BROKEN.items() if n not in SKIPPED}}
    out: dict[str, list[Row]] = {}
    for case in cases:
        trace, config = case["trace"], case["config"]
        for name, fn in sources.items():
            try:
                report = fn(copy.deepcopy(trace), **copy.deepcopy(config))
            except Exception as exc:  # a broken scheduler may refuse a case: pin that too
                out[f"{name}/{case['name']}"] = [["raised", None, None, type(exc).__name__]]
                continue
            found = _rows(check(report, trace, config, max_per_clause=10**6))
            if found:
                out[f"{name}/{case['name']}"] = found
            if name == "reference":
                for k, bad in enumerate(corruptions(report, CORRUPTIONS, seed=hash_name(case["name"]))):
                    found = _rows(check(bad, trace, config, max_per_clause=10**6))
                    out[f"corrupted_{k}/{case['name']}"] = found
    return out


def hash_name(name: str) -> int:
    """A seed from a case name that does not depend on PYTHONHASHSEED."""
    return sum((i + 1) * ord(c) for i, c in enumerate(name))


def main() -> None:
    cases = all_cases()
    SNAPSHOT.parent.mkdir(exist_ok=True)
    found = verdicts(cases)
    lines = [f"  {json.dumps(key)}: {json.dumps(rows)}" for key, rows in sorted(found.items())]
    SNAPSHOT.write_text('{"cases": ' + json.dumps(cases) + ',\n"violations": {\n' + ",\n".join(lines) + "\n}}\n")
    print(f"wrote {SNAPSHOT} ({SNAPSHOT.stat().st_size} bytes)", file=sys.stderr)


if __name__ == "__main__":
    main()
