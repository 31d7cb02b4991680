"""A lifecycle clause no run reached is not judged, never passed: hostile parts under every way the kit runs them.

Each hostile module stops every run of every part at its first step (a
constructor that always raises, methods that hang, methods that return
garbage).  The first clause checked there fails; once it is disabled, every
later run halts before anything else is judged.  Those other clauses used to
be reported as passing.  Here they must be "not judged", naming the clause
that failed, in ``lifecycle_verdicts``, under plain pytest and
``--cbatch-isolate`` (the summary names them) and in grading (0 points).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from pytest_cbatch.grading.evaluate import Submission, grade_submission
from pytest_cbatch.grading.plan import build_plan
from pytest_cbatch.grading.rubric import load_rubric
from pytest_cbatch.lifecycle import PART_CLAUSES, PARTS, lifecycle_verdicts
from pytest_cbatch.sandbox import LoadSpec, submission_files

FAILS_FIRST = "lifecycle.page_conservation"  # the clause of the pool's constructor and of its first views

RAISES = '''
class PagedKV:
    def __init__(self, *args, **kwargs):
        raise RuntimeError("no pool today")


RecomputeRequest = TransferManager = PagedKV
'''

_EVERY_ATTRIBUTE = '''
{imports}
class PagedKV:
    def __init__(self, *args, **kwargs):
        pass

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
{body}

RecomputeRequest = TransferManager = PagedKV
'''
"""A module whose classes construct, and whose every other attribute does ``body``."""

GARBAGE = _EVERY_ATTRIBUTE.format(imports="", body='        return lambda *args, **kwargs: "garbage"')
HANGS = _EVERY_ATTRIBUTE.format(imports="import time\n", body="        while True:\n            time.sleep(0.05)")

BRIEF = settings(max_examples=5, derandomize=True, database=None, deadline=None,
                 suppress_health_check=list(HealthCheck))


def _module(tmp_path: Path, name: str, source: str) -> Path:
    path = tmp_path / f"{name}.py"
    path.write_text(source, encoding="utf-8")
    return path


@pytest.mark.parametrize("source", [RAISES, GARBAGE], ids=["raises", "garbage"])
@pytest.mark.parametrize("part", list(PARTS))
def test_clauses_no_run_reached_are_not_judged_and_name_the_failing_clause(part: str, source: str) -> None:
    namespace: dict = {}
    exec(compile(source, "hostile.py", "exec"), namespace)
    verdicts = lifecycle_verdicts(part, type("Hostile", (), namespace), BRIEF)
    assert verdicts[FAILS_FIRST].status == "fail", verdicts[FAILS_FIRST]
    rest = {cid: v for cid, v in verdicts.items() if cid != FAILS_FIRST}
    assert rest and all(v.status == "skip" for v in rest.values()), {c: v.status for c, v in rest.items()}
    assert all(v.message.startswith("not judged") and FAILS_FIRST in v.message for v in rest.values())


def test_correct_parts_are_judged_on_every_clause() -> None:
    from examples import lifecycle_plain, lifecycle_variant
    from pytest_cbatch.reference import scheduler_faults

    for namespace in (lifecycle_plain, lifecycle_variant, scheduler_faults):
        for part in PARTS:
            verdicts = lifecycle_verdicts(part, namespace, BRIEF)
            assert {cid: v.status for cid, v in verdicts.items()} == dict.fromkeys(PART_CLAUSES[part], "pass"), \
                (namespace.__name__, part, {c: v.message for c, v in verdicts.items() if v.status != "pass"})


def _summary(result: pytest.RunResult) -> str:
    out = result.stdout.str()
    return out[out.index("pytest-cbatch ===="):] if "pytest-cbatch ====" in out else out[-3000:]


HOSTILE = [pytest.param(RAISES, True, id="raises"), pytest.param(GARBAGE, True, id="garbage"),
           pytest.param(HANGS, False, id="hangs")]


@pytest.mark.parametrize("isolate", [False, True], ids=["in-process", "isolated"])
@pytest.mark.parametrize("source, names_failing", HOSTILE)
def test_pytest_summary_names_the_lifecycle_clauses_not_judged(pytester: pytest.Pytester, lifecycle_profile,
                                                               source: str, names_failing: bool,
                                                               isolate: bool) -> None:
    pytester.makepyfile(hostile=source)
    args = ["--cbatch-impl=hostile.py", "-k", "test_lifecycle and allocator", "--cbatch-timeout=2",
            "--cbatch-max-timeouts=1", "-p", "no:cacheprovider", *lifecycle_profile]
    if isolate:
        args += ["--cbatch-isolate", "--cbatch-sandbox=process"]
    result = pytester.runpytest_subprocess(*args, timeout=240)
    summary = _summary(result)
    assert result.ret != 0 and result.parseoutcomes().get("failed") == 1, summary
    assert "NOT JUDGED in the lifecycle parts: " in summary and "(lifecycle.append_atomic in allocator," in summary, \
        summary
    assert "passed" not in result.parseoutcomes(), summary
    if names_failing:
        assert f"every run stopped first at the failing clause {FAILS_FIRST}" in result.stdout.str(), summary


LIFECYCLE_RUBRIC = """\
[grading]
generated_examples = 0
lifecycle_examples = 5
parts = ["lifecycle"]
[limits]
call_seconds = 2
max_failures = 1
[tests]
"lifecycle.*" = { points = 1 }
"""


@pytest.mark.parametrize("source, names_failing", HOSTILE)
def test_grading_scores_lifecycle_clauses_not_judged_as_not_passed(tmp_path: Path, source: str,
                                                                   names_failing: bool) -> None:
    (tmp_path / "rubric.toml").write_text(LIFECYCLE_RUBRIC, encoding="utf-8")
    rubric = load_rubric(tmp_path / "rubric.toml")
    folder = tmp_path / "mallory"
    folder.mkdir()
    _module(folder, "scheduler_sim", source)
    _module(folder, "scheduler_faults", "from scheduler_sim import *\n")
    sub = Submission("mallory", str(folder), LoadSpec(str(folder), submission_files(str(folder))))
    result = grade_submission(sub, rubric, build_plan(rubric), tmp_path / "out", "process")
    tests = {t.name: t for t in result.tests}
    assert tests and not [name for name, t in tests.items() if t.score], "a lifecycle clause scored on unjudged runs"
    rest = [t for name, t in tests.items() if name != FAILS_FIRST]
    assert all(t.output.startswith("not judged") for t in rest), [t.output[:200] for t in rest]
    if names_failing:
        assert all(FAILS_FIRST in t.output for t in rest), [t.output[:200] for t in rest]
