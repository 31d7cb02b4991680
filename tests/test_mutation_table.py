"""docs/mutation.md stays honest: its counts add up, every survivor has a class, closed gaps are killed.

The campaign itself (cosmic-ray, minutes of CPU) runs by hand, see benchmarks/mutation/campaign.py;
these checks read its committed results and need no cosmic-ray.
"""

from __future__ import annotations

import copy
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent
HERE = ROOT / "benchmarks" / "mutation"


def _module(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"mutation_{name}", HERE / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


report = _module("report")
campaign = _module("campaign")


@pytest.fixture(scope="module")
def loaded() -> tuple[dict, dict]:
    return report.load(HERE / "results", HERE / "survivors.toml")


def test_the_page_is_what_the_results_and_classes_render(loaded: tuple[dict, dict]) -> None:
    results, classes = loaded
    assert (ROOT / "docs" / "mutation.md").read_text(encoding="utf-8") == report.render(results, classes), (
        "docs/mutation.md is stale: run python benchmarks/mutation/campaign.py report")


def test_every_target_was_sampled_in_full_and_its_counts_add_up(loaded: tuple[dict, dict]) -> None:
    results, classes = loaded
    assert set(results) == set(campaign.SCOPES)
    for target, result in results.items():
        assert result["pending"] == 0, f"{target}: the campaign has not finished"
        assert result["sample"] >= 300 or result["sample"] == result["mutants_in_scope"], target
        assert len(result["mutants"]) == result["sample"], target
        assert len({m["id"] for m in result["mutants"]}) == result["sample"], f"{target}: a mutant twice"
        s = report.score(result, classes)
        assert s["killed"] + s["timed out"] + s["survived"] + s["no-test"] + s["incompetent"] == result["sample"]
        assert s["survived"] == s["equivalent"] and s["gaps"] == 0, f"{target}: an unclassified survivor"


def test_every_class_names_a_survivor_and_every_closed_gap_is_killed(loaded: tuple[dict, dict]) -> None:
    results, classes = loaded
    for target, result in results.items():
        outcome = {m["id"]: m["outcome"] for m in result["mutants"]}
        stale = [mid for mid in classes.get(target, {}) if outcome.get(mid) != "survived"]
        assert not stale, f"{target}: survivors.toml classifies mutants that did not survive: {stale}"
    for entry in classes.get("closed", []):
        found = {m["id"]: m["outcome"] for m in results[entry["target"]]["mutants"]}
        assert found.get(entry["id"]) in ("killed", "timed out"), entry


def test_a_survivor_without_a_class_is_counted_and_shown_as_an_open_gap(loaded: tuple[dict, dict]) -> None:
    results, classes = loaded
    results = copy.deepcopy(results)
    target = next(iter(results))
    before = report.score(results[target], classes)
    results[target]["mutants"].append({"id": "L1:0 core/Unclassified#0", "line": 1, "outcome": "survived",
                                       "diff": "+x"})
    after = report.score(results[target], classes)
    assert (after["gaps"], after["equivalent"]) == (before["gaps"] + 1, before["equivalent"])
    assert after["score"] < 1.0
    assert "| `L1:0 core/Unclassified#0` | `x` | **gap (open)** |" in report.render(results, classes)


@pytest.mark.parametrize("target", sorted(campaign.SCOPES))
def test_the_scopes_still_name_code_of_the_reference(target: str) -> None:
    scope = campaign.SCOPES[target]
    ranges = campaign.scope_lines((ROOT / "reference" / scope.file).read_text(encoding="utf-8"), scope)
    assert ranges and all(a <= b for a, b in ranges)
