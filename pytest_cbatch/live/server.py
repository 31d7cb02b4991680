"""The embedded OpenAI-compatible server (aiohttp): ``cbatch serve``.

Routes: ``POST /v1/completions`` and ``/v1/chat/completions`` (streamed as
server-sent events, or one JSON body), ``GET /v1/models``, ``/health`` and
``/metrics`` (Prometheus, vLLM's names).  A prompt is whitespace-separated
words, one token each; a completions ``prompt`` may be a list (one choice per
prompt, all arriving in the same tick: a real batch).  Every request runs to
``max_tokens`` (there is no end-of-sequence token, so ``ignore_eos`` is
implied).  A client disconnect cancels the request in the scheduler, which
frees its pages.  Tokens that pile up while the writer is behind go out in
one frame, as vLLM does.

:class:`OpenAIServer` keeps the frame building in small methods so that the
kit's broken fixtures (``examples/live/broken_servers.py``) can override one.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from dataclasses import dataclass
from typing import Any, Iterator

from . import require
from .backends import make_backend
from .sampling import Sample
from .engine import SERVE_DEFAULTS, Engine, Job, Rejected, Seq

web = require("aiohttp.web", "cbatch serve")

__all__ = ["OpenAIServer", "Request", "BadRequest", "serve_forever", "ServerThread", "create_server"]

MODEL = "cbatch-synthetic"
POLL_S = 0.05   # how often a waiting handler looks for a disconnected client


class BadRequest(Exception):
    """A request body the server refuses (HTTP 400, or ``status``)."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class Request:
    """A parsed completions or chat request."""

    chat: bool
    prompts: list[list[int]]
    max_tokens: int
    stream: bool
    logprobs: bool
    token_ids: bool
    include_usage: bool
    continuous_usage: bool


def _error(message: str, status: int) -> Any:
    kind = {400: "BadRequestError", 404: "NotFoundError"}.get(status, "InternalServerError")
    return web.json_response({"error": {"message": message, "type": kind, "param": None, "code": status}},
                             status=status)


class OpenAIServer:
    """The application: one engine, its routes, and the frame format."""

    def __init__(self, engine: Engine, model: str = MODEL) -> None:
        self.engine = engine
        self.model = model
        self.created = int(time.time())

    # -- app ---------------------------------------------------------------
    def app(self) -> Any:
        app = web.Application()
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/health", self.health)
        app.router.add_get("/metrics", self.prometheus)
        app.cleanup_ctx.append(self._engine_task)
        return app

    async def _engine_task(self, app: Any) -> Any:
        task = asyncio.create_task(self.engine.run())
        yield
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass

    async def health(self, request: Any) -> Any:
        return web.Response(text="")

    async def models(self, request: Any) -> Any:
        return web.json_response({"object": "list", "data": [
            {"id": self.model, "object": "model", "created": self.created, "owned_by": "pytest-cbatch"}]})

    async def prometheus(self, request: Any) -> Any:
        text = self.engine.metrics.render(self.model, self.engine.scheduler.pool_stats())
        return web.Response(text=text, content_type="text/plain", charset="utf-8")

    async def completions(self, request: Any) -> Any:
        return await self._serve(request, chat=False)

    async def chat(self, request: Any) -> Any:
        return await self._serve(request, chat=True)

    # -- requests ----------------------------------------------------------
    def parse(self, body: Any, chat: bool) -> Request:
        """Validate a request body (BadRequest says which field is wrong)."""
        if not isinstance(body, dict):
            raise BadRequest("the body must be a JSON object")
        if body.get("model", self.model) != self.model:
            raise BadRequest(f"The model `{body.get('model')}` does not exist.", 404)
        if chat:
            messages = body.get("messages")
            if not isinstance(messages, list) or not messages or not all(
                    isinstance(m, dict) and isinstance(m.get("content"), str) for m in messages):
                raise BadRequest("messages: a non-empty list of {role, content} objects with string content")
            texts = [" ".join(m["content"] for m in messages)]
        else:
            prompt = body.get("prompt")
            texts = [prompt] if isinstance(prompt, str) else prompt
            if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
                raise BadRequest("prompt: a string or a non-empty list of strings")
        prompts = [[self.engine.backend.token_of(w) for w in t.split()] for t in texts]
        if not all(prompts):
            raise BadRequest("prompt: every prompt needs at least one word (one token per word)")
        max_tokens = body.get("max_tokens", body.get("max_completion_tokens", 16))
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
            raise BadRequest(f"max_tokens: a positive integer, got {max_tokens!r}")
        options = body.get("stream_options") or {}
        logprobs = body.get("logprobs")
        return Request(
            chat=chat, prompts=prompts, max_tokens=max_tokens, stream=bool(body.get("stream", False)),
            logprobs=logprobs is not None and logprobs is not False, token_ids=bool(body.get("return_token_ids")),
            include_usage=bool(options.get("include_usage")),
            continuous_usage=bool(options.get("continuous_usage_stats")),
        )

    async def _serve(self, request: Any, chat: bool) -> Any:
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            return _error("the body is not JSON", 400)
        try:
            req = self.parse(body, chat)
            job = self.engine.submit(req.prompts, req.max_tokens)
        except BadRequest as exc:
            return _error(str(exc), exc.status)
        except Rejected as exc:
            return _error(str(exc), 400)
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{job.seqs[0].rid}"
        try:
            if req.stream:
                return await self._stream(request, req, job, rid)
            return await self._whole(request, req, job, rid)
        finally:
            self.closed(job)

    def closed(self, job: Job) -> None:
        """The handler is done with ``job`` (it finished, failed, or its client went away): cancel whatever of
        it still runs, which frees its pages.  Harmless when it finished."""
        self.engine.abort(job)

    async def _wait(self, request: Any, job: Job) -> bool:
        """Wait for news on ``job``; False when the client has gone away."""
        try:
            await asyncio.wait_for(job.changed.wait(), POLL_S)
        except asyncio.TimeoutError:
            pass
        job.changed.clear()
        transport = request.transport
        return transport is not None and not transport.is_closing()

    async def _stream(self, request: Any, req: Request, job: Job, rid: str) -> Any:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        try:
            await self.opening(resp, req, job, rid)
            while True:
                for seq in job.seqs:
                    for frame in self.frames(req, rid, seq, seq.take()):
                        await self.send(resp, frame)
                if any(seq.rejected for seq in job.seqs):
                    await self.send(resp, {"error": {"message": "the scheduler rejected the request", "code": 400}})
                    return resp
                if job.finished:
                    break
                if not await self._wait(request, job):
                    return resp
            if req.include_usage:
                await self.send(resp, self.chunk(req, rid, [], self.usage(job.seqs)))
            await resp.write(b"data: [DONE]\n\n")
        except (ConnectionResetError, ConnectionError):
            return resp
        return resp

    async def opening(self, resp: Any, req: Request, job: Job, rid: str) -> None:
        """What a stream sends before any token: the assistant role delta on chat, nothing on completions."""
        if req.chat:
            await self.send(resp, self.chunk(req, rid, [self.role_choice()], None))

    async def send(self, resp: Any, frame: dict[str, Any]) -> None:
        await resp.write(b"data: " + json.dumps(frame).encode() + b"\n\n")

    def frames(self, req: Request, rid: str, seq: Seq, samples: list[Sample]) -> Iterator[dict[str, Any]]:
        """The data frames for ``samples`` just produced by ``seq`` (one frame; none when there is nothing)."""
        if not samples:
            return
        choice = self.choice(req, seq, samples, "length" if seq.finished else None)
        usage = self.usage([seq]) if req.continuous_usage else None
        yield self.chunk(req, rid, [choice], usage)

    def chunk(self, req: Request, rid: str, choices: list[dict[str, Any]], usage: dict[str, int] | None
              ) -> dict[str, Any]:
        doc: dict[str, Any] = {"id": rid, "object": "chat.completion.chunk" if req.chat else "text_completion",
                               "created": self.created, "model": self.model, "choices": choices}
        if usage is not None:
            doc["usage"] = usage
        return doc

    def role_choice(self) -> dict[str, Any]:
        return {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}

    def choice(self, req: Request, seq: Seq, samples: list[Sample], finish: str | None, *,
               whole: bool = False) -> dict[str, Any]:
        """One choice carrying ``samples`` (a stream delta, or the whole message with ``whole``)."""
        texts = [self.engine.backend.text_of(s.token_id) for s in samples]
        text = "".join(texts)
        index = seq.job.seqs.index(seq)
        out: dict[str, Any] = {"index": index, "finish_reason": finish}
        if req.chat:
            out["message" if whole else "delta"] = {"role": "assistant", "content": text} if whole else {"content": text}
            out["logprobs"] = {"content": [{"token": t, "logprob": s.logprob, "bytes": list(t.encode()),
                                            "top_logprobs": []} for t, s in zip(texts, samples)]} \
                if req.logprobs else None
        else:
            out["text"] = text
            offsets, at = [], 0
            for t in texts:
                offsets.append(at)
                at += len(t)
            out["logprobs"] = {"tokens": texts, "token_logprobs": [s.logprob for s in samples],
                               "top_logprobs": None, "text_offset": offsets} if req.logprobs else None
        if req.token_ids:
            out["token_ids"] = [s.token_id for s in samples]
        return out

    def usage(self, seqs: list[Seq]) -> dict[str, int]:
        prompt = sum(s.prompt_len for s in seqs)
        completion = sum(len(s.samples) for s in seqs)
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}

    async def _whole(self, request: Any, req: Request, job: Job, rid: str) -> Any:
        while not job.finished:
            if not await self._wait(request, job):
                return web.Response(status=499)
        if any(seq.rejected for seq in job.seqs):
            return _error("the scheduler rejected the request", 400)
        choices = [self.choice(req, seq, seq.take(), "length", whole=True) for seq in job.seqs]
        body = {"id": rid, "object": "chat.completion" if req.chat else "text_completion", "created": self.created,
                "model": self.model, "choices": choices, "usage": self.usage(job.seqs)}
        return web.json_response(body)


def create_server(*, backend: str = "synthetic", numerics: str = "batch_invariant", tick_ms: float = 10.0,
                  seed: int = 0, model: str | None = None, server_class: type[OpenAIServer] = OpenAIServer,
                  **config: Any) -> OpenAIServer:
    """An OpenAIServer with the reference scheduler (``config`` over SERVE_DEFAULTS) and a backend."""
    settings = {**SERVE_DEFAULTS, **{k: v for k, v in config.items() if v is not None}}
    tokens = make_backend(backend, numerics=numerics, capacity=settings["capacity"],
                          block_size=settings["block_size"], seed=seed)
    engine = Engine(settings, tokens, tick_ms / 1000.0)
    name = model or (MODEL if backend == "synthetic" else f"cbatch-{backend}-{numerics}")
    return server_class(engine, name)


async def _start(server: OpenAIServer, host: str, port: int) -> tuple[Any, int]:
    runner = web.AppRunner(server.app(), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound = site._server.sockets[0].getsockname()[1]   # port 0 asks the OS for a free one
    return runner, bound


def serve_forever(server: OpenAIServer, host: str, port: int, *, on_ready: Any = None) -> None:
    """Run ``server`` on ``host:port`` until interrupted; ``on_ready(port)`` once it listens."""

    async def main() -> None:
        runner, bound = await _start(server, host, port)
        if on_ready:
            on_ready(bound)
        try:
            await asyncio.Event().wait()
        finally:
            await runner.cleanup()

    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        pass


class ServerThread:
    """``server`` on 127.0.0.1 and a free port, in a background thread (for tests and examples).

    ``with ServerThread(server) as url: ...`` starts it, waits until it
    listens (at most ``start_timeout`` seconds: a limit for a server that cannot start, generous because a
    loaded machine may take seconds) and stops it on exit.
    """

    def __init__(self, server: OpenAIServer, start_timeout: float = 60.0) -> None:
        self.server = server
        self.start_timeout = start_timeout
        self.port = 0
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._main, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _main(self) -> None:
        async def main() -> None:
            self._loop = asyncio.get_running_loop()
            self._stop = asyncio.Event()
            runner, self.port = await _start(self.server, "127.0.0.1", 0)
            self._ready.set()
            try:
                await self._stop.wait()
            finally:
                await runner.cleanup()

        asyncio.run(main())

    def __enter__(self) -> str:
        self._thread.start()
        if not self._ready.wait(self.start_timeout):
            raise RuntimeError(f"the embedded server did not start within {self.start_timeout:g}s")
        return self.url

    def __exit__(self, *exc: Any) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10.0)
