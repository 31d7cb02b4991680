"""SGLang's own OpenAI server on CPU (``python -m cbatch_sglang.server``), judged through the kit's live client.

The server is SGLang 0.5.23's ``launch_server``: its HTTP front end and TokenizerManager, and the
Scheduler and DetokenizerManager processes it spawns; only the scheduler process's model worker is the
stand-in of ``cbatch_sglang.engine`` (one sampled token id, ``SYNTHETIC_TOKEN``, per request per
forward).  Runs only where SGLang and the adapter are installed (``.ci/sglang-server-job`` runs it with
``--run-slow``); the tests that start a server (about a minute on 2 cores) or import SGLang's model code
need ``--run-slow``.  No verdict depends on speed.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any, Iterator

import pytest

# Looked up, not imported: `import sglang` needs the adapter's triton stand-in first.
if importlib.util.find_spec("sglang") is None:
    pytest.skip("SGLang is not installed here: build its venv with .ci/sglang-venv", allow_module_level=True)
if importlib.util.find_spec("cbatch_sglang") is None:
    pytest.skip("the SGLang adapter is not installed: pip install -e examples/sglang (in .ci/sglang-venv)",
                allow_module_level=True)
pytest.importorskip("aiohttp", reason="the live client needs the live extra")

from cbatch_sglang import server  # noqa: E402
from cbatch_sglang.engine import SYNTHETIC_TOKEN  # noqa: E402
from pytest_cbatch.contract import CLAIMS, check_report  # noqa: E402
from pytest_cbatch.impls import resolve_impl  # noqa: E402
from pytest_cbatch.live.local_server import ServerStartError, post_json, running  # noqa: E402
from pytest_cbatch.workloads import BASE_CONFIG  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
STARTUP_SECONDS = 300
CONTEXT = 64      # the short-context server: both findings sit at its edge
slow = pytest.mark.skipif("not config.getoption('--run-slow')",
                          reason="starts SGLang's server or imports its model code (a minute on 2 cores): --run-slow")


def test_the_launcher_adds_what_the_stand_in_needs_and_keeps_what_is_given() -> None:
    argv = server.server_argv(["--model-path", "m", "--max-total-tokens", "256"])
    assert argv[:4] == ["--model-path", "m", "--max-total-tokens", "256"]
    assert argv.count("--max-total-tokens") == 1
    assert argv[argv.index("--max-running-requests") + 1] == server.DEFAULTS["--max-running-requests"]
    assert argv[-len(server.FIXED_FLAGS):] == list(server.FIXED_FLAGS)


@pytest.mark.parametrize("flag", [["--device", "cuda"], ["--device=cpu"]])
def test_the_launcher_refuses_a_device(flag: list[str]) -> None:
    with pytest.raises(SystemExit, match="runs on the CPU only"):
        server.server_argv(["--model-path", "m", *flag])


def _env(**extra: str) -> dict[str, str]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", **extra}
    env.pop("SGLANG_USE_CPU_ENGINE", None)
    return env


@pytest.fixture(scope="module")
def short_context(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """(URL, model directory) of a server with context 64 and a pool of 256 tokens; stopped at the end."""
    work = tmp_path_factory.mktemp("sglang-server")
    model = str(work / "model")
    subprocess.run([sys.executable, "-m", "cbatch_vllm.tiny_model", model], check=True, timeout=300,
                   env=_env(PYTHONPATH=str(ROOT / "examples" / "vllm")), stdout=subprocess.DEVNULL)
    args = ["-m", "cbatch_sglang.server", "--model-path", model, "--host", "127.0.0.1",
            "--context-length", str(CONTEXT), "--max-total-tokens", "256"]
    try:
        with running(args, work, startup_seconds=STARTUP_SECONDS, env={"SGLANG_USE_CPU_ENGINE": "0"}) as url:
            yield url, model
    except ServerStartError as exc:
        pytest.fail(f"python -m cbatch_sglang.server: {exc}")


def _run(url: str, model: str, trace: list[dict[str, Any]]) -> dict[str, Any]:
    return resolve_impl(url, model=model, tick_seconds=0.05, timeout=120).run(trace, BASE_CONFIG).report


@slow
def test_sglangs_server_serves_with_the_stand_in_worker(short_context: tuple[str, str]) -> None:
    url, model = short_context
    with urllib.request.urlopen(url + "/v1/models", timeout=30) as resp:
        assert [m["id"] for m in json.loads(resp.read())["data"]] == [model]
    status, body = post_json(url + "/v1/completions", {"model": model, "prompt": [100, 101, 102], "max_tokens": 4,
                                                       "ignore_eos": True, "return_token_ids": True})
    assert status == 200, body
    choice = json.loads(body)["choices"][0]
    # Every token came from the stand-in in SGLang's scheduler process, through its detokenizer.
    assert choice["token_ids"] == [SYNTHETIC_TOKEN] * 4 and choice["finish_reason"] == "length"


@slow
def test_finding_max_tokens_is_cut_to_two_below_the_context_without_a_word(short_context: tuple[str, str]) -> None:
    # The front end admits prompt + max_tokens <= context_len (tokenizer_manager.py ~1355); the scheduler's
    # max_req_len is context_len - 1 (tp_worker.py ~568) and init_req_max_new_tokens (scheduler.py ~2710)
    # cuts max_new_tokens to max_req_len - prompt - 1.  "capped" is 13 tokens: 51 asked, 49 served.
    url, model = short_context
    trace = [json.loads(line) for line in (ROOT / "examples/sglang/server-traces/max-tokens-capped.jsonl").open()]
    report = _run(url, model, trace)
    row = report["requests"]["capped"]
    assert (row["status"], row["output_tokens"], row["finish_reason"]) == ("finished", CONTEXT - 2 - 13, "length")
    violations = check_report(report, trace, BASE_CONFIG, clauses=["finished_outputs_complete"], honoured=CLAIMS)
    assert [v.clause for v in violations] == ["finished_outputs_complete"]
    assert "finished after 49 of 51 requested tokens" in violations[0].message


@slow
def test_finding_a_prompt_the_front_end_admits_is_refused_inside_a_200_stream(short_context: tuple[str, str]) -> None:
    # max_req_input_len is max_req_len - 5 = 58 (tp_worker.py ~572); the front end refuses only a prompt
    # of >= context_len (64).  A 59-token prompt asking for 2 (61 <= 64) gets HTTP 200, an error frame
    # from the scheduler's check, and a usage frame claiming one completion token it never sent.
    url, model = short_context
    body = {"model": model, "prompt": list(range(100, 159)), "max_tokens": 2, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}
    status, text = post_json(url + "/v1/completions", body)
    assert status == 200
    frames = [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: {")]
    assert "exceeds the maximum allowed length (58 tokens)" in frames[0]["error"]["message"]
    assert frames[-1]["usage"]["completion_tokens"] == 1 and not any(f.get("choices") for f in frames)
    # The kit reports it rejected with SGLang's words, and counts no token for it.
    trace = [{"time": 0, "event": "arrival", "id": "too-long", "prompt_tokens": 43, "output_tokens": 2}]
    row = _run(url, model, trace)["requests"]["too-long"]
    assert (row["status"], row["output_tokens"]) == ("rejected", 0)
    assert "exceeds the maximum allowed length (58 tokens)" in row["error"]


_STOCK_WORKER = """
import os, sys
from cbatch_sglang import stand_ins
stand_ins.install()
try:
    if os.environ.get("SGLANG_USE_CPU_ENGINE") == "1":
        import sglang.kernels.ops.kvcache.cache_move  # SGLang's CPU path: its KV pool module
    else:
        import torch
        from sglang.srt.layers.rotary_embedding.base import RotaryEmbedding
        RotaryEmbedding(32, 32, 64, 10000, True, torch.float32)  # what LlamaAttention builds
except ModuleNotFoundError as exc:
    print(exc.name)
"""


@slow
@pytest.mark.parametrize(("cpu_engine", "missing"), [("1", "sgl_kernel"), ("0", "vllm")])
def test_sglangs_own_model_worker_stops_on_this_cpu_at_a_missing_kernel_package(cpu_engine: str, missing: str) -> None:
    # SGLANG_USE_CPU_ENGINE=1: kernels/ops/kvcache/cache_move.py line 10 imports sgl_kernel's CPU build;
    # without it, layers/rotary_embedding/base.py line 138 imports vllm._custom_ops.
    done = subprocess.run([sys.executable, "-c", _STOCK_WORKER], env={**_env(), "SGLANG_USE_CPU_ENGINE": cpu_engine},
                          capture_output=True, text=True, timeout=300)
    assert done.stdout.strip().splitlines()[-1:] == [missing], done.stderr[-2000:]
