"""``cbatch invariance``: is one prompt's output the same at every batch size?

Per batch size B of the ladder 1, 2, 4, ... up to ``--max-batch`` (which is
included), one non-streamed completions request whose ``prompt`` is a list of
B prompts of the same length: the target first, then B - 1 distinct fillers.
Separate concurrent requests are often not batched by a server at all, so the
list forces a real batch.  Temperature 0, ``logprobs``, fixed output length.
Choice 0's token ids (or token texts where the server sends no ids) and
per-token logprobs are compared with the B = 1 run:

* ``bitwise``: same tokens, every logprob identical;
* ``drift``: same tokens, logprobs moved by at most ``max_ulp`` ulp;
* ``diverged``: the tokens differ from ``first_divergent_token`` (0-based) on.

ulp distances are counted in float32 when both values are float32 numbers
(what engines compute logprobs in), else in float64.  Where the server
exports ``vllm:iteration_tokens_total``, its sum and count before and after
each request show how many tokens its steps really ran (printed as evidence).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any, Sequence

from . import LiveError
from .client import build_payload, pick_model, prompt_words, session, url_for
from .prometheus import metric_total, parse_metrics

__all__ = ["ladder", "ulp_distance", "verdict", "run_invariance", "format_report"]


def ladder(max_batch: int) -> list[int]:
    """1, 2, 4, ... below ``max_batch``, then ``max_batch`` itself."""
    sizes, b = [], 1
    while b < max_batch:
        sizes.append(b)
        b *= 2
    return sizes + [max_batch]


def _is_float32(x: float) -> bool:
    try:
        return struct.unpack("<f", struct.pack("<f", x))[0] == x
    except OverflowError:
        return False


def _ordered(x: float, single: bool) -> int:
    """IEEE bits of ``x`` as an integer that orders like the floats (-0.0 and 0.0 both map to 0)."""
    packed, unsigned, width = ("<f", "<I", 32) if single else ("<d", "<Q", 64)
    u = struct.unpack(unsigned, struct.pack(packed, x))[0]
    sign = 1 << (width - 1)
    return u if u < sign else sign - u


def ulp_distance(a: float, b: float) -> int:
    """How many representable floats lie between ``a`` and ``b`` (float32 if both are float32 values)."""
    single = _is_float32(a) and _is_float32(b)
    return abs(_ordered(a, single) - _ordered(b, single))


@dataclass
class Run:
    tokens: list[Any]
    logprobs: list[float]


def verdict(base: Run, other: Run) -> dict[str, Any]:
    """The verdict of ``other`` against the batch-of-one ``base`` (module docstring)."""
    n = min(len(base.tokens), len(other.tokens))
    first = next((i for i in range(n) if base.tokens[i] != other.tokens[i]), None)
    if first is None and len(base.tokens) != len(other.tokens):
        first = n
    if first is not None:
        return {"verdict": "diverged", "first_divergent_token": first, "max_ulp": None}
    gaps = [ulp_distance(a, b) for a, b in zip(base.logprobs, other.logprobs)]
    worst = max(gaps, default=0)
    return {"verdict": "bitwise" if worst == 0 else "drift", "first_divergent_token": None, "max_ulp": worst}


def _run_of(choice: dict[str, Any], url: str) -> Run:
    lp = choice.get("logprobs") or {}
    values = lp.get("token_logprobs")
    if not isinstance(values, list):
        raise LiveError(f"{url}: choice 0 has no logprobs.token_logprobs; the server must return logprobs")
    ids = choice.get("token_ids")
    return Run(list(ids) if isinstance(ids, list) else list(lp.get("tokens") or []), [float(v) for v in values])


async def _iteration_tokens(client: Any, base_url: str) -> tuple[float, float] | None:
    import aiohttp

    url = base_url.rstrip("/").removesuffix("/v1") + "/metrics"
    try:
        async with client.get(url) as resp:
            if resp.status != 200:
                return None
            samples = parse_metrics(await resp.text())
    except (aiohttp.ClientError, OSError):
        return None
    total = metric_total(samples, "vllm:iteration_tokens_total_sum")
    count = metric_total(samples, "vllm:iteration_tokens_total_count")
    return None if total is None or count is None else (total, count)


async def _sweep(base_url: str, sizes: Sequence[int], input_len: int, output_len: int, seed: int,
                 model: str | None, timeout: float) -> dict[str, Any]:
    url = url_for(base_url, "/completions")
    async with session(timeout) as client:
        model = await pick_model(client, base_url, model, "--model NAME")
        target = prompt_words(seed, "target", input_len)
        levels, base = [], None
        for b in sizes:
            prompts = [target] + [prompt_words(seed, f"filler/{b}/{i}", input_len) for i in range(1, b)]
            before = await _iteration_tokens(client, base_url)
            body = build_payload("completions", model, prompts, output_len, stream=False, logprobs=True)
            doc = await _post(client, url, body)
            after = await _iteration_tokens(client, base_url)
            choices = sorted(doc.get("choices") or [], key=lambda c: c.get("index", 0))
            if len(choices) != b:
                raise LiveError(f"{url}: sent {b} prompts, got {len(choices)} choices")
            run = _run_of(choices[0], url)
            base = base or run
            level: dict[str, Any] = {"batch_size": b, **verdict(base, run), "tokens": len(run.tokens)}
            if before and after and after[1] > before[1]:
                steps = after[1] - before[1]
                level["iteration_tokens"] = {"steps": steps, "tokens": after[0] - before[0],
                                             "mean_tokens_per_step": (after[0] - before[0]) / steps}
            levels.append(level)
    bitwise = all(lv["verdict"] == "bitwise" for lv in levels)
    return {"base_url": base_url, "model": model, "input_len": input_len, "output_len": output_len,
            "bitwise": bitwise, "levels": levels}


async def _post(client: Any, url: str, body: dict[str, Any]) -> dict[str, Any]:
    import aiohttp

    from .client import _http_error, post

    try:
        async with await post(client, url, body) as resp:
            if resp.status != 200:
                raise LiveError(f"{url}: {await _http_error(resp)}")
            doc = await resp.json(content_type=None)
    except (aiohttp.ClientError, OSError) as exc:
        raise LiveError(f"{url}: cannot reach the server: {type(exc).__name__}: {exc}") from None
    except ValueError:
        raise LiveError(f"{url}: the body is not JSON") from None
    if not isinstance(doc, dict):
        raise LiveError(f"{url}: the body is not a JSON object")
    return doc


def run_invariance(base_url: str, max_batch: int, *, input_len: int = 16, output_len: int = 16, seed: int = 0,
                   model: str | None = None, timeout: float = 60.0) -> dict[str, Any]:
    """Run the sweep; LiveError naming the URL when the server cannot be used."""
    from .replay import run_coroutine

    if max_batch < 1:
        raise ValueError(f"--max-batch must be at least 1, got {max_batch}")
    return run_coroutine(_sweep(base_url, ladder(max_batch), input_len, output_len, seed, model, timeout))


def format_report(doc: dict[str, Any]) -> str:
    """A table: batch size, verdict, first divergent token, largest ulp gap, tokens per step."""
    lines = [f"{'batch':>5}  {'verdict':<8}  {'first diff':>10}  {'max ulp':>7}  tokens/step"]
    for lv in doc["levels"]:
        steps = lv.get("iteration_tokens")
        per = f"{steps['mean_tokens_per_step']:.1f} over {steps['steps']:g} steps" if steps else "-"
        first = "-" if lv["first_divergent_token"] is None else str(lv["first_divergent_token"])
        ulp = "-" if lv["max_ulp"] is None else str(lv["max_ulp"])
        lines.append(f"{lv['batch_size']:>5}  {lv['verdict']:<8}  {first:>10}  {ulp:>7}  {per}")
    lines.append("bitwise at every batch size" if doc["bitwise"] else "NOT bitwise: see the verdicts above")
    return "\n".join(lines)
