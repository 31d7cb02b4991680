"""Pictures of failing schedules (pytest_cbatch.picture): what a page shows, what it never lets through, and
who writes one (the plugin, cbatch explain, the grader).  Pages are opened in a real browser in
test_picture_browser.py."""

from __future__ import annotations

import html
import json
import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path


from pytest_cbatch.contract import Violation, check_report
from pytest_cbatch.grading.results import TestResult as GradedTest
from pytest_cbatch.impls import resolve_impl
from pytest_cbatch.picture import failure_page, lifecycle_page, schedule_fragment, schedule_page
from pytest_cbatch.picture.lifecycle import script_of, steps_of
from pytest_cbatch.picture.markup import MARK
from pytest_cbatch.picture.schedule import MAX_LANES, MAX_PER_LANE, MAX_TICKS, schedule_of
from pytest_cbatch.workloads import BASE_CONFIG, WORKLOADS

HOSTILE = "</script><img src=x onerror=alert(1)>\"'&<svg onload=alert(2)>"
ALLOWED_TAGS = {"html", "head", "meta", "title", "style", "body", "h1", "h2", "p", "div", "span", "i", "b", "br",
                "pre", "code", "details", "summary", "table", "tr", "th", "td", "svg", "g", "rect", "text", "line",
                "circle"}


class _Tags(HTMLParser):
    """Every tag and attribute name of a document."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: set[str] = set()
        self.attributes: set[str] = set()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.add(tag)
        self.attributes.update(name for name, _ in attrs)


def tags_of(page: str) -> _Tags:
    parser = _Tags()
    parser.feed(page)
    return parser


def demo_report(spec: str = "reference", workload: str = "demo") -> tuple[list[dict], dict, dict]:
    w = WORKLOADS[workload]
    trace = list(w.trace)
    return trace, w.config, resolve_impl(spec).run(trace, w.config).report


def test_a_schedule_has_a_lane_per_request_with_its_chunks_tokens_and_end() -> None:
    _trace, _config, report = demo_report()
    s = schedule_of(report)
    lanes = {lane.rid: lane for lane in s.lanes}
    assert set(lanes) == {"long", "short", "cancel-me", "late"}
    assert [(c.time, c.phase, c.tokens) for c in lanes["long"].cells][:4] == [
        (0, "prefill", 2), (1, "prefill", 2), (2, "prefill", 2), (3, "prefill", 2)]
    assert [c.phase for c in lanes["long"].cells][4:] == ["decode"] * 3
    assert lanes["cancel-me"].status == "cancelled" and lanes["long"].status == "finished"
    assert [m.kind for m in lanes["long"].marks] == ["finished", "release"]
    assert s.capacity == 8 and s.pages and s.pages[2].draining == 2


def test_preempted_requests_wait_again_and_their_recompute_rows_are_drawn() -> None:
    trace, _config, report = demo_report(workload="preempt_decode")
    lanes = schedule_of(report).lanes
    preempted = [lane for lane in lanes if any(m.kind == "preempted" for m in lane.marks)]
    assert preempted, "the optimistic workload preempts someone"
    lane = preempted[0]
    when = next(m.time for m in lane.marks if m.kind == "preempted")
    assert any(state == "waiting" and start == when for start, _end, state in lane.spans)
    assert any(c.phase == "recompute" for lane in lanes for c in lane.cells)
    page = schedule_page(heading="preempt", lead="x", report=report, violations=[], trace=trace, replay="r")
    assert "recompute of" in page and "preempted at t=" in page


def test_the_violation_is_marked_where_it_happened_with_its_message() -> None:
    trace, config, report = demo_report()
    v = Violation("ttft_null_on_cancel", "expected ttft_ticks null, got 3", request="cancel-me", time=2)
    page = failure_page(spec="mine.py", clause=v.clause, workload="demo", violations=[v], trace=trace,
                        report=report, replay="cbatch check --impl mine.py", text="the text")
    assert page.count(f'stroke="{MARK}"') >= 2  # the ring and its label's frame
    assert "1: expected ttft_ticks null, got 3" in page and "cbatch check --impl mine.py" in page
    figure = page[page.index("<svg"):page.index("</svg>")]
    ring = re.search(r'<circle cx="([\d.]+)" cy="([\d.]+)"', figure)
    tick_2 = re.search(r'<text x="([\d.]+)" [^>]*>2</text>', figure)
    first_lane = re.search(r"<title>request ([^<]*)</title>", figure)
    assert ring and tick_2 and first_lane
    assert first_lane.group(1).startswith("cancel-me")  # the violation's request is drawn first
    assert float(ring.group(1)) == float(tick_2.group(1))  # at t=2
    assert 34 < float(ring.group(2)) < 34 + 24  # on the first lane


def test_a_passing_run_has_no_marker_colour_anywhere() -> None:
    trace, _config, report = demo_report()
    page = schedule_page(heading="ok", lead="all hold", report=report, violations=[], trace=trace, replay="r")
    assert MARK not in page[page.index("<body>"):]  # the style sheet names it for the classes a failure uses
    assert "no clause violated" in page


def test_a_one_line_trace_is_counted_in_the_singular() -> None:
    from pytest_cbatch.reference.scheduler_sim import simulate

    trace = [{"time": 0, "event": "arrival", "id": "a", "prompt_tokens": 2, "output_tokens": 1}]
    page = schedule_page(heading="one", lead="x", report=simulate(trace), violations=[], trace=trace, replay="r")
    assert "<h2>trace (1 line)</h2>" in page


def test_values_from_the_judged_code_are_escaped_and_the_page_runs_nothing() -> None:
    trace = [{"time": 0, "event": "arrival", "id": HOSTILE, "prompt_tokens": 2, "output_tokens": 1}]
    report = {"time_unit": "synthetic_tick", "config": {"capacity": HOSTILE},
              "events": [{"time": 0, "event": "arrival", "id": HOSTILE},
                         {"time": 0, "event": "admit", "id": HOSTILE, HOSTILE: HOSTILE},
                         {"time": 0, "event": "dispatch", "work": [{"id": HOSTILE, "phase": HOSTILE,
                                                                     "input_tokens": HOSTILE}]},
                         {"time": 1, "event": "x-" + HOSTILE, "id": HOSTILE, "note": HOSTILE},
                         {"time": 1, "event": "finished", "id": HOSTILE},
                         {"time": float("nan"), "event": "snapshot"}, "not an event", None]}
    v = Violation("schema_valid", HOSTILE, request=HOSTILE, time=1)
    page = failure_page(spec=HOSTILE, clause="schema_valid", workload=HOSTILE, violations=[v], trace=trace,
                        report=report, replay=HOSTILE, text=HOSTILE)
    assert HOSTILE not in page and "<img" not in page and "<script" not in page
    found = tags_of(page)
    assert found.tags <= ALLOWED_TAGS, found.tags - ALLOWED_TAGS
    assert not {a for a in found.attributes if a.startswith("on") or a in ("src", "href", "xlink:href")}
    assert "Content-Security-Policy" in page and "default-src 'none'" in page
    fragment = schedule_fragment(report, [v])
    assert HOSTILE not in fragment and tags_of(fragment).tags <= ALLOWED_TAGS


def test_a_huge_report_gives_a_bounded_page_that_says_what_it_left_out() -> None:
    events = []
    for i in range(400):
        events.append({"time": i, "event": "arrival", "id": f"r{i}"})
        events.append({"time": i, "event": "admit", "id": f"r{i}"})
    for t in range(3000):
        events.append({"time": t, "event": "dispatch", "work": [{"id": f"r{i}", "phase": "decode",
                                                                 "input_tokens": 1} for i in range(0, 400, 7)]})
        events.append({"time": t, "event": "snapshot", "allocated_blocks": t % 50, "reserved_blocks": 60})
    report = {"time_unit": "synthetic_tick", "config": {"capacity": 64}, "events": events}
    violations = [Violation("budget_respected", "x" * 10_000, request="r399", time=2500)] * 50
    page = schedule_page(heading="huge", lead="x", report=report, violations=violations,
                         trace=[{"time": 0, "event": "arrival", "id": f"r{i}"} for i in range(5000)], replay="r",
                         text="y" * 1_000_000)
    assert len(page) < 2_000_000
    assert f"{400 - MAX_LANES} of 400 requests" in page and "ticks outside" in page and "more lines" in page
    assert "42 more" in page  # violations beyond the first 8
    s = schedule_of(report, focus=["r399"], at=2500)
    assert s.lanes[0].rid == "r399" and s.start <= 2500 <= s.end and s.end - s.start == MAX_TICKS


def test_a_crowded_or_absurd_report_still_gives_a_small_page() -> None:
    crowd = [{"time": 3, "event": "snapshot", "allocated_blocks": i} for i in range(20_000)]
    crowd += [{"time": 3, "event": "dispatch", "work": [{"id": "a", "phase": "decode", "input_tokens": 1}] * 20_000}]
    crowd += [{"time": 3, "event": "preempted", "id": "a", "blob": list(range(100_000))}] * 5_000
    far = [{"time": t, "event": "arrival", "id": f"r{t}"} for t in (0.5, 1e8, 1e300, float("inf"), -1, True)]
    for unit, events in (("synthetic_tick", crowd), ("seconds", far)):
        report = {"time_unit": unit, "config": {"capacity": 10**30}, "events": events}
        page = schedule_page(heading="x", lead="x", report=report, violations=[Violation("c", "m", time=1e8)],
                             trace=[], replay="r")
        assert len(page) < 1_000_000, (unit, len(page))
    assert "page snapshots" not in page and "r100000000" in page and "r1e+300" not in page
    s = schedule_of({"time_unit": "synthetic_tick", "events": crowd})
    assert len(s.pages) == 1 and len(s.lanes[0].cells) == MAX_PER_LANE and len(s.lanes[0].marks) == MAX_PER_LANE
    assert any("beyond" in o for o in s.omitted)


LIFECYCLE_MESSAGE = """[lifecycle.cow_isolation] after pool.append('a', 0): pin 'p0' reads [0, 0], expected [0]
  clause: Appending into a shared or pinned partial tail copies it first.
  replay (runnable Python; its last line fails on this implementation):
    from contextlib import suppress
    # PagedKV: the classes of the implementation under test
    pool = PagedKV(2, 2)
    pool.create('a')
    try: _ = pool.pin('a', 'p0')
    except (ValueError,): pass
    else: raise AssertionError(f'returned {_!r}, expected ValueError')
"""
BRIEF_SEARCH = {"max_examples": 5, "derandomize": True, "database": None, "deadline": None}


def _rows(page: str) -> list[str]:
    """The step rows of a lifecycle page's tables."""
    return re.findall(r"<tr[^>]*><td>\d+</td>.*?</tr>", page, re.S)


def test_a_transfer_failure_draws_the_pool_after_every_step_from_the_kits_model() -> None:
    from hypothesis import settings

    from pytest_cbatch.examples.broken_lifecycle import abort_frees_immediately
    from pytest_cbatch.lifecycle import lifecycle_verdicts

    verdict = lifecycle_verdicts("transfer", abort_frees_immediately, settings(**BRIEF_SEARCH))["lifecycle.abort_retains"]
    assert verdict.status == "fail" and [line for line, _ in verdict.steps] == script_of(verdict.message).splitlines()
    steps = steps_of(*zip(*verdict.steps))
    assert steps[0][0].startswith("pool = PagedKV(") and all(pool is not None for _code, pool in steps)
    begun = next(pool for code, pool in steps if "manager.begin(" in code and not code.startswith("with "))
    # the implementation's names, as the machine accepted them: the destination owner and both pins
    owners = {o for o, _count in begun.tables} - {"s0", "s1"}
    pins = {p for _owners, page_pins, _rows in begun.pages for p in page_pins}
    assert len(owners) == 1 and len(pins) == 2 and begun.free() < begun.capacity
    aborted = next(pool for code, pool in steps if "manager.abort(" in code and not code.startswith("with "))
    assert not {o for o, _count in aborted.tables} & owners and pins <= {p for _o, ps, _r in aborted.pages for p in ps}
    page = lifecycle_page(heading="lifecycle transfer", rerun="pytest -k transfer",
                          failures=[("lifecycle.abort_retains", verdict.message, verdict.steps)])
    rows = _rows(page)
    assert len(rows) == len(steps) and all("<svg" in row and " free of " in row for row in rows), rows
    assert "not drawn" not in page and page.count('class="fail"') == 1 and "fails here" in rows[-1]
    assert any("pinned by" in row for row in rows)


def test_a_lifecycle_page_escapes_and_clips_the_names_the_implementation_chose() -> None:
    from pytest_cbatch.lifecycle.oracle import PoolState

    long_name = HOSTILE * 40
    pool = PoolState(4, ((("s0",), (HOSTILE,), 2), ((long_name,), (HOSTILE, long_name), 1)), (("s0", 1), (long_name, 1)))
    steps = [("pool = PagedKV(4, 2)", pool), (f"t1 = manager.begin('s0', {HOSTILE!r})", pool)]
    page = lifecycle_page(heading=HOSTILE, failures=[(HOSTILE, HOSTILE, steps)], rerun=HOSTILE)
    assert HOSTILE not in page and "&lt;svg onload" in page and long_name[:300] not in page
    assert tags_of(page).tags <= ALLOWED_TAGS and "onerror" not in tags_of(page).attributes
    assert "2 free of 4" in page and page.count("pinned by") == 4


def test_a_lifecycle_failure_known_by_its_text_alone_lists_its_steps_without_a_pool() -> None:
    page = lifecycle_page(heading="lifecycle allocator", rerun="pytest -k lifecycle",
                          failures=[("lifecycle.cow_isolation", LIFECYCLE_MESSAGE, ())])
    rows = _rows(page)
    assert len(rows) == 3 and "pool = PagedKV(2, 2)" in rows[0] and "fails here" in rows[-1]
    assert "<svg" not in page and "carries no record of the pool" in page


def test_a_graded_failure_is_html_on_gradescope_and_text_elsewhere() -> None:
    failing = GradedTest("contract.x", False, "the <text> & more", picture="<svg></svg>")
    doc = failing.gradescope()
    assert doc["output_format"] == "html" and doc["output"] == (
        '<svg></svg>\n<pre style="white-space:pre-wrap;overflow-wrap:anywhere">the &lt;text&gt; &amp; more</pre>')
    assert failing.output == "the <text> & more"
    assert "output_format" not in GradedTest("contract.y", False, "text").gradescope()
    assert "output_format" not in GradedTest("contract.z", True, "ok", picture="<svg></svg>").gradescope()


def test_cbatch_explain_draws_a_run_failing_or_not(tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(json.dumps(line) + "\n" for line in WORKLOADS["budget_1"].trace), encoding="utf-8")
    out = tmp_path / "page.html"
    cmd = [sys.executable, "-m", "pytest_cbatch.cli", "explain", "--trace", str(trace), "--token-budget", "1",
           "--html", str(out)]
    bad = subprocess.run([*cmd, "--impl", "pytest_cbatch.examples.broken_schedulers:budget_overrun"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 1 and f"picture: {out}" in bad.stdout, bad.stdout + bad.stderr
    page = out.read_text(encoding="utf-8")
    assert "budget_respected" in page and f'stroke="{MARK}"' in page and "--token-budget 1" in page
    good = subprocess.run([*cmd, "--impl", "reference"], capture_output=True, text=True, timeout=120)
    assert good.returncode == 0 and "no clause violated" in out.read_text(encoding="utf-8"), good.stdout
    missing = subprocess.run(cmd[:-2] + ["--impl", "reference"], capture_output=True, text=True, timeout=120)
    assert missing.returncode == 2 and "needs --html" in missing.stderr


def test_cbatch_explain_draws_a_lifecycle_part(tmp_path: Path) -> None:
    out = tmp_path / "part.html"
    done = subprocess.run([sys.executable, "-m", "pytest_cbatch.cli", "explain", "--impl",
                           "pytest_cbatch.examples.broken_lifecycle:replay_refeed", "--lifecycle", "recompute",
                           "--examples", "5", "--html", str(out)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 1 and "fail  lifecycle.replay_no_refeed" in done.stdout, done.stdout + done.stderr
    page = out.read_text(encoding="utf-8")
    assert "lifecycle.replay_no_refeed" in page and page.count('class="fail"') == 1
    assert "pool = PagedKV(" in page and all("<svg" in row for row in _rows(page))  # the pool after every step


def test_the_plugin_imports_no_picture_code_until_a_picture_is_drawn() -> None:
    code = "import sys, pytest_cbatch.plugin, pytest_cbatch.explain; print('pytest_cbatch.picture' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "False", done.stdout + done.stderr


# -- the figure fills the page, its labels are whole, its page map marks the page ---------------------------

ONE_REQUEST = [{"time": 0, "event": "arrival", "id": "a", "prompt_tokens": 2, "output_tokens": 2}]
TWO_REQUESTS = [{"time": 0, "event": "arrival", "id": "a", "prompt_tokens": 2, "output_tokens": 2},
                {"time": 0, "event": "arrival", "id": "b", "prompt_tokens": 5, "output_tokens": 4}]


def short_run_page(message: str = "expected ttft_ticks null, got 3") -> str:
    """A failing run of three ticks (one request: a prefill, a decode, its release)."""
    report = resolve_impl("reference").run(ONE_REQUEST, BASE_CONFIG).report
    assert report["summary"]["drained_at_tick"] == 3
    v = Violation("token_record_consistent", message, request="a", time=1)
    return failure_page(spec="mine.py", clause=v.clause, workload="short", violations=[v], trace=ONE_REQUEST,
                        report=report, replay="r")


def leaking(trace: list[dict], leaked: str) -> dict:
    """The reference, except that request ``leaked`` is never released: its pages stay in its table."""
    import heapq

    from pytest_cbatch.reference import scheduler_sim as ref

    class Leak(ref.Scheduler):
        def _release_due(self) -> None:
            self.releases = [item for item in self.releases if item[1] != leaked or item[0] > self.now]
            heapq.heapify(self.releases)
            super()._release_due()

    return ref.drive(Leak(**BASE_CONFIG), ref.validate_trace(trace))


def _svg_size(page: str) -> tuple[float, float, str]:
    found = re.search(r'<svg [^>]*width="([\d.]+)" height="([\d.]+)"[^>]*>', page)
    assert found, page[:300]
    style = re.search(r'style="([^"]*)"', found.group(0))
    return float(found.group(1)), float(found.group(2)), style.group(1) if style else ""


def test_a_short_run_fills_the_width_of_the_page() -> None:
    """Three ticks are drawn across the figure, and the figure is scaled to the page's width."""
    page = short_run_page()
    width, _height, style = _svg_size(page)
    figure = page[page.index("<svg"):page.index("</svg>")]
    ticks = {label: float(x) for x, label in re.findall(r'<text x="([\d.]+)" y="25.0" font-size="10" '
                                                         r'text-anchor="middle"[^>]*>(\d)</text>', figure)}
    assert set(ticks) == {"0", "1", "2", "3", "4"}, ticks   # the run and the tick after its last event
    assert ticks["0"] < 0.15 * width and ticks["4"] - ticks["0"] > 0.7 * width, (ticks, width)
    assert "width:100%" in style and "height:auto" in style


def _label_lines(page: str) -> list[str]:
    labels = re.findall(r'<g class="violation-label">(.*?)</g>', page)
    assert labels, "no violation label drawn"
    return [html.unescape(t) for label in labels for t in re.findall(r"<text [^>]*>([^<]*)</text>", label)]


def test_a_violations_label_is_whole_however_long_broken_between_words() -> None:
    message = ("output_tokens 0, token_times [1, 2], token events at [1, 2]: the requests table and the events "
               "disagree about how many tokens request 'a' emitted, got 0")
    page = short_run_page(message)
    lines = _label_lines(page)
    assert " ".join(lines) == f"1: {message}" and len(lines) >= 2, lines
    assert all("…" not in line for line in lines)
    width, _h, _s = _svg_size(page)
    boxes = re.findall(r'<g class="violation-label">.*?<rect x="([\d.]+)" y="[\d.]+" width="([\d.]+)"', page)
    assert all(0 <= float(x) and float(x) + float(w) <= width for x, w in boxes), (boxes, width)
    assert any(line.endswith("got 0") for line in lines), lines   # never "got" on one line, its value on the next


def test_the_page_map_marks_the_leaked_page_itself() -> None:
    report = leaking(TWO_REQUESTS, "a")
    found = check_report(report, TWO_REQUESTS, BASE_CONFIG)
    held = next(v for v in found if v.clause == "no_leaked_pages" and v.request == "a")
    page = failure_page(spec="leak", clause="no_leaked_pages", workload="leak", violations=found,
                        trace=TWO_REQUESTS, report=report, replay="r")
    last = [e for e in report["events"] if e["event"] == "snapshot"][-1]
    leaked = last["block_tables"]["a"]
    assert leaked and str(leaked) in held.message
    for page_id in range(BASE_CONFIG["capacity"]):
        kind = "leaked" if page_id in leaked else "free"
        assert f'<g class="page {kind}" data-page="{page_id}">' in page, (page_id, kind)
    assert f"leaked (never released): page {leaked[0]} (a)" in page


def test_the_page_map_marks_a_page_in_two_tables() -> None:
    from pytest_cbatch.examples.broken_schedulers import shared_page

    report = shared_page(TWO_REQUESTS, **BASE_CONFIG)
    found = check_report(report, TWO_REQUESTS, BASE_CONFIG)
    first = next(v for v in found if "appear twice" in v.message)
    snap = report["events"][first.event_index]
    tables = [t for t in snap["block_tables"].values() if t]
    doubled = set(tables[0]) & set(tables[1])
    page = failure_page(spec="shared", clause="pages_conserved", workload="shared", violations=found,
                        trace=TWO_REQUESTS, report=report, replay="r")
    assert f"pages at t={snap['time']}" in page
    for page_id in doubled:
        assert f'<g class="page doubled" data-page="{page_id}">' in page
    assert page.count('class="page doubled"') == len(doubled) == 1
