"""``transformers serve --continuous-batching`` on 127.0.0.1, serving the tiny seeded model offline:
what its OpenAI routes do that the kit's live client has to meet.

Runs only where transformers and the adapter are installed (``.ci/transformers-job`` runs it).  One
server for the module, started with a bounded wait and stopped with SIGTERM, then SIGKILL.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Iterator

import pytest

pytest.importorskip("transformers", reason="transformers is not installed here: build its venv with "
                                           ".ci/transformers-venv and run .ci/transformers-job")
model_path = pytest.importorskip("cbatch_transformers.model_path", reason="the transformers adapter is not "
                                                                         "installed: pip install -e examples/transformers")

from pytest_cbatch.live.local_server import ServerStartError, post_json as _post, running  # noqa: E402

REPO = "cbatch/tiny-llama"
STARTUP_SECONDS = 240


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """The server on a free port; the hub cache starts absent (HF_HOME/hub does not exist)."""
    work = tmp_path_factory.mktemp("serve")
    model = model_path.make_tiny_model(work / "model", seed=0)
    args = ["-c", "from transformers.cli.transformers import main; main()", "serve", str(model),
            "--continuous-batching", "--device", "cpu", "--dtype", "float32", "--attn-implementation", "sdpa",
            "--cb-num-blocks", "64", "--cb-block-size", "16", "--cb-max-batch-tokens", "128", "--host", "127.0.0.1"]
    try:
        with running(args, work, startup_seconds=STARTUP_SECONDS) as url:
            yield url, model
    except ServerStartError as exc:
        pytest.fail(f"transformers serve: {exc}")


def test_listing_models_without_a_hub_cache_directory_is_a_server_error(server: tuple[str, Path]) -> None:
    """Finding: GET /v1/models scans the hub cache and raises CacheNotFound when it does not exist."""
    url, _ = server
    status, body = _get(url + "/v1/models")
    assert status == 500, body


def test_the_kits_fixed_length_request_fields_are_refused(server: tuple[str, Path]) -> None:
    """Finding: the server refuses fields it does not know (HTTP 422) instead of ignoring them,
    among them ignore_eos and return_token_ids, which the kit's live client sends."""
    url, model = server
    status, body = _post(url + "/v1/completions", {"model": str(model), "prompt": "the cache", "max_tokens": 4,
                                                   "ignore_eos": True, "return_token_ids": True})
    assert status == 422, body
    assert "ignore_eos" in body and "return_token_ids" in body


def test_a_stream_ends_with_usage_in_its_last_frame_and_no_done(server: tuple[str, Path]) -> None:
    url, model = server
    req = urllib.request.Request(url + "/v1/completions", json.dumps({
        "model": str(model), "prompt": "the cache holds", "max_tokens": 8, "stream": True,
        "stream_options": {"include_usage": True}}).encode(), {"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        frames = [line[len(b"data: "):] for line in resp.read().splitlines() if line.startswith(b"data: ")]
    assert frames and b"[DONE]" not in frames
    last = json.loads(frames[-1])
    assert last["choices"][0]["finish_reason"] == "length"
    assert last["usage"]["completion_tokens"] == 8
