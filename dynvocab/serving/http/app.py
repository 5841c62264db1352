"""The FastAPI application: ``/v1/completions`` (JSON or Server-Sent Events), ``/v1/models``, ``/health``, ``/metrics``
and the page at ``/``.

A thin adapter over ``Engine`` and ``Batcher``: parse and check the request, queue it, and turn what the
batch hands back into OpenAI's JSON.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import secrets
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException

from ..config import ServerConfig
from ..engine.engine import Completion, Engine, Job
from ..engine.errors import ApiError, invalid
from ..engine.requests import CompletionRequest
from ..engine.scheduler import Batcher
from .errors import from_validation_error
from .metrics import ServerMetrics
from .page import page_html

logger = logging.getLogger(__name__)


def create_app(engine: Engine, config: ServerConfig) -> FastAPI:
    """The server's application over ``engine``; the batcher starts and stops with the application's lifespan."""
    metrics = ServerMetrics()
    batcher = Batcher(engine, config, metrics)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        batcher.start()
        yield
        await batcher.stop()

    app = FastAPI(title="dynvocab", lifespan=lifespan)
    app.state.engine, app.state.batcher, app.state.metrics = engine, batcher, metrics

    @app.exception_handler(ApiError)
    async def refused(request: Request, error: ApiError) -> JSONResponse:
        metrics.errors.labels(error.code).inc()
        logger.info("refused", extra={"request_id": getattr(request.state, "request_id", None), "status": error.status,
                                      "code": error.code, "error": error.message})
        return JSONResponse(error.body(), status_code=error.status, headers=error.headers)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, error: HTTPException) -> JSONResponse:
        routes = "POST /v1/completions, GET /v1/models, /health, /metrics and / (the page)"
        return await refused(request, ApiError(error.status_code, f"{request.method} {request.url.path}: "
                                               f"{error.detail}; the routes are {routes}", code=f"http_{error.status_code}"))

    @app.exception_handler(Exception)
    async def bug(request: Request, error: Exception) -> JSONResponse:
        """A bug, not the request's fault: logged with its traceback, answered in OpenAI's shape with the request id."""
        request_id = getattr(request.state, "request_id", None)
        logger.exception("unexpected error", extra={"request_id": request_id})
        return await refused(request, ApiError(500, f"internal error ({type(error).__name__}) in request {request_id}; "
                                               "please report it with this id", code="internal_error",
                                               kind="server_error"))

    def authorize(request: Request) -> None:
        if config.api_key is None:
            return
        scheme, _, key = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not secrets.compare_digest(key.encode(), config.api_key.encode()):
            raise ApiError(401, "the Authorization header is missing or its bearer token is wrong; send "
                           "'Authorization: Bearer <the server's --api-key>'", param="authorization",
                           code="invalid_api_key")

    @app.get("/", response_class=HTMLResponse)
    async def page() -> str:
        return page_html()

    @app.get("/health")
    async def health() -> JSONResponse:
        status = "shutting down" if batcher.closing else "ok"
        return JSONResponse({"status": status, "model": engine.model_name, "corpora": sorted(engine.corpora),
                             "queue": len(batcher)}, status_code=503 if batcher.closing else 200)

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(metrics.render(), media_type="text/plain; version=0.0.4")

    @app.get("/v1/models")
    async def models(request: Request) -> dict:
        authorize(request)
        return {"object": "list", "data": [{"id": engine.model_name, "object": "model", "created": 0,
                                            "owned_by": "dynvocab"}]}

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        arrived = time.perf_counter()
        request.state.request_id = request_id = f"cmpl-{uuid.uuid4().hex[:24]}"
        authorize(request)
        body = parse_request(await read_body(request, config.max_body_bytes))
        checked = engine.check(body)
        events: asyncio.Queue = asyncio.Queue()
        loop = asyncio.get_running_loop()

        def deliver(kind: str):
            return lambda payload: loop.call_soon_threadsafe(events.put_nowait, (kind, payload))

        job = Job(body, request_id, checked.prompt_ids, checked.phrases, checked.documents, checked.settings,
                  engine.batch_key(body, checked.settings, request_id), deliver("step"), deliver("done"), deliver("error"),
                  skipped_phrases=checked.skipped_phrases)
        batcher.submit(job)
        reply = Reply(job, events, engine.model_name, metrics, arrived)
        watcher = loop.create_task(reply.watch(request))
        headers = {"X-Request-Id": request_id, "X-Served-By": str(os.getpid())}  # which replica answered
        if body.stream:
            return StreamingResponse(reply.stream(watcher), media_type="text/event-stream", headers=headers)
        return JSONResponse(await reply.whole(watcher), headers=headers)

    return app


async def read_body(request: Request, limit: int) -> bytes:
    """The body, refused with 413 once it passes ``limit`` bytes (declared or as it arrives)."""
    declared = request.headers.get("content-length", "")
    too_large = invalid("body", f"<{declared or 'more than ' + str(limit)} bytes>", f"this server takes bodies of at most "
                        f"{limit} bytes", "send fewer phrases or documents (or raise --max-body-bytes)", status=413)
    if declared.isdigit() and int(declared) > limit:
        raise too_large
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_large
        chunks.append(chunk)
    return b"".join(chunks)


def parse_request(body: bytes) -> CompletionRequest:
    """A ``CompletionRequest`` from the raw body; 400 naming the problem for non-UTF-8, non-JSON or schema errors."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as error:
        raise invalid("body", body[max(0, error.start - 16) : error.start + 16], f"byte {error.start} is not UTF-8",
                      "send the JSON encoded as UTF-8") from None
    try:
        data = json.loads(text, parse_constant=_no_constants)
    except json.JSONDecodeError as error:
        raise invalid("body", text[max(0, error.pos - 30) : error.pos + 10], f"it is not valid JSON: {error.msg} at "
                      f"line {error.lineno} column {error.colno}", "send one complete JSON object") from None
    except ValueError as error:
        raise invalid("body", text[:40], str(error), "send finite numbers only") from None
    if not isinstance(data, dict):
        raise invalid("body", data, "the body must be a JSON object", 'send {"prompt": "...", ...}')
    try:
        return CompletionRequest.model_validate(data)
    except ValidationError as error:
        raise from_validation_error(error) from None


def _no_constants(name: str) -> None:
    raise ValueError(f"{name} is not a number JSON allows")


class Reply:
    """What one request hears back: steps as SSE chunks, or the whole completion as one JSON object."""

    def __init__(self, job: Job, events: asyncio.Queue, model_name: str, metrics: ServerMetrics, arrived: float) -> None:
        self.job, self.events, self.model_name, self.metrics, self.arrived = job, events, model_name, metrics, arrived
        self.created = int(time.time())
        self.outcome: str | None = None  # ok or error once the batch answered; cancelled if the client left first

    async def watch(self, request: Request) -> None:
        """Cancel the job when the client goes away before its reply is finished."""
        while (await request.receive())["type"] != "http.disconnect":
            pass
        if self.outcome is None:
            self.job.cancelled.set()

    async def whole(self, watcher: asyncio.Task) -> dict:
        try:
            kind, payload = "step", None
            while kind == "step":  # the steps are for streams; the whole reply waits for the end
                kind, payload = await self.events.get()
            self.outcome = "error" if kind == "error" else "cancelled" if payload.finish_reason == "cancelled" else "ok"
        finally:
            self._end(watcher)
        if kind == "error":
            raise payload
        return self._body(payload)

    async def stream(self, watcher: asyncio.Task) -> AsyncIterator[str]:
        first = True
        try:
            while True:
                kind, payload = await self.events.get()
                if kind == "step":
                    if first:
                        self.metrics.first_step_seconds.observe(time.perf_counter() - self.arrived)
                        first = False
                    yield _sse(self._chunk(payload["text"], None, [payload]))
                    continue
                self.outcome = "ok" if kind == "done" else "error"
                if kind == "error":
                    self.metrics.errors.labels(payload.code).inc()
                    yield _sse(payload.body())
                else:
                    yield _sse(self._chunk("", payload.finish_reason, [], payload))
                    if self.job.request.stream_options and self.job.request.stream_options.include_usage:
                        yield _sse({**self._chunk("", None, []), "choices": [], "usage": _usage(payload)})
                yield "data: [DONE]\n\n"
                self._log(kind, payload)
                return
        finally:
            self._end(watcher)

    def _end(self, watcher: asyncio.Task) -> None:
        if self.outcome is None:  # the client left (or the server stops): its generation stops at the next step
            self.job.cancelled.set()
            self.outcome = "cancelled"
            logger.info("completion cancelled", extra={"request_id": self.job.request_id})
        watcher.cancel()
        self.metrics.request_seconds.observe(time.perf_counter() - self.arrived)
        self.metrics.requests.labels(self.outcome).inc()

    def _body(self, completion: Completion) -> dict:
        self._log("done", completion)
        choice = {"index": 0, "text": completion.text, "logprobs": None, "finish_reason": completion.finish_reason,
                  "segments": completion.segments}
        return {"id": self.job.request_id, "object": "text_completion", "created": self.created,
                "model": self.model_name, "choices": [choice], "usage": _usage(completion),
                "dynvocab": _details(completion)}

    def _chunk(self, text: str, finish_reason: str | None, segments: list[dict],
               completion: Completion | None = None) -> dict:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason, "segments": segments}
        chunk = {"id": self.job.request_id, "object": "text_completion", "created": self.created,
                 "model": self.model_name, "choices": [choice]}
        return chunk | ({"dynvocab": _details(completion)} if completion is not None else {})

    def _log(self, kind: str, payload) -> None:
        fields = {"request_id": self.job.request_id, "seconds": round(time.perf_counter() - self.arrived, 4)}
        if isinstance(payload, Completion):
            fields |= {"finish_reason": payload.finish_reason, "completion_tokens": payload.completion_tokens,
                       "phrase_steps": payload.phrase_steps}
        else:
            fields |= {"status": payload.status, "code": payload.code}
        logger.info("completion " + kind, extra=fields)


def _usage(completion: Completion) -> dict:
    return {"prompt_tokens": completion.prompt_tokens, "completion_tokens": completion.completion_tokens,
            "total_tokens": completion.prompt_tokens + completion.completion_tokens}


def _details(completion: Completion) -> dict:
    return {"phrase_steps": completion.phrase_steps, "num_phrases": completion.num_phrases,
            "documents": completion.documents, "stages": completion.stages, "citations": completion.citations,
            "cited_share": completion.cited_share, "skipped_phrases": completion.skipped_phrases}


def _sse(data: dict) -> str:
    return f"data: {json.dumps(data)}\n\n"
