"""The run profiles: the gpu profile's sizing (checked on CPU), --dry-run, the time-budget guard."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="gpu_checks need torch")

from pytest_cbatch.gpu_checks.cli import main  # noqa: E402
from pytest_cbatch.gpu_checks.engine import BUG_REGIMES  # noqa: E402
from pytest_cbatch.gpu_checks.model import PRESETS  # noqa: E402
from pytest_cbatch.gpu_checks.profiles import GPU_MEMORY_BUDGET, PROFILES, Profile, build, estimate  # noqa: E402


@pytest.fixture(scope="module")
def gpu_plan() -> tuple:
    built = build(PROFILES["gpu"])
    return built, estimate(built, PROFILES["gpu"].dtypes)


def test_gpu_profile_covers_long_contexts_large_batches_and_bf16(gpu_plan: tuple) -> None:
    built, size = gpu_plan
    assert PROFILES["gpu"].dtypes == ("bfloat16", "float32") and PROFILES["gpu"].preset == "gpu-small"
    prompts = {name: max(x["prompt_tokens"] for x in trace if x["event"] == "arrival")
               for name, (trace, *_rest) in built.workloads.items()}
    assert prompts["long-gpu"] >= 32000 and size["max_context"] >= 32768 and size["max_batch"] == 64
    decode_batches = [sum(w["phase"] == "decode" for w in e["work"])
                      for e in built.workloads["batch64"][1]["events"] if e["event"] == "dispatch"]
    assert max(decode_batches) == 64
    contexts = {c for _, _, c in PROFILES["gpu"].timings}
    assert min(contexts) >= 8192 and max(contexts) >= 32768
    killed = {b for s in built.stages if s.kind == "kill" for b in s.bugs}
    assert killed == set(BUG_REGIMES)


def test_gpu_profile_fits_one_h100_inside_seven_minutes(gpu_plan: tuple) -> None:
    _, size = gpu_plan
    assert size["peak_bytes"] <= GPU_MEMORY_BUDGET, size
    assert size["estimated_seconds"] + PROFILES["gpu"].checks_reserve_s() <= PROFILES["gpu"].budget_s, size
    assert PROFILES["gpu"].budget_s + 60 <= 420   # a minute of the 7 for start-up and writing the JSON


def test_the_estimate_grows_with_the_plan() -> None:
    small = estimate(build(PROFILES["gpu"], quick=True), ("bfloat16",))
    full = estimate(build(PROFILES["gpu"]), ("bfloat16", "float32"))
    assert small["engine_steps"] < full["engine_steps"] and small["positions"] < full["positions"]
    huge = Profile("huge", "gpu-small", ("bfloat16",), (), (("perf-1b", 64, 131072),), "bfloat16", 360.0)
    assert estimate(build(huge), ("bfloat16",))["peak_bytes"] > GPU_MEMORY_BUDGET   # 128k x 64 would not fit


def test_every_profile_preset_exists() -> None:
    for profile in PROFILES.values():
        assert {s.preset for s in profile.stages} | {p for p, _, _ in profile.timings} <= set(PRESETS)


def test_dry_run_prints_the_gpu_plan_without_running_it(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--profile", "gpu", "--dry-run"]) == 0
    text = capsys.readouterr().out
    assert "profile gpu" in text and "dtypes bfloat16, float32" in text
    assert "long-gpu: 9 requests, longest prompt 32000" in text and "batch 64 context 32768" in text
    assert "estimate:" in text and "budget 360 s" in text


def test_a_spent_budget_records_every_stage_as_not_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "gpu.json"
    threads = torch.get_num_threads()
    try:
        rc = main(["--device", "cpu", "--quick", "--dtype", "float32", "--budget", "0", "--json", str(out)])
    finally:
        torch.set_num_threads(threads)
    assert rc == 1 and "NOT RUN" in capsys.readouterr().out
    doc = json.loads(out.read_text())
    assert doc["passed"] is False and doc["results"] and all(r["mode"] == "not_run" for r in doc["results"])
    assert all("not run" in t["error"] for t in doc["decode_steps"])
