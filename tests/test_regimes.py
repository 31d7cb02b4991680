"""Recall: the schedules the kit judges reach the regimes where bugs live.

* ``python -m gpu_checks`` (what runs on an H100) reaches every step and page
  regime the pytest suite's numerics reach, so no regime is checked on CPU only.
* The generated preemption traces reach preemption during recompute, a second
  preemption after a recompute was cut short, and the cancel of a preempted
  request within the default example count, and catch, on their own, a
  scheduler that cuts its recompute target when preempted mid-recompute.
"""

from __future__ import annotations


import pytest
from hypothesis import HealthCheck, given, settings

from pytest_cbatch.examples.broken_schedulers import recompute_target_cut
from pytest_cbatch.gpu_checks.profiles import PROFILES, build
from pytest_cbatch.gpu_checks.regimes import regimes, union
from pytest_cbatch.gpu_checks.schedules import numerics_workloads
from pytest_cbatch.reference.scheduler_sim import simulate
from pytest_cbatch.strategies import preemption_workloads

PREEMPTION_REGIMES = ("preempt during recompute", "preempt after cut recompute", "cancel preempted")


def _suite_regimes() -> frozenset[str]:
    """What the suite's numerics reach on the reference scheduler (each workload and its baseline)."""
    return union(simulate(w.trace, **config) for w in numerics_workloads().values()
                 for config in (w.config, w.baseline) if config is not None)


@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_the_gpu_command_reaches_every_regime_the_suite_reaches(profile: str) -> None:
    built = build(PROFILES[profile])
    used = {stage.workload for stage in built.stages}
    command = union(report for name, (_, main, baseline, _) in built.workloads.items() if name in used
                    for report in (main, baseline) if report is not None)
    missing = sorted(_suite_regimes() - command)
    assert not missing, f"the {profile} profile of python -m gpu_checks never reaches: {missing}"


def test_the_suite_reaches_a_running_cancel_with_a_delayed_release_and_allocation_between() -> None:
    assert {"cancel running", "release delayed", "dispatch while draining"} <= _suite_regimes()


def test_regimes_name_the_longest_row_and_what_runs_beside_it() -> None:
    report = {"events": [
        {"event": "dispatch", "work": [{"id": "a", "phase": "prefill", "input_tokens": 2}]},
        {"event": "dispatch", "work": [{"id": "a", "phase": "prefill", "input_tokens": 1},
                                       {"id": "b", "phase": "prefill", "input_tokens": 3}]},
        {"event": "preempted", "id": "a"},
        {"event": "dispatch", "work": [{"id": "a", "phase": "recompute", "input_tokens": 2}]},
        {"event": "preempted", "id": "a"},
        {"event": "cancelled", "id": "a", "time": 5},
    ]}
    found = regimes(report)
    assert "longest prefill-first beside prefill-next" in found
    assert "step: prefill-first + prefill-next" in found
    assert {"preempt", "preempt during recompute", "cancel preempted"} <= found
    assert "preempt after cut recompute" not in found


def test_generated_preemption_traces_reach_each_recompute_regime() -> None:
    """Under the kit's ci profile (100 examples, derandomized) the reference meets each regime."""
    seen: dict[str, int] = dict.fromkeys(PREEMPTION_REGIMES, 0)

    @settings(max_examples=100, derandomize=True, database=None, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(preemption_workloads())
    def run(workload: tuple[list, dict]) -> None:
        trace, config = workload
        for name in regimes(simulate(trace, **config)) & set(PREEMPTION_REGIMES):
            seen[name] += 1

    run()
    assert all(seen.values()), seen


def test_the_generated_preemption_tests_alone_catch_a_cut_recompute_target(pytester: pytest.Pytester,
                                                                         unshrunk_profile: list[str]) -> None:
    spec = "--cbatch-impl=pytest_cbatch.examples.broken_schedulers:recompute_target_cut"
    fixed = pytester.runpytest_subprocess(spec, "-k", "test_contract and not generated")
    assert fixed.ret == 0, "the fixed workloads now catch it too: this test no longer proves what it says"
    generated = pytester.runpytest_subprocess(spec, "-k", "generated_traces_preemption", *unshrunk_profile)
    assert generated.parseoutcomes().get("failed") == 1  # numerics skip as a module where torch is missing
    generated.stdout.fnmatch_lines(["*pending_sample_fed_once*"])


def test_the_cut_recompute_target_is_the_only_difference_from_a_correct_scheduler() -> None:
    """Without a preemption in the middle of a recompute the broken scheduler matches the reference."""
    trace = [{"time": 0, "event": "arrival", "id": "a", "prompt_tokens": 3, "output_tokens": 4}]
    assert recompute_target_cut(trace, capacity=8) == simulate(trace, capacity=8)
