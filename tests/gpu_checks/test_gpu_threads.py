"""The figures a numeric check reports do not depend on the caller's torch thread count (``gpu_checks.threads``):
a grading worker, a Ray node and a laptop write the same results."""

from __future__ import annotations

from typing import Any, Iterator

import pytest

torch = pytest.importorskip("torch", reason="gpu_checks need torch")

from pytest_cbatch.gpu_checks.checks import run_schedule_checks  # noqa: E402
from pytest_cbatch.reference.scheduler_sim import demo_trace, simulate  # noqa: E402


@pytest.fixture
def threads() -> Iterator[Any]:
    """Set torch's intra-op thread count for the test; restored after it."""
    before = torch.get_num_threads()
    yield torch.set_num_threads
    torch.set_num_threads(before)


def _figures(results: list[Any]) -> list[dict[str, Any]]:
    """Everything a check reports but its timing."""
    return [{k: v for k, v in r.as_dict().items() if k != "seconds"} for r in results]


def test_schedule_checks_give_the_same_figures_on_one_thread_and_on_four(threads: Any) -> None:
    trace = demo_trace()
    report = simulate(trace)
    found = []
    for count in (1, 4):
        threads(count)
        found.append(_figures(run_schedule_checks(trace, report, dtype="float64", workload="demo")))
        assert torch.get_num_threads() == count   # the caller's count is restored
    assert found[0] == found[1]
    assert [r["name"] for r in found[0]] and all(r["passed"] for r in found[0])

