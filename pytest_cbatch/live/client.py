"""One streamed request against an OpenAI-compatible server, timed frame by frame (aiohttp).

:func:`stream` fills a :class:`Stream` in place as frames arrive, so a caller
that cancels the task (a trace cancel) still holds everything seen so far.
Every failure is recorded as ``Stream.error``, a message naming the URL and
what was wrong (HTTP status and the server's message, a refused connection,
a body that is not an event stream, a malformed frame, a stream that ended
without ``[DONE]`` and without a finish_reason, a timeout); :func:`stream`
itself never raises for them.  A stream that carried a finish_reason and then
ended without ``[DONE]`` (``transformers serve``) is complete.  A route that
refuses the optional fields is retried once without them (:mod:`.fields`).
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from . import LiveError, fields, require
from .metrics import RequestRecord
from .sse import SSEDecoder, StreamFormatError, choice_tokens, parse_data

__all__ = ["API_ROUTES", "Stream", "Frame", "build_payload", "prompt_words", "post", "stream", "get_json",
           "MODEL_OPTION", "choose_model", "listed_models", "pick_model", "session", "url_for"]

API_ROUTES = {"completions": "/completions", "chat": "/chat/completions"}


def url_for(base_url: str, route: str) -> str:
    """``base_url`` (``http://host:port`` or ``.../v1``) joined with an OpenAI route such as ``/models``."""
    base = base_url.rstrip("/")
    if not base.endswith("/v1"):
        base += "/v1"
    return base + route


def prompt_words(seed: int | str, key: str, n: int) -> str:
    """``n`` pseudo-random integer words, seeded by ``(seed, key)``: distinct prompts for distinct keys.

    Three-digit words, so that each is one token for the embedded server and
    about one for common tokenizers.
    """
    rng = random.Random(f"{seed}/{key}")
    return " ".join(str(rng.randrange(100, 1000)) for _ in range(n))


def build_payload(api: str, model: str, prompt: str | list[str], max_tokens: int, *, stream: bool = True,
                  ignore_eos: bool = True, logprobs: bool = False, temperature: float = 0.0) -> dict[str, Any]:
    """The request body: fixed output length (``max_tokens`` with ``ignore_eos``), token ids and usage asked for.

    ``stream_options`` asks for the final usage frame and, where the server
    supports it, the running usage count in every frame (vLLM's
    ``continuous_usage_stats``), which lets the client pin the index of each
    token the server claims to send.
    """
    body: dict[str, Any] = {"model": model, "max_tokens": max_tokens, "temperature": temperature,
                            "ignore_eos": ignore_eos, "return_token_ids": True, "stream": stream}
    if stream:
        body["stream_options"] = {"include_usage": True, "continuous_usage_stats": True}
    if api == "chat":
        if not isinstance(prompt, str):
            raise ValueError("the chat route takes one prompt per request")
        body["messages"] = [{"role": "user", "content": prompt}]
        if logprobs:
            body.update(logprobs=True, top_logprobs=0)
    elif api == "completions":
        body["prompt"] = prompt
        if logprobs:
            body["logprobs"] = 0
    else:
        raise ValueError(f"api must be one of {', '.join(API_ROUTES)}, got {api!r}")
    return body


@dataclass
class Frame:
    """One token-bearing data frame: when it arrived and what it carried."""

    time: float
    tokens: int
    first_index: int          # output index of its first token (1-based)
    text: str = ""
    token_ids: list[int] | None = None


@dataclass
class Stream:
    """A request in flight or done.  Times are seconds on the caller's clock."""

    url: str
    sent: float
    prompt_tokens: int = 0
    frames: list[Frame] = field(default_factory=list)
    last_frame: float | None = None
    usage_tokens: int | None = None
    finish_reason: str | None = None
    done: bool = False                     # [DONE] (or a complete non-streamed body) was received
    ended: float | None = None
    error: str | None = None
    http_status: int | None = None         # the server's status when it answered with an error
    guessed: int = 0                       # token frames counted as one token from their text alone
    exact: int = 0                         # token frames counted from token ids, logprobs or a running count
    running_count: bool = False            # usage came with a frame before the finish: a running count

    @property
    def tokens(self) -> int:
        return sum(f.tokens for f in self.frames)

    @property
    def counts_known(self) -> bool:
        """Whether each frame's token count is known: from token ids, logprobs tokens or a running usage count,
        or confirmed by a final usage equal to the tokens counted (one per text frame).  A stream with no such
        frame whose usage says more (a token whose text is a partial character) is not."""
        if self.usage_tokens == self.tokens:
            return True
        return self.guessed == 0 and (self.exact > 0 or self.usage_tokens is None)

    def record(self, status: str) -> RequestRecord:
        """The metrics view of this stream, ended with ``status``."""
        return RequestRecord(
            sent=self.sent, prompt_tokens=self.prompt_tokens, frame_times=[f.time for f in self.frames],
            frame_tokens=[f.tokens for f in self.frames], last_frame=self.last_frame,
            usage_tokens=self.usage_tokens, status=status, error=self.error,
        )


def session(timeout: float, limit: int = 0) -> Any:
    """An aiohttp ClientSession with a total per-request ``timeout`` and ``limit`` connections (0: no limit)."""
    aiohttp = require("aiohttp", "live servers")
    return aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout),
                                 connector=aiohttp.TCPConnector(limit=limit))


def _describe(exc: BaseException) -> str:
    if isinstance(exc, asyncio.TimeoutError):
        return "timed out (--timeout)"
    return f"{type(exc).__name__}: {exc}"


async def _http_error(resp: Any) -> str:
    text = (await resp.text(errors="replace"))[:300]
    try:
        doc = json.loads(text)
        err = doc.get("error", doc) if isinstance(doc, dict) else doc
        message = err.get("message", text) if isinstance(err, dict) else text
    except (json.JSONDecodeError, AttributeError):
        message = text
    return f"HTTP {resp.status}: {message}".strip()


async def post(client: Any, url: str, payload: dict[str, Any]) -> Any:
    """POST ``payload`` to ``url`` as the route takes it: sent once more without the optional fields when the
    route refuses them, which is then remembered (:mod:`.fields`).  Returns the aiohttp response."""
    route = fields.for_route(url)
    body = route.prepare(payload)
    resp = await client.post(url, json=body)
    if resp.status != 200 and route.can_retry(body, resp.status):
        refusal = await _http_error(resp)
        resp.release()
        resp = await client.post(url, json=route.retry_body(body))
        if resp.status == 200:
            route.learn(refusal)
    return resp


async def stream(client: Any, url: str, payload: dict[str, Any], state: Stream,
                 clock: Callable[[], float] = time.perf_counter) -> Stream:
    """POST ``payload`` to ``url`` and read its event stream into ``state`` (choice 0), timing each frame.

    Cancelling the task closes the connection; ``state`` keeps what arrived.
    """
    aiohttp = require("aiohttp", "live servers")
    try:
        resp = await post(client, url, payload)
        async with resp:
            if resp.status != 200:
                state.http_status = resp.status
                state.error = f"{url}: {await _http_error(resp)}"
                return state
            ctype = resp.headers.get("Content-Type", "")
            if "text/event-stream" not in ctype:
                state.error = f"{url}: not an event stream (Content-Type {ctype or 'missing'!r}); the route " \
                              f"must stream with stream=true"
                return state
            decoder = SSEDecoder()
            async for line in resp.content:
                for data in decoder.feed(line):
                    if _consume(state, data, clock()):
                        return state
            for data in decoder.flush():
                if _consume(state, data, clock()):
                    return state
            if state.finish_reason:
                state.done = True
            else:
                state.error = f"{url}: the stream ended without data: [DONE]"
    except StreamFormatError as exc:
        state.error = f"{url}: malformed stream: {exc}"
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
        state.error = f"{url}: {_describe(exc)}"
    finally:
        state.ended = clock()
    return state


def _consume(state: Stream, data: str, now: float) -> bool:
    """Apply one event's data to ``state``; True at ``[DONE]``."""
    doc = parse_data(data)
    if doc is None:
        state.done = True
        return True
    usage = doc.get("usage")
    running = usage.get("completion_tokens") if isinstance(usage, dict) else None
    if isinstance(usage, dict) and isinstance(usage.get("prompt_tokens"), int):
        state.prompt_tokens = usage["prompt_tokens"]
    choices = [c for c in doc.get("choices", []) if c.get("index", 0) == 0]
    if state.frames and now <= state.frames[-1].time:
        now = math.nextafter(state.frames[-1].time, math.inf)   # distinct frames, distinct times
    if choices:
        state.last_frame = now
        got = choice_tokens(choices[0])
        if isinstance(running, int) and not got.finish_reason:
            state.running_count = True
        if got.finish_reason:
            state.finish_reason = got.finish_reason
        if got.count:
            # The server's running count, when it sends one, says which outputs
            # this frame claims to carry; a repeated frame then repeats indices.
            counted = state.running_count and isinstance(running, int)
            first = running - got.count + 1 if counted else state.tokens + 1
            if counted or got.token_ids is not None or got.logprobs is not None:
                state.exact += 1
            else:
                state.guessed += 1
            state.frames.append(Frame(now, got.count, first, got.text, got.token_ids))
    if isinstance(running, int) and (not doc.get("choices") or not state.running_count):
        state.usage_tokens = running   # the final usage frame (alone, or with the last choices)
    return False


async def get_json(client: Any, url: str) -> Any:
    """GET ``url`` and return its JSON body; LiveError naming the URL on any failure."""
    aiohttp = require("aiohttp", "live servers")
    try:
        async with client.get(url) as resp:
            if resp.status != 200:
                raise LiveError(f"{url}: {await _http_error(resp)}")
            text = await resp.text()
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
        raise LiveError(f"{url}: cannot reach the server: {_describe(exc)}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        raise LiveError(f"{url}: the body is not JSON: {text[:120]!r}") from None


MODEL_OPTION = "--cbatch-model NAME (ini cbatch_model; cbatch check, load and invariance: --model NAME)"
_SHOWN_MODELS = 8     # model ids a message lists (the listing is the server's: bounded)


async def listed_models(client: Any, base_url: str) -> list[dict[str, Any]]:
    """The entries ``/v1/models`` lists that carry a string id (LiveError when the body is no listing)."""
    url = url_for(base_url, "/models")
    doc = await get_json(client, url)
    data = doc.get("data") if isinstance(doc, dict) else None
    if not isinstance(data, list):
        raise LiveError(f"{url}: not a model listing (expected {{'data': [{{'id': ...}}]}}), got {str(doc)[:120]}")
    return [entry for entry in data if isinstance(entry, dict) and isinstance(entry.get("id"), str) and entry["id"]]


def choose_model(listing: list[dict[str, Any]], named: str | None, url: str,
                 option: str = MODEL_OPTION) -> dict[str, Any]:
    """The listing's entry of the model to ask for: ``named`` (its entry, or just ``{"id": named}`` when the
    server does not list it: ``transformers serve`` lists none for a model given by path), else the only
    one listed.  LiveError when none is named and the listing has none or several, saying how to name one
    (``option``)."""
    if named:
        return next((entry for entry in listing if entry["id"] == named), {"id": named})
    if len(listing) == 1:
        return listing[0]
    if not listing:
        raise LiveError(f"{url} lists no model: name the one to ask for with {option}, as the server knows it "
                        f"(the model id, or the path the server was started with)")
    ids = ", ".join(repr(entry["id"][:80]) for entry in listing[:_SHOWN_MODELS])
    more = f" and {len(listing) - _SHOWN_MODELS} more" if len(listing) > _SHOWN_MODELS else ""
    raise LiveError(f"{url} lists {len(listing)} models ({ids}{more}): name the one to judge with {option}")


async def pick_model(client: Any, base_url: str, named: str | None, option: str = MODEL_OPTION) -> str:
    """The model id to ask for: ``named`` as given (the listing is not read), else :func:`choose_model`'s."""
    if named:
        return named
    return choose_model(await listed_models(client, base_url), None, url_for(base_url, "/models"), option)["id"]
