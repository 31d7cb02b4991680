"""The pages real failures leave, one of each kind, opened in headless Chromium.

A contract clause on a fixed workload, a generated trace and two lifecycle parts, recompute and transfer (the
pytest plugin), and a graded submission (its page beside results.json, and its Gradescope output as
Gradescope would embed it, for a contract clause and a clause of each of those lifecycle parts).  Each opens with nothing on the browser's console (the page's
Content-Security-Policy would log any script or fetch it refused), and a screenshot shows the violation's
marker.  The browser tests skip where Chromium is missing (tests/browser.py says how to install it).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from browser import SKIP_REASON, chromium, console_problems, marker_pixels, png_rgb, screenshot

from pytest_cbatch.contract import Violation
from pytest_cbatch.grading.evaluate import Submission, grade_submission
from pytest_cbatch.grading.plan import build_plan
from pytest_cbatch.grading.rubric import load_rubric
from pytest_cbatch.lifecycle.oracle import PoolState
from pytest_cbatch.picture import failure_page, lifecycle_page
from pytest_cbatch.picture.draw import COLOURS
from pytest_cbatch.picture.markup import MARK
from pytest_cbatch.plugin import suite_dir
from pytest_cbatch.sandbox import LoadSpec

BROKEN = "pytest_cbatch.examples.broken_schedulers:budget_overrun"
BRIEF = ("from hypothesis import Phase, settings\n"  # a failing example is drawn as it is found: no shrinking
         "settings.register_profile('brief', max_examples=5, derandomize=True, database=None, deadline=None,\n"
         "                           phases=[Phase.explicit, Phase.generate])\n")
OVERRUN = """from pytest_cbatch.reference.scheduler_sim import simulate as reference


def simulate(*args, **kwargs):
    report = reference(*args, **kwargs)
    for event in report["events"]:
        if event["event"] == "dispatch":
            event["unused_budget"] += 1  # claims a token of budget it spent
    return report
"""
FIGURE_X = 60
KINDS = ("contract", "generated", "lifecycle", "transfer", "graded", "gradescope", "gradescope-lifecycle",
         "gradescope-transfer")
FAULTS = """from pytest_cbatch.reference.scheduler_faults import PagedKV
from pytest_cbatch.reference.scheduler_faults import RecomputeRequest as Reference
from pytest_cbatch.reference.scheduler_faults import TransferManager as ReferenceManager


class RecomputeRequest(Reference):
    def resume(self):
        replay = self.state == "preempted"
        resumed = super().resume()
        if resumed and replay and self.outputs and self.pool.free:
            self.pool.append(self.owner, self.outputs[-1])  # feeds the pending sample a second time
        return resumed


class TransferManager(ReferenceManager):
    def abort(self, key, reason="cancel"):
        aborted = super().abort(key, reason)
        if aborted:
            self.pool.unpin(self.records[key].destination_pin)  # frees the destination before the drain
        return aborted
"""
needs_chromium = pytest.mark.skipif(chromium() is None, reason=SKIP_REASON)


@pytest.fixture(scope="module")
def pages(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One page of each kind, each left by a real failure."""
    root = tmp_path_factory.mktemp("pictures")
    project = root / "project"
    project.mkdir()
    (project / "conftest.py").write_text(BRIEF, encoding="utf-8")
    others = [f"--ignore={p}" for p in suite_dir().glob("test_*.py") if p.name != "test_contract.py"]
    run = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", f"--cbatch-impl={BROKEN}",
                          "--hypothesis-profile=brief", *others, "-k", "budget_respected-demo and not serial "
                          "or test_generated_traces and not preemption"],
                         cwd=project, capture_output=True, text=True, timeout=600)
    failures = project / ".cbatch-failures"
    assert f"picture: {failures / 'budget_respected-demo.html'}" in run.stdout, run.stdout[-3000:]
    others = [f"--ignore={p}" for p in suite_dir().glob("test_*.py") if p.name != "test_lifecycle.py"]
    (project / "faults").mkdir()
    (project / "faults" / "scheduler_faults.py").write_text(FAULTS, encoding="utf-8")
    run = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--hypothesis-profile=brief",
                          "--cbatch-impl=./faults", *others, "-k", "recompute or transfer"],
                         cwd=project, capture_output=True, text=True, timeout=600)
    lifecycle, transfer = failures / "lifecycle-recompute.html", failures / "lifecycle-transfer.html"
    assert f"picture: {lifecycle}" in run.stdout and f"picture: {transfer}" in run.stdout, run.stdout[-3000:]
    graded = _graded(root)
    return {"contract": failures / "budget_respected-demo.html",
            "generated": failures / "budget_respected-generated-reserve.html",
            "lifecycle": lifecycle, "transfer": transfer, **graded}


def _graded(root: Path) -> dict[str, Path]:
    """Grade a one-file submission that overruns the token budget; its page and its Gradescope output."""
    folder = root / "student"
    folder.mkdir()
    source = folder / "scheduler_sim.py"
    source.write_text(OVERRUN, encoding="utf-8")
    (folder / "scheduler_faults.py").write_text(FAULTS, encoding="utf-8")
    rubric = root / "rubric.toml"
    rubric.write_text('[grading]\nparts = ["scheduler", "lifecycle"]\ngenerated_examples = 0\nlifecycle_examples = 5\n'
                      'sandbox = "process"\nkit_imports = "allow"\n[limits]\ncall_seconds = 120\n[tests]\n"contract.*" = { points = 1 }\n'
                      '"lifecycle.*" = { points = 1 }\n', encoding="utf-8")
    out = root / "graded"
    out.mkdir()
    whole = build_plan(load_rubric(rubric))  # the demo workload and one invalid input are enough to fail on
    plan = replace(whole, cases=tuple(c for c in whole.cases if c.label == "demo"), invalid=whole.invalid[:1])
    assert plan.cases
    files = ("scheduler_sim.py", "scheduler_faults.py")
    result = grade_submission(Submission("student", str(folder), LoadSpec(str(folder), files)),
                              load_rubric(rubric), plan, out)
    doc = result.gradescope()
    (out / "results.json").write_text(json.dumps(doc), encoding="utf-8")
    outputs = {t["name"]: t["output"] for t in doc["tests"]}
    embedded = {}
    for kind, name in (("gradescope", "contract.budget_respected"),
                       ("gradescope-lifecycle", "lifecycle.replay_no_refeed"),
                       ("gradescope-transfer", "lifecycle.abort_retains")):
        embedded[kind] = root / f"{kind}.html"  # the test's output in a bare page: none of the kit's style sheet
        embedded[kind].write_text(f"<!DOCTYPE html><html><body>{outputs[name]}</body></html>", encoding="utf-8")
    written = sorted(out.glob("budget_respected-*.html"))
    return {"graded": written[0] if written else out / "missing.html", "results": out / "results.json", **embedded}


def test_every_kind_of_failure_leaves_a_page(pages: dict[str, Path]) -> None:
    for kind in KINDS:
        text = pages[kind].read_text(encoding="utf-8")
        assert f'stroke="{MARK}"' in text or "fails here" in text, kind
        assert "<script" not in text and "https://" not in text, kind


def test_gradescope_shows_a_failing_test_as_html_and_a_passing_one_as_text(pages: dict[str, Path]) -> None:
    doc = json.loads(pages["results"].read_text(encoding="utf-8"))
    failing = next(t for t in doc["tests"] if t["name"] == "contract.budget_respected")
    assert failing["output_format"] == "html" and "<svg" in failing["output"] and "<pre " in failing["output"]
    assert "unused_budget" in failing["output"]
    passing = [t for t in doc["tests"] if t["status"] == "passed"]
    assert passing and all("output_format" not in t for t in passing)
    lifecycle = next(t for t in doc["tests"] if t["name"] == "lifecycle.replay_no_refeed")
    assert lifecycle["output_format"] == "html" and "fails here" in lifecycle["output"]


@pytest.mark.parametrize("kind", ("transfer", "gradescope-transfer"))
def test_a_transfer_failure_draws_the_pool_after_every_step(pages: dict[str, Path], kind: str) -> None:
    text = pages[kind].read_text(encoding="utf-8")
    rows = re.findall(r"<tr[^>]*><td>\d+</td>.*?</tr>", text, re.S)
    calls = [row for row in rows if "manager.begin(" in row or "manager.abort(" in row]
    assert calls and all("<svg" in row and " free of " in row for row in rows), rows
    assert "not drawn" not in text and "pinned by" in text and "fails here" in rows[-1]


@needs_chromium
@pytest.mark.parametrize("kind", KINDS)
def test_each_page_opens_in_chromium_without_console_errors(pages: dict[str, Path], kind: str) -> None:
    problems, dom = console_problems(pages[kind])
    assert not problems, problems
    assert ("<svg" in dom) and ("unused_budget" in dom or "lifecycle." in dom), dom[:2000]


@needs_chromium
def test_a_page_of_hostile_values_runs_and_loads_nothing_in_chromium(tmp_path: Path) -> None:
    hostile = "</script><img src=x onerror=console.error('xss')><script>console.error('xss')</script>"
    report = {"time_unit": "synthetic_tick", "config": {"capacity": 2},
              "events": [{"time": 0, "event": "arrival", "id": hostile},
                         {"time": 0, "event": "dispatch", "work": [{"id": hostile, "phase": "prefill",
                                                                     "input_tokens": 1}]},
                         {"time": 1, "event": "x-" + hostile, "id": hostile, hostile: hostile}]}
    path = tmp_path / "hostile.html"
    path.write_text(failure_page(spec=hostile, clause="schema_valid", workload=hostile, trace=[], report=report,
                                 violations=[Violation("schema_valid", hostile, request=hostile, time=0)],
                                 replay=hostile, text=hostile), encoding="utf-8")
    problems, dom = console_problems(path)
    assert not problems, problems
    assert "<img" not in dom and "<script" not in dom and "&lt;/script&gt;&lt;img src=x" in dom
    pool = PoolState(2, (((hostile,), (hostile + "/source", hostile + "/destination"), 1),), ((hostile, 1),))
    path = tmp_path / "hostile-lifecycle.html"  # a transfer manager names its destination owner and pins itself
    path.write_text(lifecycle_page(heading=hostile, failures=[(hostile, hostile, [(hostile, pool)])], rerun=hostile),
                    encoding="utf-8")
    problems, dom = console_problems(path)
    assert not problems, problems
    assert "<img" not in dom and "<script" not in dom and "pinned by &lt;/script&gt;" in dom


@needs_chromium
def test_the_console_check_hears_a_page_that_misbehaves(tmp_path: Path) -> None:
    bad = tmp_path / "bad.html"
    bad.write_text('<html><body><script>console.error("boom")</script></body></html>', encoding="utf-8")
    problems, _dom = console_problems(bad)
    assert any("boom" in line for line in problems), problems


@needs_chromium
def test_the_screenshot_shows_the_marked_violation(pages: dict[str, Path], tmp_path: Path) -> None:
    shot = tmp_path / "contract.png"
    screenshot(pages["contract"], shot, 1000, 600)
    assert marker_pixels(shot, MARK, min_x=FIGURE_X) > 500  # right of the verdict box's coloured edge: the figure
    passing = tmp_path / "ok.html"
    done = subprocess.run([sys.executable, "-m", "pytest_cbatch.cli", "explain", "--impl", "reference",
                           "--html", str(passing)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    screenshot(passing, tmp_path / "ok.png", 1000, 600)
    assert marker_pixels(tmp_path / "ok.png", MARK) == 0


def _rightmost_bar(png: Path, colour: str, least: int = 40) -> int:
    """The x where the rightmost run of at least ``least`` pixels of ``colour`` (#rrggbb, within a small
    tolerance) ends in a row of a screenshot: a bar of the figure, not a legend swatch or antialiased text; -1
    when there is none."""
    want = bytes.fromhex(colour.lstrip("#"))
    width, _height, rows = png_rgb(png.read_bytes())
    right = -1
    for row in rows:
        run = 0
        for x in range(width):
            run = run + 1 if all(abs(row[3 * x + c] - want[c]) <= 12 for c in range(3)) else 0
            if run >= least:
                right = max(right, x)
    return right


@needs_chromium
@pytest.mark.parametrize("window", (1400, 800))
def test_a_short_run_fills_the_page_at_any_width(tmp_path: Path, window: int) -> None:
    """A run of three ticks is drawn across the page (its draining bar, the third of four ticks, ends past
    60 % of the window), and at 800 px the whole figure still fits (it is scaled, not cut)."""
    from pytest_cbatch.impls import resolve_impl
    from pytest_cbatch.workloads import BASE_CONFIG

    trace = [{"time": 0, "event": "arrival", "id": "a", "prompt_tokens": 2, "output_tokens": 2}]
    report = resolve_impl("reference").run(trace, BASE_CONFIG).report
    page = tmp_path / "short.html"
    page.write_text(failure_page(spec="mine.py", clause="token_record_consistent", workload="short",
                                 violations=[Violation("token_record_consistent", "output_tokens 0 but 2 token events",
                                                       request="a", time=1)],
                                 trace=trace, report=report, replay="r"), encoding="utf-8")
    shot = tmp_path / "short.png"
    screenshot(page, shot, window, 900)
    right = _rightmost_bar(shot, COLOURS["draining"])   # its pages draining from t=2 to t=3, of a run to t=4
    assert 0.6 * window < right < window - 20, (right, window)
