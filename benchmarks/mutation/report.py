"""Render docs/mutation.md from the campaign results and the survivor classes (pure: no cosmic-ray needed).

``results/<target>.json`` holds every sampled mutant's outcome (``campaign.py``
writes it); ``survivors.toml`` gives each survivor its class and the reason,
and names the gaps a first campaign found and the workload or check that closed
them.  A survivor without a class is an open gap: counted in the table's gap column
and shown as such (tests/test_mutation_table.py demands none).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

__all__ = ["CLASSES", "load", "render", "score", "survivor_class", "write_report"]

CLASSES = {
    "dead code": "the mutated code never runs on simulate's path, or its effect is overwritten before anyone reads it",
    "no effect": "the mutated code runs, but every report (or every lifecycle call) is unchanged",
    "freedom": "a different but legitimate choice the contract deliberately leaves free (named in the reason)",
}
"""The equivalent classes; a survivor outside them would be a gap, which the campaign closes instead."""

OUTCOMES = ("killed", "timed out", "survived", "no-test", "incompetent")


def load(results: Path, survivors: Path) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """The results per target and the parsed survivors file."""
    found = {p.stem: json.loads(p.read_text(encoding="utf-8")) for p in sorted(results.glob("*.json"))}
    classes = tomllib.loads(survivors.read_text(encoding="utf-8")) if survivors.exists() else {}
    return found, classes


def survivor_class(classes: dict[str, Any], target: str, mid: str) -> dict[str, str] | None:
    """The class and reason survivors.toml gives a survivor, or None when it has none (an open gap)."""
    entry = classes.get(target, {}).get(mid)
    if not entry or entry.get("class") not in CLASSES or not entry.get("why", "").strip():
        return None
    return entry


def score(result: dict[str, Any], classes: dict[str, Any]) -> dict[str, Any]:
    """Counts for one target: each outcome, equivalent survivors, open gaps, and the score over the
    non-equivalent mutants."""
    counts = dict.fromkeys(OUTCOMES, 0)
    for m in result["mutants"]:
        counts[m["outcome"]] += 1
    equivalent = sum(1 for m in result["mutants"] if m["outcome"] == "survived"
                     and survivor_class(classes, result["target"], m["id"]))
    judged = len(result["mutants"]) - counts["no-test"] - counts["incompetent"]
    killed = counts["killed"] + counts["timed out"]
    non_equivalent = judged - equivalent
    return {**counts, "equivalent": equivalent, "gaps": counts["survived"] - equivalent, "judged": judged,
            "score": killed / non_equivalent if non_equivalent else 1.0,
            "raw": killed / judged if judged else 1.0}


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _change(diff: str) -> str:
    lines = [ln for ln in diff.splitlines() if ln.startswith("+")]
    return "`" + _cell(" ".join(ln[1:].strip() for ln in lines) or "(line removed)") + "`"


def render(results: dict[str, dict[str, Any]], classes: dict[str, Any]) -> str:
    """The whole of docs/mutation.md."""
    out = [
        "# Mutation score of the conformance kit",
        "",
        "How strong are the kit's verdicts?  A mutation campaign answers with a number: mutate the reference",
        "implementation one small change at a time (a `<` for a `<=`, a `1` for a `0`, a loop that never runs)",
        "and count the mutants the conformance checks reject.  A mutant that survives is either equivalent (it",
        "changes nothing a correct scheduler is held to) or a gap in the kit, which is then closed with a fixed",
        "workload or a sharper check, never with a clause that demands what only the reference happens to do.",
        "",
        "Tool: [cosmic-ray](https://cosmic-ray.readthedocs.io) (the `mutation` extra), every default operator.",
        "Killing test: `benchmarks/mutation/kill.py`, the shipped conformance checks on the mutated copy, stopping",
        "at the first failure; a run past its CPU budget (about ten times the unmutated run) counts as *timed out*,",
        "a runaway the kit's time bounds stop.",
        "Reproduce: `nice -n 15 python benchmarks/mutation/campaign.py run [--workers N]`, then `... rejudge` (the",
        "survivors and timed-out mutants again, after closing gaps) and `... report` (rewrites this page from",
        "`benchmarks/mutation/results/` and the survivor classes of `benchmarks/mutation/survivors.toml`).",
        "The same seed and the same reference files draw the same sample.",
        *([""] + [classes["campaign"]["note"].strip()] if classes.get("campaign", {}).get("note") else []),
        "",
        "| file | scope | judged by | mutants in scope | sampled (seed) | killed | timed out | survived: equivalent "
        "| survived: gap | score |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    scores = {}
    for target, result in results.items():
        s = scores[target] = score(result, classes)
        out.append(
            f"| `{result['file']}` | {_cell(result.get('scope', ''))} | {_cell(result['judged_by'])} "
            f"| {result['mutants_in_scope']} | {result['sample']} ({result['seed']}) | {s['killed']} "
            f"| {s['timed out']} | {s['equivalent']} | {s['gaps']} | **{s['score']:.0%}** |"
        )
    pending = {t: r["pending"] for t, r in results.items() if r.get("pending")}
    if pending:
        out += ["", "Campaign still running: " + ", ".join(f"{t}: {n} mutants not yet judged" for t, n in pending.items())
                + "."]
    out += [
        "",
        "Score: killed and timed-out mutants over the sampled mutants that are not equivalent. Raw kill rate "
        "(over every sampled mutant): " + ", ".join(f"{results[t]['file']} {s['raw']:.0%}" for t, s in scores.items())
        + ".",
        "",
        "## Survivors",
        "",
        "Every surviving mutant, with its class: " + "; ".join(f"*{k}*: {v}" for k, v in CLASSES.items()) + ".",
        "",
    ]
    for target, result in results.items():
        tally: dict[str, int] = {}
        for m in result["mutants"]:
            if m["outcome"] == "survived":
                entry = survivor_class(classes, target, m["id"])
                name = entry["class"] if entry else "gap (open)"
                tally[name] = tally.get(name, 0) + 1
        out.append(f"- `{result['file']}`: " + (", ".join(f"{n} {c}" for c, n in sorted(tally.items())) or "none"))
    out += [
        "",
        "| file | mutant | mutated to | class | why |",
        "|---|---|---|---|---|",
    ]
    for target, result in results.items():
        for m in result["mutants"]:
            if m["outcome"] != "survived":
                continue
            entry = survivor_class(classes, target, m["id"]) or {"class": "**gap (open)**", "why": "not classified yet"}
            out.append(f"| `{result['file']}` | `{m['id']}` | {_change(m.get('diff', ''))} | {entry['class']} "
                       f"| {_cell(entry['why'].strip())} |")
    closed = classes.get("closed", [])
    if closed:
        out += ["", "## Gaps closed", "",
                "Mutants that survived a first campaign and are killed now, and what kills them.", "",
                "| file | mutant | closed by | killed now by |", "|---|---|---|---|"]
        for entry in closed:
            result = results.get(entry["target"], {})
            now = next((m for m in result.get("mutants", []) if m["id"] == entry["id"]), {})
            verdict = now.get("by", now.get("outcome", "not sampled"))
            out.append(f"| `{result.get('file', entry['target'])}` | `{entry['id']}` | {_cell(entry['closed_by'])} "
                       f"| {_cell(verdict)} |")
    return "\n".join(out) + "\n"


def write_report(results: Path, survivors: Path, doc: Path) -> None:
    found, classes = load(results, survivors)
    doc.write_text(render(found, classes), encoding="utf-8")
    print(f"wrote {doc}")
