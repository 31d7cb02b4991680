"""The numeric checks: one schedule (or two) in, :class:`CheckResult` objects out.

Public entry points (all run on the tiny preset on CPU within seconds):

* :func:`run_schedule_checks` — the checks that need one schedule
  (``SCHEDULE_CHECKS``): oracle self-test, backend parity, batched vs alone,
  chunked vs whole prefill, page reuse under poison, row order, determinism.
* :func:`run_preemption_check` — the same trace scheduled with and without
  preemption must compute the same logits everywhere.
* :func:`run_invariance_checks` — the opt-in bitwise batch-invariance mode
  and its negative control.
* :func:`mutant_kill_matrix` — every injected bug must fail a check while the
  clean engine passes.

The attention-kernel checks live in :mod:`.attention`.

Every verdict requires all compared logits to be finite, checked explicitly.
Tolerances live in ``TOLERANCES`` (justified in the package README).
"""

from __future__ import annotations

import functools
import math
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Callable, Iterable, Mapping, Sequence


from .catalog import LEAD_CHECKS, SCHEDULE_CHECKS
from .engine import BUGS, EngineConfig, ScheduleError, run_schedule
from .metrics import Metrics, compare
from .model import DTYPES, PRESETS, Model
from .oracle import dense_records
from .schedules import alone_schedule
from .streams import Records, Streams
from .threads import pinned

__all__ = [
    "Tolerance", "TOLERANCES", "CheckResult", "SCHEDULE_CHECKS", "KILL_CHECKS", "LEAD_CHECKS", "LARGE_SCORE_MIN",
    "get_model",
    "run_schedule_checks", "run_preemption_check", "run_invariance_checks", "mutant_kill_matrix",
]


@dataclass(frozen=True)
class Tolerance:
    """Pass criteria of tolerance mode for one dtype.

    ``max_kl`` bounds KL(reference || sut) at every position and ``max_abs`` the
    largest |Δlogit| (None: not bounded directly).  When ``ratio`` is set, a
    comparison against the dense oracle also needs ``err(sut) <= ratio *
    err(alone) + floor``, errors being max |Δlogit| against the float64 dense
    oracle and ``alone`` the dense oracle in the same dtype (FlashAttention's
    test rule).  ``flip_margin``: top-1 flips count only where the reference's
    top-1/top-2 margin exceeds it.  ``attn_*``: attention-backend parity;
    ``attn_large_atol``: either backend against a float64 reference at large
    scores (its error grows with the scores' magnitude).
    """

    max_kl: float
    max_abs: float | None
    ratio: float | None = None
    floor: float | None = None
    flip_margin: float = 0.5
    attn_atol: float = 0.0
    attn_rtol: float = 0.0
    attn_large_atol: float = 0.0

    def describe(self, with_ratio: bool) -> str:
        """Short text of the criterion, e.g. ``kl<=1e-06 |d|<=1e-03 flips=0 finite``."""
        parts = [f"kl<={self.max_kl:.0e}"]
        if self.max_abs is not None:
            parts.append(f"|d|<={self.max_abs:.0e}")
        if with_ratio and self.ratio is not None:
            parts.append(f"|d_fp64|<={self.ratio:g}*alone+{self.floor:g}")
        parts.append("flips=0 finite")
        return " ".join(parts)


TOLERANCES: dict[str, Tolerance] = {
    "float64": Tolerance(max_kl=1e-12, max_abs=1e-9, attn_atol=1e-10, attn_rtol=1e-10, attn_large_atol=1e-10),
    "float32": Tolerance(max_kl=1e-6, max_abs=1e-3, attn_atol=2e-5, attn_rtol=1e-5, attn_large_atol=2e-4),
    "bfloat16": Tolerance(max_kl=3e-2, max_abs=None, ratio=2.0, floor=0.2, flip_margin=1.0, attn_atol=1.5e-2,
                          attn_rtol=1e-2, attn_large_atol=5e-2),
}
LARGE_SCORE_MIN = 100.0
"""``large_scores`` and ``attention_large_scores`` fail unless some attended
score reaches this: above 88.7, where ``exp`` overflows in float32 and bfloat16."""


@dataclass
class CheckResult:
    """Outcome of one check.

    ``mode``: ``"tolerance"``, ``"bitwise"``, ``"must_fail"`` (a mutant or
    negative control that must be caught) or ``"info"``.  ``metrics`` holds
    the comparison behind the verdict (max KL, max |Δ|, hard flips,
    non-finite count, bitwise fraction, worst position); ``failures`` says
    why a tolerance/bitwise verdict failed; ``skipped`` is set (and
    ``passed`` True) when the schedule gives the check nothing to test.
    """

    name: str
    dtype: str
    device: str
    workload: str
    passed: bool
    mode: str
    metric: str
    tolerance: str
    seconds: float = 0.0
    metrics: Metrics | None = None
    failures: list[str] = field(default_factory=list)
    skipped: str | None = None
    details: dict[str, Any] = field(default_factory=dict)

    def summary(self) -> str:
        """One line: name, dtype, verdict, metric vs tolerance, worst position, reasons."""
        head = f"{self.name} [{self.dtype}, {self.workload or '-'}]"
        if self.skipped:
            return f"{head}: skipped ({self.skipped})"
        text = f"{head}: {'PASS' if self.passed else 'FAIL'} {self.metric} vs {self.tolerance}"
        if self.metrics is not None and self.metrics.worst:
            w = self.metrics.worst
            text += f"; worst request {w['request']!r} position {w['position']} phase {w['phase']} step {w['step']}"
        if self.failures:
            text += "; " + "; ".join(self.failures)
        return text

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready dict (non-finite floats become strings)."""
        def clean(x: Any) -> Any:
            if isinstance(x, float) and not math.isfinite(x):
                return str(x)
            if isinstance(x, dict):
                return {k: clean(v) for k, v in x.items()}
            if isinstance(x, (list, tuple)):
                return [clean(v) for v in x]
            return x
        return clean(asdict(self))


@functools.lru_cache(maxsize=6)
def get_model(preset: str, seed: int, dtype: str, device: str) -> Model:
    """The seeded model (cached: drawing gpu-small takes seconds)."""
    return Model.from_seed(PRESETS[preset], seed, DTYPES[dtype], device)


def _metric_text(m: Metrics) -> str:
    bitwise = "n/a" if m.bitwise_frac is None else f"{m.bitwise_frac:.0%}"
    return (f"kl={m.max_kl:.1e} |d|={m.max_abs:.1e} flips={m.hard_flips} nonfinite={m.nonfinite} "
            f"bitwise={bitwise} n={m.n_positions}")


def _tolerance_failures(m: Metrics, tol: Tolerance, hi_errors: tuple[float, float] | None = None) -> list[str]:
    out = []
    if not m.finite:
        out.append(f"{m.nonfinite} positions with non-finite logits")
    if m.hard_flips:
        out.append(f"{m.hard_flips} top-1 flips with reference margin > {tol.flip_margin:g}")
    if not m.max_kl <= tol.max_kl:
        out.append(f"max_kl {m.max_kl:.3e} > {tol.max_kl:.0e}")
    if tol.max_abs is not None and not m.max_abs <= tol.max_abs:
        out.append(f"max|d| {m.max_abs:.3e} > {tol.max_abs:.0e}")
    if hi_errors is not None and tol.ratio is not None:
        err, alone = hi_errors
        bound = tol.ratio * alone + (tol.floor or 0.0)
        if not err <= bound:
            out.append(f"error vs float64 oracle {err:.3e} > {tol.ratio:g}*{alone:.3e}+{tol.floor:g}")
    return out


def _bitwise_failures(m: Metrics) -> list[str]:
    out = [] if m.finite else [f"{m.nonfinite} positions with non-finite logits"]
    if m.bitwise_frac != 1.0:
        frac = "n/a" if m.bitwise_frac is None else f"{m.bitwise_frac:.1%}"
        out.append(f"only {frac} of positions bitwise equal")
    return out


class _Session:
    """One schedule on one model: streams, oracles and engine runs, each computed once."""

    def __init__(self, trace: Iterable[Mapping[str, Any]], report: Mapping[str, Any], *, dtype: str,
                 device: str, preset: str, seed: int, block_size: int | None, workload: str) -> None:
        if dtype not in TOLERANCES:
            raise ValueError(f"dtype must be one of {sorted(TOLERANCES)}, got {dtype!r}")
        self.trace = list(trace)
        self.events = list(report["events"])
        self.dtype, self.device, self.preset, self.seed, self.workload = dtype, device, preset, seed, workload
        self.model = get_model(preset, seed, dtype, device)
        self.block_size = block_size or report.get("config", {}).get("block_size") or self.model.config.block_size
        self.streams = Streams.from_trace(self.trace, self.model.config.vocab, seed)
        self.tol = TOLERANCES[dtype]
        ids = [w["id"] for e in self.events if e.get("event") == "dispatch" for w in e["work"]]
        self.requests = [r for r in dict.fromkeys(map(str, ids)) if r in self.streams.tokens]
        self._runs: dict[tuple[str, EngineConfig], Records] = {}

    def run(self, schedule: str = "schedule", **options: Any) -> Records:
        """Engine run of ``"schedule"`` (the report) or ``"alone"`` (each request alone, whole)."""
        config = EngineConfig(block_size=self.block_size, **options)
        key = (schedule, config)
        if key not in self._runs:
            events = self.events if schedule == "schedule" else self.alone_events
            self._runs[key] = run_schedule(self.model, self.streams, events, config)
        return self._runs[key]

    @functools.cached_property
    def alone_events(self) -> list[dict[str, Any]]:
        return alone_schedule({r: self.streams.fed_len(r) for r in self.requests})

    @functools.cached_property
    def dense(self) -> Records:
        if self.dtype == "float64":   # the same computation as the float64 oracle: run it once
            return self.dense_hi
        return dense_records(self.model, self.streams, self.requests)

    @functools.cached_property
    def dense_hi(self) -> Records:
        hi = get_model(self.preset, self.seed, "float64", self.device)
        return dense_records(hi, self.streams, self.requests, peak=self.peaks, leads=self.leads)

    @functools.cached_property
    def peaks(self) -> list[float]:
        return []

    @functools.cached_property
    def leads(self) -> dict[str, Any]:
        return {}

    def decode_lead(self, run: Records, side: int) -> float:
        """Largest split-KV partition lead (``side`` 0: a later partition over the first; 1: the
        first over the newest key's) at the decode positions of ``run``, from the float64 oracle."""
        _ = self.dense_hi
        values = [float(self.leads[r][p, side]) for r, p, ph in zip(run.request, run.position, run.phase)
                  if ph == "decode" and r in self.leads]
        return max(values, default=float("-inf"))

    @property
    def peak_score(self) -> float:
        """Largest attention score the float64 oracle attended (computes the oracle if needed)."""
        _ = self.dense_hi
        return max(self.peaks, default=0.0)

    def result(self, name: str, m: Metrics, failures: list[str], *, mode: str = "tolerance",
               ratio: bool = False, **details: Any) -> CheckResult:
        tolerance = "bitwise equal, finite" if mode == "bitwise" else self.tol.describe(ratio)
        return CheckResult(name=name, dtype=self.dtype, device=self.device, workload=self.workload,
                           passed=not failures, mode=mode, metric=_metric_text(m), tolerance=tolerance,
                           metrics=m, failures=failures, details=details)

    def error(self, name: str, exc: Exception) -> CheckResult:
        """A failed result for a check that raised (the other checks of the stage still report)."""
        text = f"error: {type(exc).__name__}: {exc}"[:300]
        return CheckResult(name=name, dtype=self.dtype, device=self.device, workload=self.workload,
                           passed=False, mode="tolerance", metric=text, tolerance="-", failures=[text])

    def skip(self, name: str, reason: str) -> CheckResult:
        return CheckResult(name=name, dtype=self.dtype, device=self.device, workload=self.workload,
                           passed=True, mode="tolerance", metric="-", tolerance="-", skipped=reason)

    def tolerance(self, name: str, sut: Records, ref: Records, **details: Any) -> CheckResult:
        m = compare(sut, ref, flip_margin=self.tol.flip_margin)
        return self.result(name, m, _tolerance_failures(m, self.tol), **details)

    def vs_oracle(self, name: str, sut: Records, *, tol: Tolerance | None = None) -> CheckResult:
        """Tolerance verdict against the dense oracle, plus the ratio rule when ``tol`` has one
        (default: this dtype's tolerance, whose ratio rule applies in bfloat16)."""
        tol = tol or self.tol
        m = compare(sut, self.dense, flip_margin=tol.flip_margin)
        hi_errors = None
        if tol.ratio is not None:
            margin = tol.flip_margin
            hi_errors = (compare(sut, self.dense_hi, flip_margin=margin).max_abs,
                         compare(self.dense, self.dense_hi, flip_margin=margin).max_abs)
        details = {} if hi_errors is None else {"err_vs_fp64": hi_errors[0], "alone_err_vs_fp64": hi_errors[1]}
        result = self.result(name, m, _tolerance_failures(m, tol, hi_errors), ratio=True, **details)
        result.tolerance = tol.describe(True)
        return result


CheckFn = Callable[[_Session, frozenset], CheckResult]


def _oracle_self_test(s: _Session, bugs: frozenset = frozenset()) -> CheckResult:
    return s.vs_oracle("oracle_self_test", s.run("alone", bugs=bugs))


def _backend_parity(s: _Session, bugs: frozenset = frozenset()) -> CheckResult:
    return s.tolerance("backend_parity", s.run(backend="loop", bugs=bugs), s.run(bugs=bugs))


def _batched_vs_alone(s: _Session, bugs: frozenset = frozenset()) -> CheckResult:
    return s.vs_oracle("batched_vs_alone", s.run(bugs=bugs))


def _chunked_vs_whole(s: _Session, bugs: frozenset = frozenset()) -> CheckResult:
    run = s.run(bugs=bugs)
    chunked = {r for r, start in zip(run.request, run.chunk_start) if start}
    if not chunked:
        return s.skip("chunked_vs_whole", "no prefill was split into chunks")
    keep = [i for i, (r, ph) in enumerate(zip(run.request, run.phase)) if r in chunked and ph != "decode"]
    edges = [i for i in keep if run.chunk_start[i]]
    whole = s.run("alone", bugs=bugs)
    edge_kl = compare(run.select(edges), whole, flip_margin=s.tol.flip_margin).max_kl
    return s.tolerance("chunked_vs_whole", run.select(keep), whole, chunk_start_max_kl=edge_kl,
                       chunk_starts=len(edges))


def _page_reuse(s: _Session, bugs: frozenset = frozenset()) -> CheckResult:
    return s.vs_oracle("page_reuse", s.run(pool="tight", bugs=bugs))


def _row_order(s: _Session, bugs: frozenset = frozenset()) -> CheckResult:
    return s.tolerance("row_order", s.run(row_order="reversed", bugs=bugs), s.run(bugs=bugs))


def _determinism(s: _Session, bugs: frozenset = frozenset()) -> CheckResult:
    first = s.run(bugs=bugs)
    again = run_schedule(s.model, s.streams, s.events, EngineConfig(block_size=s.block_size, bugs=bugs))
    m = compare(again, first, flip_margin=s.tol.flip_margin, positional=True)
    return s.result("determinism", m, _bitwise_failures(m), mode="bitwise")


def _large_scores(s: _Session, bugs: frozenset = frozenset(), *, name: str = "large_scores",
                  lead: int | None = None) -> CheckResult:
    """The schedule on a model whose scores pass the overflow range of a naive exp (a ``q_gain``
    preset): finite, within tolerance of the dense run in its dtype, and no further from the
    float64 oracle than ratio x the dense run's own error + floor (any dtype: at scores ~200 the
    float32 model itself is ~1e-3 from float64, so the raw float32 bound cannot apply).

    ``lead`` (0: a later split-KV partition leads the first; 1: the first leads the newest key's)
    also requires that lead to reach ``LARGE_SCORE_MIN`` at some decode of the run (a
    ``*-hot-late`` / ``*-hot-early`` preset on a workload decoding past 512 keys)."""
    tol = s.tol
    if tol.ratio is None:
        tol = replace(tol, ratio=2.0, floor=tol.max_abs)
    run = s.run(bugs=bugs)
    result = s.vs_oracle(name, run, tol=tol)
    peak = s.peak_score
    result.details["peak_score"] = peak
    if not peak >= LARGE_SCORE_MIN:
        result.failures.append(f"attention scores peak at {peak:.1f} < {LARGE_SCORE_MIN:g}: the workload does not "
                               f"reach the overflow range of a naive exp (use a q_gain preset such as narrow-hot)")
    result.tolerance += f" peak_score>={LARGE_SCORE_MIN:g}"
    if lead is not None:
        value = s.decode_lead(run, lead)
        what = ("a later partition's max over the first's", "the first partition's max over the newest key's")[lead]
        result.details["partition_lead"] = value
        result.tolerance += f" lead>={LARGE_SCORE_MIN:g}"
        if not value >= LARGE_SCORE_MIN:
            result.failures.append(f"at the decodes, {what} leads by at most {value:.1f} < {LARGE_SCORE_MIN:g} "
                                   f"(use a *-hot-{('late', 'early')[lead]} preset on a workload past 512 keys)")
    result.passed = not result.failures
    return result


_SCHEDULE_CHECKS: dict[str, CheckFn] = {
    "oracle_self_test": _oracle_self_test,
    "backend_parity": _backend_parity,
    "batched_vs_alone": _batched_vs_alone,
    "chunked_vs_whole": _chunked_vs_whole,
    "page_reuse": _page_reuse,
    "row_order": _row_order,
    "determinism": _determinism,
}
_SCHEDULE_CHECKS["large_scores"] = _large_scores
_SCHEDULE_CHECKS["later_partition_leads"] = functools.partial(_large_scores, name="later_partition_leads", lead=0)
_SCHEDULE_CHECKS["first_partition_leads"] = functools.partial(_large_scores, name="first_partition_leads", lead=1)
KILL_CHECKS = ("batched_vs_alone", "page_reuse")


def _timed(s: _Session, name: str, fn: Callable[[], CheckResult]) -> CheckResult:
    """``fn()`` timed; a check that raises (other than on an unexecutable report) fails alone."""
    t0 = time.perf_counter()
    try:
        result = fn()
    except ScheduleError:
        raise
    except Exception as exc:  # e.g. a non-finite reference: this check fails, its stage's others still report
        result = s.error(name, exc)
    result.seconds = time.perf_counter() - t0
    return result


@pinned
def run_schedule_checks(trace: Iterable[Mapping[str, Any]], report: Mapping[str, Any], *, dtype: str,
                        device: str = "cpu", preset: str = "tiny", seed: int = 0, block_size: int | None = None,
                        checks: Sequence[str] = SCHEDULE_CHECKS, workload: str = "") -> list[CheckResult]:
    """Run ``checks`` (default: all of ``SCHEDULE_CHECKS``) on one scheduler report.

    ``report["events"]`` is executed as is (rows, order, preemptions); token
    streams come from ``trace`` and ``seed``.  The engine's page size is
    ``block_size``, else the report's ``config.block_size``, else the
    preset's.  Raises :class:`~.engine.ScheduleError` when the report cannot
    be executed.  Results come back in the order of ``checks``, which may
    also name ``large_scores`` (meaningful with a ``q_gain`` preset) and
    ``later_partition_leads`` / ``first_partition_leads`` (with a
    ``*-hot-late`` / ``*-hot-early`` preset).  A check that raises (say, on a
    non-finite reference) comes back failed with the error; the others still run.
    """
    s = _Session(trace, report, dtype=dtype, device=device, preset=preset, seed=seed,
                 block_size=block_size, workload=workload)
    unknown = set(checks) - set(_SCHEDULE_CHECKS)
    if unknown:
        raise ValueError(f"unknown checks {sorted(unknown)}; known: {tuple(_SCHEDULE_CHECKS)}")
    return [_timed(s, name, functools.partial(_SCHEDULE_CHECKS[name], s)) for name in checks]


@pinned
def run_preemption_check(trace: Iterable[Mapping[str, Any]], preempted: Mapping[str, Any],
                         baseline: Mapping[str, Any], *, dtype: str, device: str = "cpu", preset: str = "tiny",
                         seed: int = 0, block_size: int | None = None, workload: str = "") -> CheckResult:
    """``preemption_vs_none``: every position of the ``preempted`` report's run (before the
    preemption and recomputed) against the same position of the ``baseline`` report's run.

    Skipped when ``preempted`` has no ``preempted`` event.
    """
    trace = list(trace)
    s = _Session(trace, preempted, dtype=dtype, device=device, preset=preset, seed=seed,
                 block_size=block_size, workload=workload)
    n = sum(1 for e in s.events if e.get("event") == "preempted")
    if not n:
        return s.skip("preemption_vs_none", "the schedule never preempts")
    ref = _Session(trace, baseline, dtype=dtype, device=device, preset=preset, seed=seed,
                   block_size=s.block_size, workload=workload)

    def check() -> CheckResult:
        run = s.run()
        return s.tolerance("preemption_vs_none", run, ref.run(), preemptions=n,
                           recomputed=sum(1 for p in run.phase if p.startswith("recompute")))

    return _timed(s, "preemption_vs_none", check)


@pinned
def run_invariance_checks(trace: Iterable[Mapping[str, Any]], report: Mapping[str, Any], *, dtype: str,
                          device: str = "cpu", preset: str = "tiny", seed: int = 0,
                          block_size: int | None = None, workload: str = "") -> list[CheckResult]:
    """The opt-in bitwise mode and its negative control, batched schedule vs each request alone.

    * ``batch_invariance``: the engine in ``numerics="batch_invariant"`` must
      give bitwise identical logits batched and alone.
    * ``negative_control``: the ``"batch_variant"`` engine (split-K chosen by
      batch size) must FAIL that bitwise check and pass tolerance mode; if it
      passes bitwise, the workload is too insensitive to trust the bitwise check
      (``details["bitwise_differs"]`` is then False).
    """
    s = _Session(trace, report, dtype=dtype, device=device, preset=preset, seed=seed,
                 block_size=block_size, workload=workload)

    def invariance() -> CheckResult:
        m = compare(s.run(numerics="batch_invariant"), s.run("alone", numerics="batch_invariant"),
                    flip_margin=s.tol.flip_margin)
        return s.result("batch_invariance", m, _bitwise_failures(m), mode="bitwise")

    def negative_control() -> CheckResult:
        options = {"numerics": "batch_variant", "pad_to": 1}
        m = compare(s.run(**options), s.run("alone", **options), flip_margin=s.tol.flip_margin)
        bitwise, tolerance = _bitwise_failures(m), _tolerance_failures(m, s.tol)
        failures = list(tolerance)
        if not bitwise:
            failures.append("bitwise check passed on a batch-variant engine: workload too insensitive")
        result = s.result("negative_control", m, failures, mode="must_fail", bitwise_differs=bool(bitwise))
        result.tolerance = f"bitwise must fail; {s.tol.describe(False)}"
        return result

    return [_timed(s, "batch_invariance", invariance), _timed(s, "negative_control", negative_control)]


@pinned
def mutant_kill_matrix(trace: Iterable[Mapping[str, Any]], report: Mapping[str, Any], *,
                       dtype: str = "float64", device: str = "cpu", preset: str = "tiny", seed: int = 0,
                       block_size: int | None = None, bugs: Sequence[str] = tuple(BUGS),
                       workload: str = "", checks: Sequence[str] = KILL_CHECKS) -> list[CheckResult]:
    """Inject each bug alone and run ``checks`` (default ``batched_vs_alone`` and ``page_reuse``).

    Returns a ``clean`` result (passes iff the clean engine passes all) and
    one ``mutant:<bug>`` result per bug (passes iff some check failed
    numerically; ``details["caught_by"]`` names the checks, an exception is
    reported in ``details["crashed"]`` and also counts as caught).
    """
    s = _Session(trace, report, dtype=dtype, device=device, preset=preset, seed=seed,
                 block_size=block_size, workload=workload)
    t0 = time.perf_counter()
    clean = [_timed(s, name, functools.partial(_SCHEDULE_CHECKS[name], s)) for name in checks]
    worst = max(clean, key=lambda r: r.metrics.max_kl if r.metrics else 0.0)
    results = [CheckResult(name="clean", dtype=dtype, device=device, workload=workload,
                           passed=all(r.passed for r in clean), mode="tolerance", metric=worst.metric,
                           tolerance=worst.tolerance, seconds=time.perf_counter() - t0, metrics=worst.metrics,
                           failures=[f for r in clean for f in r.failures])]
    for bug in bugs:
        t0 = time.perf_counter()
        caught: list[CheckResult] = []
        crashed = ""
        for name in checks:
            try:
                r = _SCHEDULE_CHECKS[name](s, frozenset({bug}))
            except Exception as exc:  # a crash is a detection too, but is reported as such
                crashed = f"{name}: {type(exc).__name__}: {exc}"
                continue
            if not r.passed:
                caught.append(r)
        strongest = max(caught, key=lambda r: r.metrics.max_kl) if caught else None
        results.append(CheckResult(
            name=f"mutant:{bug}", dtype=dtype, device=device, workload=workload,
            passed=bool(caught or crashed), mode="must_fail",
            metric=strongest.metric if strongest else (f"crashed ({crashed})" if crashed else "not caught"),
            tolerance="some check must fail", seconds=time.perf_counter() - t0,
            metrics=strongest.metrics if strongest else None,
            details={"caught_by": [r.name for r in caught], "crashed": crashed, "description": BUGS[bug]},
        ))
    return results
