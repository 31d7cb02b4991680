"""``python -m gpu_checks`` end to end on CPU, and the shipped suite module under pytest."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="gpu_checks need torch")

from pytest_cbatch.gpu_checks.cli import main  # noqa: E402


def test_command_runs_end_to_end_on_cpu(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "gpu.json"
    threads = torch.get_num_threads()
    try:
        rc = main(["--device", "cpu", "--dtype", "bfloat16", "--quick", "--json", str(out)])
    finally:
        torch.set_num_threads(threads)
    text = capsys.readouterr().out
    assert rc == 0, text
    header = text.splitlines()[2].split()
    assert header == ["check", "dtype", "metric", "tolerance", "verdict", "time"]
    assert "bfloat16 asked on CPU: running float32" in text and "decode step tiny" in text

    doc = json.loads(out.read_text())
    assert doc["passed"] is True and doc["settings"]["dtypes"] == ["float32"]
    assert doc["environment"]["device"] == "cpu" and doc["environment"]["torch"] == torch.__version__
    names = {r["name"] for r in doc["results"]}
    assert {"attention_parity", "batched_vs_alone", "preemption_vs_none", "batch_invariance",
            "negative_control", "clean", "mutant:cross_row_leak"} <= names
    for r in doc["results"]:
        assert r["passed"], r
        if r["mode"] != "must_fail" and r["metrics"] is not None:
            assert r["metrics"]["nonfinite"] == 0 and r["metrics"]["worst"]["request"]
    step = doc["decode_steps"][0]
    assert step["achieved_ms"] > 0 and step["floor_ms"] > 0 and isinstance(step["overhead_bound"], bool)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA refusal")
def test_cuda_requested_without_cuda_is_refused() -> None:
    with pytest.raises(SystemExit, match="no CUDA device"):
        main(["--device", "cuda"])


def test_suite_module_runs_on_the_reference_scheduler(pytester: pytest.Pytester) -> None:
    """The module given by path (no redirect); that its negative control passes on the reference's chunked
    schedule is checked by tests/test_plugin.py's whole-suite run, which computes that workload anyway."""
    import pytest_cbatch.suite as suite

    module = Path(suite.__file__).with_name("test_numerics.py")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--cbatch-impl=reference",
                                           "-k", "float64-demo", str(module))
    result.assert_outcomes(passed=7)


# Says, at the end of the run, whether anything imported torch.
TORCH_PROBE = """
    import sys

    def pytest_terminal_summary(terminalreporter):
        terminalreporter.write_line(f"torch imported: {'torch' in sys.modules}")
"""


def test_collecting_the_whole_suite_imports_no_torch(pytester: pytest.Pytester) -> None:
    """Collecting every suite module (numerics ids and marks included) needs no torch, so a run whose
    selection leaves out the numerics never pays its import (the runs that select them need it: above)."""
    pytester.makeconftest(TORCH_PROBE)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--cbatch-impl=reference",
                                           "-k", "completes-demo and not serial")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["torch imported: False"])


BROKEN_SCHEMA = """
from pytest_cbatch.reference.scheduler_sim import simulate as reference


def simulate(trace, **config):
    report = reference(trace, **config)
    for event in report["events"]:
        for row in event.get("work", []):
            row["tokens"] = row.pop("input_tokens")   # a dispatch row without its required field
    return report
"""


def test_a_schema_invalid_report_skips_the_numerics_and_points_at_schema_valid(pytester: pytest.Pytester) -> None:
    import pytest_cbatch.suite as suite

    pytester.makepyfile(broken_schema=BROKEN_SCHEMA)
    module = Path(suite.__file__).with_name("test_numerics.py")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--cbatch-impl=broken_schema.py:simulate",
                                           "-rs", "-k", "float64-demo or float64-long", str(module))
    text = result.stdout.str()
    outcomes = result.parseoutcomes()
    assert outcomes.get("skipped", 0) >= 10 and "passed" not in outcomes and "failed" not in outcomes, text
    assert "KeyError" not in text and "Traceback" not in text
    assert "[schema_valid] the report of workload 'demo' fails schema_valid" in text
    assert "/events/" in text and "replay: pytest --cbatch-impl=broken_schema.py:simulate -k schema_valid" in text


def test_a_check_that_raises_is_recorded_as_a_failure_and_the_run_goes_on() -> None:
    from pytest_cbatch.gpu_checks.cli import _guarded

    def broken() -> None:
        raise RuntimeError("CUDA error: device-side assert triggered")

    [result] = _guarded("attention_parity", "bfloat16", "cuda", broken)
    assert not result.passed and "RuntimeError: CUDA error" in result.metric


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_command_runs_end_to_end_on_cuda(tmp_path: Path) -> None:
    out = tmp_path / "gpu.json"
    assert main(["--device", "cuda", "--quick", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["environment"]["tf32_matmul"] is False and doc["settings"]["dtypes"] == ["bfloat16", "float32"]
    assert all("error" not in t for t in doc["decode_steps"])


NO_TORCH = "import sys; sys.modules['torch'] = None; from pytest_cbatch.cli import main; sys.exit(main({argv!r}))"


def _without_torch(argv: list[str]) -> subprocess.CompletedProcess[str]:
    """``cbatch ARGV`` in a fresh interpreter where ``import torch`` fails."""
    return subprocess.run([sys.executable, "-c", NO_TORCH.format(argv=argv)], capture_output=True, text=True,
                          timeout=120)


def test_cbatch_gpu_help_shows_the_options_with_defaults_and_units_without_torch() -> None:
    done = _without_torch(["gpu", "--help"])
    assert done.returncode == 0, done.stderr
    text = " ".join(done.stdout.split())
    assert done.stdout.startswith("usage: cbatch gpu [-h] [--device")
    for piece in ("--budget SECONDS", "(default: the profile's, 360 s for gpu", "--threads", "(default: 1;",
                  "--seed SEED", "(default: 0)", "--profile {cpu,gpu}", "(default: gpu on cuda, cpu otherwise)",
                  "works without torch", "Exit status: 0"):
        assert piece in text, piece


def test_cbatch_gpu_dry_run_needs_no_torch() -> None:
    done = _without_torch(["gpu", "--profile", "gpu", "--dry-run"])
    assert done.returncode == 0, done.stderr
    assert "profile gpu" in done.stdout and "estimate:" in done.stdout and "budget 360 s" in done.stdout
    auto = _without_torch(["gpu", "--dry-run"])
    assert auto.returncode == 0 and "torch is not installed: --device auto plans for cpu" in auto.stdout
    run = _without_torch(["gpu", "--device", "cpu"])
    assert run.returncode == 2 and "need torch" in run.stderr
