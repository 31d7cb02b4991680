"""Conformance, numerics: the implementation's schedules computed by a real transformer.

Each workload is scheduled by the implementation under test; the report's
dispatch rows (with their chunking, row order, preemptions and recompute rows)
are executed on the kit's seeded Llama-style model with a paged KV cache, and
every fed position's logits are compared with the model run on each request
alone.  Ids read ``test_numerics[<check>-<dtype>-<workload>]``.  float64 and
float32 run on CPU with the tiny preset (seconds); bfloat16 cases are marked
``gpu`` and run only where CUDA is available.  Checks, metrics and tolerances:
``gpu_checks/README.md`` in the source tree.
"""

from __future__ import annotations

from typing import Any, Iterator

import pytest

torch = pytest.importorskip("torch", reason="gpu_checks need torch: pip install 'pytest-cbatch[gpu]'")

from pytest_cbatch.gpu_checks.checks import (  # noqa: E402  (after the torch skip)
    SCHEDULE_CHECKS, CheckResult, run_invariance_checks, run_preemption_check, run_schedule_checks,
)
from pytest_cbatch.gpu_checks.engine import ScheduleError  # noqa: E402
from pytest_cbatch.gpu_checks.schedules import SUITE_WORKLOADS  # noqa: E402
from pytest_cbatch.reference.scheduler_sim import demo_trace  # noqa: E402
from pytest_cbatch.workloads import BASE_CONFIG  # noqa: E402

WORKLOADS: dict[str, tuple[list[dict[str, Any]], dict[str, Any], dict[str, Any] | None]] = {
    "demo": (demo_trace(), dict(BASE_CONFIG), None),
    **{name: (w.trace, w.config, w.baseline) for name, w in SUITE_WORKLOADS.items()},
}
EXTRA_CHECKS = {"chunked": ("batch_invariance", "negative_control"), "preempt": ("preemption_vs_none",)}
_GPU = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="bfloat16 numerics need CUDA")]
CASES = [
    pytest.param(check, dtype, workload, id=f"{check}-{dtype}-{workload}",
                 marks=_GPU if dtype == "bfloat16" else ())
    for dtype in ("float64", "float32", "bfloat16")
    for workload in WORKLOADS
    for check in SCHEDULE_CHECKS + EXTRA_CHECKS.get(workload, ())
]


def _report(impl: Any, trace: list[dict[str, Any]], config: dict[str, Any]) -> dict[str, Any]:
    outcome = impl.run(trace, config)
    if outcome.unsupported:
        pytest.skip(outcome.unsupported)
    if outcome.report is None:
        pytest.fail(f"{impl.spec} produced no report for {config}: {outcome.refused or outcome.broken}",
                    pytrace=False)
    return outcome.report


class _Numerics:
    """Every check of one (workload, dtype), computed once per module."""

    def __init__(self, impl: Any) -> None:
        self.impl = impl
        self.cache: dict[tuple[str, str], dict[str, CheckResult]] = {}

    def results(self, workload: str, dtype: str) -> dict[str, CheckResult]:
        key = (workload, dtype)
        if key not in self.cache:
            trace, config, baseline = WORKLOADS[workload]
            report = _report(self.impl, trace, config)
            common = {"dtype": dtype, "device": "cuda" if dtype == "bfloat16" else "cpu", "preset": "tiny",
                      "block_size": config["block_size"], "workload": workload}
            try:
                out = run_schedule_checks(trace, report, **common)
                if "batch_invariance" in EXTRA_CHECKS.get(workload, ()):
                    out += run_invariance_checks(trace, report, **common)
                if baseline is not None:
                    out.append(run_preemption_check(trace, report, _report(self.impl, trace, baseline), **common))
            except ScheduleError as exc:
                pytest.fail(f"{self.impl.spec}: the {workload} report cannot be executed on token streams: {exc}",
                            pytrace=False)
            self.cache[key] = {r.name: r for r in out}
        return self.cache[key]


@pytest.fixture(scope="module")
def numerics(cbatch_impl: Any) -> Iterator[_Numerics]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the tiny model is latency-bound; more threads only contend
    yield _Numerics(cbatch_impl)
    torch.set_num_threads(threads)


@pytest.mark.parametrize("check,dtype,workload", CASES)
def test_numerics(check: str, dtype: str, workload: str, numerics: _Numerics, request: pytest.FixtureRequest) -> None:
    request.node.user_properties += [("cbatch_clause", f"numerics.{check}"), ("cbatch_workload", workload)]
    result = numerics.results(workload, dtype)[check]
    if result.skipped:
        pytest.skip(result.summary())
    if check == "negative_control" and not result.details["bitwise_differs"] and len(result.failures) == 1:
        pytest.skip(f"{result.summary()} (this schedule cannot show batch variance, so bitwise checks prove little)")
    if not result.passed:
        pytest.fail(result.summary(), pytrace=False)
