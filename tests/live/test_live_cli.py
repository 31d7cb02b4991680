"""cbatch serve, cbatch load and cbatch invariance against the embedded server."""

from __future__ import annotations

import json
import re
import select
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from pytest_cbatch.cli import main


def test_load_sweep_writes_table_json_and_plot(serve: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib", reason="the plot needs the plot extra")
    url = serve(tick_ms=10)
    out_json, out_png = tmp_path / "load.json", tmp_path / "load.png"
    rc = main(["load", "--base-url", url, "--concurrency", "1", "2", "4", "--requests-per-level", "8",
               "--warmup", "1", "--output-len", "8", "--json", str(out_json), "--plot", str(out_png)])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert re.search(r"^\s+4\s+\d", out, re.M) and "TTFT p99" in out and "knee:" in out
    doc = json.loads(out_json.read_text())
    assert [lv["level"] for lv in doc["levels"]] == [1, 2, 4]
    for lv in doc["levels"]:
        assert lv["completed"] == 8 and lv["failed"] == 0 and lv["total_output_tokens"] == 64
        for key in ("request_throughput", "output_throughput", "mean_ttft_ms", "median_tpot_ms", "p99_itl_ms",
                    "p90_e2el_ms", "achieved_concurrency"):
            assert key in lv, key
    assert doc["levels"][2]["peak_concurrency"] == 4
    assert out_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_load_names_an_unreachable_url(capsys: pytest.CaptureFixture[str]) -> None:
    from .test_live_server import _free_port

    url = f"http://127.0.0.1:{_free_port()}"
    assert main(["load", "--base-url", url, "--concurrency", "1", "--requests-per-level", "1"]) == 2
    err = capsys.readouterr().err
    assert url in err and "cannot reach" in err


@pytest.mark.parametrize("numerics, expected", [("batch_invariant", {"bitwise"}), ("batch_variant", {"drift"})])
def test_invariance_sweep_on_the_tiny_model(serve: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                            numerics: str, expected: set[str]) -> None:
    pytest.importorskip("torch", reason="--backend tiny needs torch")
    url = serve(backend="tiny", numerics=numerics, tick_ms=0)
    out_json = tmp_path / "inv.json"
    rc = main(["invariance", "--base-url", url, "--max-batch", "4", "--output-len", "8", "--json", str(out_json),
               "--require-bitwise"])
    doc = json.loads(out_json.read_text())
    assert [lv["batch_size"] for lv in doc["levels"]] == [1, 2, 4]
    assert {lv["verdict"] for lv in doc["levels"][1:]} == expected, capsys.readouterr().out
    assert rc == (0 if expected == {"bitwise"} else 1)
    # the server's iteration-token histogram shows the batch really ran together
    assert doc["levels"][2]["iteration_tokens"]["mean_tokens_per_step"] > doc["levels"][0]["iteration_tokens"][
        "mean_tokens_per_step"]


def test_cbatch_serve_starts_and_answers(tmp_path: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-m", "pytest_cbatch.cli", "serve", "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        ready, _, _ = select.select([proc.stdout], [], [], 120)   # a limit for a server that hangs
        line = proc.stdout.readline() if ready else ""
        match = re.search(r"http://127\.0\.0\.1:(\d+)/v1", line)
        assert match, (line, proc.stderr.read() if proc.poll() is not None else "no line within 120 s")
        with urllib.request.urlopen(f"http://127.0.0.1:{match.group(1)}/v1/models", timeout=60) as resp:
            assert json.loads(resp.read())["data"][0]["id"] == "cbatch-synthetic"
    finally:
        proc.terminate()
        proc.wait(10)
