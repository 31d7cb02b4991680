"""Probes of what a client sees from vLLM's OpenAI server, measured, for the README's findings.

``python -m cbatch_vllm.findings --base-url URL [--json PATH]`` runs three probes:

* ``frames``: ``streams`` concurrent streams of ``max_tokens`` tokens with
  ``return_token_ids``: how many data frames carried more than one token, and
  the most tokens in one frame (vLLM coalesces tokens when the HTTP side falls
  behind, so frames != tokens);
* ``one_token``: ``max_tokens=1``: the number of token frames, the finish
  reason, whether a usage frame and ``[DONE]`` follow;
* ``capping``: ``max_tokens`` one more than ``max_model_len`` minus the prompt
  (vLLM answers 200 and serves fewer tokens, finish reason ``length``), and
  ``max_tokens`` above ``max_model_len`` (vLLM answers 400).

Each probe records what it saw; none of them judges: the CI job compares.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from typing import Any, Sequence

from pytest_cbatch.live import LiveError
from pytest_cbatch.live.client import Stream, build_payload, get_json, pick_model, prompt_words, session, stream, \
    url_for
from pytest_cbatch.live.replay import run_coroutine

__all__ = ["probe", "main"]


async def _streams(client: Any, url: str, model: str, prompts: list[str], max_tokens: int) -> list[Stream]:
    states = [Stream(url, sent=time.perf_counter()) for _ in prompts]
    await asyncio.gather(*(stream(client, url, build_payload("completions", model, p, max_tokens), s)
                           for p, s in zip(prompts, states)))
    broken = next((s.error for s in states if s.error), None)
    if broken:
        raise LiveError(broken)
    return states


async def _frames(client: Any, url: str, model: str, streams: int, max_tokens: int) -> dict[str, Any]:
    prompts = [prompt_words(0, f"frames/{i}", 32) for i in range(streams)]
    states = await _streams(client, url, model, prompts, max_tokens)
    sizes = [f.tokens for s in states for f in s.frames]
    return {"streams": streams, "max_tokens": max_tokens, "tokens": sum(sizes), "frames": len(sizes),
            "coalesced_frames": sum(1 for n in sizes if n > 1), "max_tokens_per_frame": max(sizes),
            "usage_agrees": all(s.usage_tokens == s.tokens for s in states)}


async def _one_token(client: Any, url: str, model: str) -> dict[str, Any]:
    (state,) = await _streams(client, url, model, [prompt_words(0, "one-token", 8)], 1)
    return {"token_frames": len(state.frames), "tokens": state.tokens, "finish_reason": state.finish_reason,
            "usage_tokens": state.usage_tokens, "done": state.done}


async def _post(client: Any, url: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    async with client.post(url, json=body) as resp:
        return resp.status, await resp.json(content_type=None)


async def _capping(client: Any, base_url: str, url: str, model: str) -> dict[str, Any]:
    listed = (await get_json(client, url_for(base_url, "/models")))["data"][0]
    max_model_len = listed.get("max_model_len")
    if not isinstance(max_model_len, int):
        raise LiveError(f"{url_for(base_url, '/models')}: no max_model_len listed for {model}")
    prompt = prompt_words(0, "capping", 8)
    status, doc = await _post(client, url, build_payload("completions", model, prompt, 1, stream=False))
    if status != 200:
        raise LiveError(f"{url}: HTTP {status} for a one-token request: {doc}")
    prompt_tokens = doc["usage"]["prompt_tokens"]
    asked = max_model_len - prompt_tokens + 1
    status, doc = await _post(client, url, build_payload("completions", model, prompt, asked, stream=False))
    over_status, over = await _post(client, url, build_payload("completions", model, prompt, max_model_len + 1,
                                                               stream=False))
    return {"max_model_len": max_model_len, "prompt_tokens": prompt_tokens, "max_tokens": asked, "status": status,
            "completion_tokens": doc.get("usage", {}).get("completion_tokens"),
            "finish_reason": (doc.get("choices") or [{}])[0].get("finish_reason"),
            "over_max_model_len": {"max_tokens": max_model_len + 1, "status": over_status,
                                   "message": str((over.get("error") or {}).get("message", ""))[:200]}}


async def _probe(base_url: str, streams: int, max_tokens: int, timeout: float) -> dict[str, Any]:
    url = url_for(base_url, "/completions")
    async with session(timeout) as client:
        model = await pick_model(client, base_url, None, "--model NAME")
        return {"base_url": base_url, "model": model,
                "frames": await _frames(client, url, model, streams, max_tokens),
                "one_token": await _one_token(client, url, model),
                "capping": await _capping(client, base_url, url, model)}


def probe(base_url: str, *, streams: int = 16, max_tokens: int = 64, timeout: float = 120.0) -> dict[str, Any]:
    """Run the three probes (module docstring) and return what they saw; LiveError naming the URL on failure."""
    return run_coroutine(_probe(base_url, streams, max_tokens, timeout))


def describe(doc: dict[str, Any]) -> str:
    """One line per probe."""
    fr, one, cap = doc["frames"], doc["one_token"], doc["capping"]
    over = cap["over_max_model_len"]
    return "\n".join([
        f"frames: {fr['streams']} concurrent streams of {fr['max_tokens']} tokens: {fr['tokens']} tokens in "
        f"{fr['frames']} frames, {fr['coalesced_frames']} frames with more than one token (up to "
        f"{fr['max_tokens_per_frame']}); usage counts agree: {fr['usage_agrees']}",
        f"max_tokens=1: {one['token_frames']} token frame(s), {one['tokens']} token(s), finish_reason "
        f"{one['finish_reason']!r}, usage {one['usage_tokens']}, [DONE] {one['done']}",
        f"capping: prompt {cap['prompt_tokens']} tokens, max_model_len {cap['max_model_len']}, max_tokens "
        f"{cap['max_tokens']} -> HTTP {cap['status']}, {cap['completion_tokens']} tokens, finish_reason "
        f"{cap['finish_reason']!r}; max_tokens {over['max_tokens']} -> HTTP {over['status']} {over['message']!r}",
    ])


def main(argv: Sequence[str] | None = None) -> int:
    """The CLI: print the probes (and write them with --json); exit 2 when the server cannot be used."""
    parser = argparse.ArgumentParser(prog="python -m cbatch_vllm.findings", description=__doc__.split("\n")[0])
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--streams", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per request (default 120)")
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args(argv)
    try:
        doc = probe(args.base_url, streams=args.streams, max_tokens=args.max_tokens, timeout=args.timeout)
    except (LiveError, OSError, KeyError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(describe(doc))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(doc, fh, indent=2)
            fh.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
