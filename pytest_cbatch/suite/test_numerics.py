"""Conformance, numerics: the implementation's schedules computed by a real transformer.

Each workload is scheduled by the implementation under test; the report's
dispatch rows (with their chunking, row order, preemptions and recompute rows)
are executed on the kit's seeded Llama-style model with a paged KV cache, and
every fed position's logits are compared with the model run on each request
alone.  Ids read ``test_numerics[<check>-<dtype>-<workload>]``.  float64 and
float32 run on CPU (seconds); bfloat16 cases are marked ``gpu`` and run only
where CUDA is available.

The long-context workloads (``long``, ``long-preempt``: a 1,100-token prompt
in 256-token chunks, decodes past 1,100 keys on 70+ pages) run on a narrow
model; where the implementation does not support their config, the kit's own
FCFS schedule of the same trace runs instead (property ``cbatch_schedule``
says which).  A check that judged no report of the implementation (on the
kit's schedule, or ``test_attention_kernels``) is never the implementation's
pass: it skips saying so when it holds, and fails when the kit's own numerics
do not hold on this machine.  ``large_scores`` runs the ``long`` schedule on the same model
with queries scaled so attention scores pass the float32 overflow range of a
naive ``exp``; ``later_partition_leads`` / ``first_partition_leads`` run it with
one split-KV partition's scores leading the others' by more than 100.
``bounds`` hits every size parameter of the engine at n-1, n and n+1 (pages,
split-KV partitions, RoPE and block tables, prefill chunk, batch padding) and
has a step of 10 decode rows beside a prefill.  ``test_attention_kernels`` checks the attention kernels on
long ragged rows once per run (they do not depend on the implementation).
A report that fails ``schema_valid`` is not executed: its tests skip and
point at that clause.  A report that cannot show its schedule (a client-side
report of a live server lists what it observes, and ``dispatch`` is not
among them) skips as not observable, counted so in the end-of-run summary;
a report with no dispatch rows for a workload skips too, so nothing is ever
compared with an empty reference.  Checks, metrics and tolerances: ``gpu_checks/README.md``
in the source tree.
"""

from __future__ import annotations

import importlib.util
from types import ModuleType
from typing import TYPE_CHECKING, Any

import pytest

from pytest_cbatch.gpu_checks.catalog import LEAD_CHECKS, MAGNITUDES, SCHEDULE_CHECKS
from pytest_cbatch.gpu_checks.schedules import Workload, numerics_workloads
from pytest_cbatch.schemas import schema_issues

if TYPE_CHECKING:
    from pytest_cbatch.gpu_checks.checks import CheckResult


def _import_torch() -> ModuleType:
    import torch

    return torch


def _torch_skip_reason(exc: ImportError) -> str:
    return f"the numerics tests need torch: pip install torch==2.13.0 ({type(exc).__name__}: {exc})"


# Collecting this module imports no torch (ids and marks need only the torch-free tables above).  Where
# torch is not installed at all, the module skips here as a whole; where it is, the plugin imports it
# once these tests are selected (``cbatch_module_skip``), so a ``-k`` that leaves them out never pays.
if importlib.util.find_spec("torch") is None:
    try:
        _import_torch()
    except ImportError as exc:
        pytest.skip(_torch_skip_reason(exc), allow_module_level=True)


def cbatch_module_skip() -> str | None:
    """Why this whole module skips, or None: called by the plugin once any of its tests is selected.

    Any ImportError, not only a missing module: a broken torch install skips with its reason too.
    """
    try:
        _import_torch()
    except ImportError as exc:
        return _torch_skip_reason(exc)
    return None


def _cuda_available() -> bool:
    return _import_torch().cuda.is_available()


WORKLOADS: dict[str, Workload] = numerics_workloads()
CHECKS: dict[str, tuple[str, ...]] = {
    "demo": SCHEDULE_CHECKS,
    "chunked": SCHEDULE_CHECKS + ("batch_invariance", "negative_control"),
    "preempt": SCHEDULE_CHECKS + ("preemption_vs_none",),
    "long": ("batched_vs_alone", "backend_parity", "chunked_vs_whole", "page_reuse", "large_scores",
             "later_partition_leads", "first_partition_leads"),
    "long-preempt": ("batched_vs_alone", "page_reuse", "preemption_vs_none"),
    "bounds": ("batched_vs_alone", "backend_parity", "chunked_vs_whole", "page_reuse"),
}
KIT_FALLBACK = ("long", "long-preempt", "bounds")   # unsupported config: run the kit's own schedule of the trace
HOT_PRESET = {"narrow": "narrow-hot"}     # the q_gain twin of a preset, for large_scores
HOT_CHECKS = {"large_scores": "", **{check: f"-{side}" for check, side in LEAD_CHECKS.items()}}
"""Checks that run on the hot twin (suffixed: its ``-late``/``-early`` partition-lead variant)."""
# A string condition: evaluated (torch imported) when a bfloat16 case is set up, not at collection.
_GPU = [pytest.mark.gpu, pytest.mark.skipif("not _cuda_available()", reason="bfloat16 numerics need CUDA")]
_DTYPES = ("float64", "float32", "bfloat16")
CASES = [
    pytest.param(check, dtype, workload, id=f"{check}-{dtype}-{workload}", marks=_GPU if dtype == "bfloat16" else ())
    for dtype in _DTYPES for workload in WORKLOADS for check in CHECKS[workload]
]
KERNEL_CASES = [
    pytest.param(check, dtype, magnitude, id=f"{check}-{dtype}" + ("" if magnitude == "uniform" else f"-{magnitude}"),
                 marks=_GPU if dtype == "bfloat16" else ())
    for dtype in _DTYPES for check, magnitude in (("attention_parity", "uniform"), *(
        ("attention_large_scores", m) for m in MAGNITUDES))
]


class _Schedules:
    """The reports a workload runs on: the implementation's, or the kit's where it has none."""

    def __init__(self, impl: Any) -> None:
        self.impl = impl

    def report(self, workload: Workload, config: dict[str, Any], kit: dict[str, Any] | None) -> tuple[dict, str]:
        """(report, source): ``source`` is ``"implementation"`` or ``"kit (<why>)"``."""
        outcome = self.impl.run(workload.trace, config)
        if outcome.unsupported:
            if kit is None or workload.name not in KIT_FALLBACK:
                pytest.skip(outcome.unsupported)
            return kit, f"kit ({outcome.unsupported})"
        if outcome.report is None:
            pytest.fail(f"[completes] {self.impl.spec} produced no report for workload {workload.name!r} under "
                        f"{config}: {outcome.refused or outcome.broken}\n"
                        f"replay: pytest --cbatch-impl={self.impl.spec} -k completes", pytrace=False)
        issues = schema_issues(outcome.report, "report", limit=3)
        if issues:
            pytest.skip(f"[schema_valid] the report of workload {workload.name!r} fails schema_valid "
                        f"({'; '.join(map(str, issues))}), so its numerics were not checked; "
                        f"replay: pytest --cbatch-impl={self.impl.spec} -k schema_valid")
        _require_schedule(outcome.report, workload.name, getattr(self.impl, "claims", ()))
        return outcome.report, "implementation"


def _require_schedule(report: dict[str, Any], workload: str, honoured: Any) -> None:
    """Skip unless ``report`` carries dispatch rows to execute: the numerics run the implementation's schedule.
    Its ``observed`` counts only where the implementation's kind may declare it (``honoured``)."""
    observed = report.get("observed") if "observed" in honoured else None
    if observed is not None and "dispatch" not in observed:
        pytest.skip(f"not observable from this report: the numerics execute dispatch rows, and the report of "
                    f"workload {workload!r} (time_unit {report.get('time_unit')!r}) observes only "
                    f"{', '.join(observed) or 'nothing'}, so there is no schedule to compute")
    if not any(ev["event"] == "dispatch" for ev in report["events"]):
        pytest.skip(f"the report of workload {workload!r} has no dispatch rows, so there is no schedule to compute "
                    f"(the contract tests judge whether it should have)")


class _Numerics:
    """Every check of one (workload, dtype), computed once per module."""

    def __init__(self, impl: Any) -> None:
        self.impl = impl
        self.schedules = _Schedules(impl)
        self.cache: dict[tuple[str, str], tuple[dict[str, CheckResult], str]] = {}

    def results(self, name: str, dtype: str) -> tuple[dict[str, CheckResult], str]:
        """(results by check name, schedule source) of ``name`` in ``dtype``."""
        from pytest_cbatch.gpu_checks.checks import run_invariance_checks, run_preemption_check, run_schedule_checks
        from pytest_cbatch.gpu_checks.engine import ScheduleError

        key = (name, dtype)
        if key not in self.cache:
            w = WORKLOADS[name]
            kit, kit_baseline = w.kit_reports() if name in KIT_FALLBACK else (None, None)
            report, source = self.schedules.report(w, w.config, kit)
            common = {"dtype": dtype, "device": "cuda" if dtype == "bfloat16" else "cpu",
                      "block_size": w.config["block_size"], "workload": name}
            checks = CHECKS[name]
            try:
                out = run_schedule_checks(w.trace, report, preset=w.preset, **common,
                                          checks=[c for c in checks if c in SCHEDULE_CHECKS])
                for check in (c for c in checks if c in HOT_CHECKS):
                    out += run_schedule_checks(w.trace, report, preset=HOT_PRESET[w.preset] + HOT_CHECKS[check],
                                               checks=(check,), **common)
                if "batch_invariance" in checks:
                    out += run_invariance_checks(w.trace, report, preset=w.preset, **common)
                if w.baseline is not None:
                    baseline, _ = self.schedules.report(w, w.baseline, kit_baseline)
                    out.append(run_preemption_check(w.trace, report, baseline, preset=w.preset, **common))
            except ScheduleError as exc:
                pytest.fail(f"{self.impl.spec}: the {name} report ({source} schedule) cannot be executed on token "
                            f"streams: {exc}\nreplay: pytest --cbatch-impl={self.impl.spec} -k {name!r}",
                            pytrace=False)
            self.cache[key] = ({r.name: r for r in out}, source)
        return self.cache[key]


@pytest.fixture(scope="module")
def numerics(cbatch_impl: Any) -> _Numerics:
    """Every check computes on one torch thread (``gpu_checks.threads``), so its figures are the same on every
    machine."""
    return _Numerics(cbatch_impl)


@pytest.mark.parametrize("check,dtype,workload", CASES)
def test_numerics(check: str, dtype: str, workload: str, numerics: _Numerics, request: pytest.FixtureRequest) -> None:
    request.node.user_properties += [("cbatch_clause", f"numerics.{check}"), ("cbatch_workload", workload)]
    results, source = numerics.results(workload, dtype)
    request.node.user_properties.append(("cbatch_schedule", source))
    result = results[check]
    if result.skipped:
        pytest.skip(result.summary())
    if source != "implementation":
        _kit_only(result, f"computed on the kit's own schedule of workload {workload!r}, not on a report of "
                          f"{numerics.impl.spec} (schedule: {source})")
    if check == "negative_control" and not result.details["bitwise_differs"] and len(result.failures) == 1:
        pytest.skip(f"{result.summary()} (this schedule cannot show batch variance, so bitwise checks prove little)")
    if not result.passed:
        pytest.fail(f"[numerics.{check}] {result.summary()} ({source} schedule)\n"
                    f"replay: pytest --cbatch-impl={numerics.impl.spec} -k '{check}-{dtype}-{workload}'", pytrace=False)


@pytest.mark.parametrize("check,dtype,magnitude", KERNEL_CASES)
def test_attention_kernels(check: str, dtype: str, magnitude: str, request: pytest.FixtureRequest) -> None:
    """The engine's attention (SDPA prefill, split-KV decode) on long ragged rows (up to 2,011 keys); at large
    scores also with a later split-KV partition's max leading the first's by > 100, and the reverse."""
    from pytest_cbatch.gpu_checks.attention import LARGE_SCORE_GAIN, run_attention_parity

    request.node.user_properties += [("cbatch_clause", f"numerics.{check}"), ("cbatch_workload", "ragged")]
    gain = LARGE_SCORE_GAIN if check == "attention_large_scores" else 1.0
    result = run_attention_parity(dtype, device="cuda" if dtype == "bfloat16" else "cpu", q_gain=gain,
                                  magnitude=magnitude)
    _kit_only(result, "the kit's attention kernels on rows of its own, which no report of the implementation "
                      "schedules", replay=f"python -m pytest_cbatch.gpu_checks --dtype {dtype}")


def _kit_only(result: CheckResult, what: str, replay: str = "") -> None:
    """End a test whose check judged no report of the implementation (``what`` says what it ran on): it is
    never the implementation's pass, so a pass is a skip saying so; a failure fails, since the kit's own
    numerics do not hold on this machine and no numeric verdict here can be trusted."""
    if result.passed:
        pytest.skip(f"not judged: {what}, so it is not the implementation's pass (it holds: {result.summary()})")
    pytest.fail(f"[numerics.{result.name}] the kit's own numerics fail here ({what}): {result.summary()}"
                + (f"\nreplay: {replay}" if replay else ""), pytrace=False)
