"""`lathe api CONFIG`: an OpenAI-compatible HTTP server (FastAPI + uvicorn) over the chat engine.

Routes: GET /v1/models, POST /v1/chat/completions, POST /v1/completions, GET /health. Streaming uses
server-sent events as OpenAI does (a role chunk, content deltas, a final chunk with finish_reason, a
usage chunk when stream_options.include_usage, then [DONE]). Every error is OpenAI's error body with
a 4xx status. With an API key every route needs `Authorization: Bearer KEY`.

Concurrency: request handlers never generate; they queue jobs to the engine's worker thread, which
decodes queued requests together (lathe/llm/inference/engine.py), and wait on asyncio queues fed
from that thread.
"""
# No `from __future__ import annotations`: FastAPI reads the handlers' annotations at run time, and
# they name fastapi.Request, imported inside create_app (lazily, so `import lathe` stays light).

import asyncio
import hmac
import json
import logging
import os
import time
import uuid

from lathe.llm.inference.browser import Boundary
from lathe.llm.inference.engine import ChatEngine, InvalidRequest
from lathe.llm.inference.requests import Limits, parse_body, parse_chat, parse_completion

logger = logging.getLogger(__name__)


def _fastapi():
    try:
        import fastapi
        import uvicorn  # noqa: F401
    except ImportError as error:
        raise ImportError(f"`lathe api` needs FastAPI and uvicorn: pip install 'lathe[api]' ({error}).") from None
    return fastapi


def error_body(
    message: str, kind: str = "invalid_request_error", param: str | None = None, code: str | None = None
) -> dict:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def create_app(
    engine: ChatEngine,
    model_name: str,
    api_key: str | None = None,
    limits: Limits | None = None,
    boundary: Boundary | None = None,
    access_log: bool = False,
):
    """The app; `boundary` (default: bound to 127.0.0.1, no other name allowed) checks Host and Origin; with
    `access_log`, one line per request on stdout (`lathe api` unless --quiet)."""
    fastapi = _fastapi()
    limits = limits or Limits(max_tokens=engine.generating.max_new_tokens)
    app = fastapi.FastAPI(title="lathe api", docs_url=None, redoc_url=None)
    _add_guards(app, api_key, limits, boundary or Boundary())
    if access_log:  # added last, so it wraps the guards: refused requests are logged too
        _add_access_log(app)
    _add_routes(app, fastapi, engine, model_name, limits)
    return app


def _fail(status: int, message: str, kind: str = "invalid_request_error", param=None, code=None):
    from fastapi.responses import JSONResponse

    return JSONResponse(error_body(message, kind, param, code), status_code=status)


def _add_guards(app, api_key: str | None, limits: Limits, boundary: Boundary) -> None:
    """The Host / Origin, API key and body-size checks before every route, and OpenAI error bodies for every
    error."""
    from starlette.exceptions import HTTPException

    @app.middleware("http")
    async def guard(request, call_next):
        refused = boundary.refusal(request.method, request.headers)
        if refused is not None:
            return _fail(403, f"Refused: {refused}", code="forbidden")
        if api_key is not None:
            header = request.headers.get("authorization", "")
            token = header[7:] if header.lower().startswith("bearer ") else ""
            if not hmac.compare_digest(token.encode(), api_key.encode()):
                return _fail(
                    401,
                    "Missing or wrong API key: send `Authorization: Bearer KEY`.",
                    "authentication_error",
                    code="invalid_api_key",
                )
        length = request.headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > limits.max_body_bytes):
            return _fail(
                413, f"The request body is larger than {limits.max_body_bytes} bytes.", code="request_too_large"
            )
        return await call_next(request)

    @app.exception_handler(HTTPException)
    async def http_error(request, error):
        return _fail(
            error.status_code, str(error.detail), "invalid_request_error" if error.status_code < 500 else "server_error"
        )

    @app.exception_handler(Exception)
    async def unexpected(request, error):
        logger.exception("Unexpected error in %s", request.url.path)
        return _fail(500, f"Internal error: {type(error).__name__}: {error}", "server_error")


def access_line(method: str, path: str, status: int, seconds: float, reply=None) -> str:
    """`lathe api: POST /v1/chat/completions 200 0.84 s 12+20 tokens` (prompt + completion, when generated)."""
    tokens = f" {reply.prompt_tokens * reply.n}+{reply.completion_tokens} tokens" if reply is not None else ""
    return f"lathe api: {method} {path} {status} {seconds:.2f} s{tokens}"


def _add_access_log(app) -> None:
    """One line per request once its body is sent (a stream: when it ends), the guards' refusals included."""

    @app.middleware("http")
    async def log_access(request, call_next):
        start = time.perf_counter()
        response = await call_next(request)
        body = response.body_iterator

        async def logged():
            try:
                async for chunk in body:
                    yield chunk
            finally:
                reply = getattr(request.state, "reply", None)
                line = access_line(
                    request.method, request.url.path, response.status_code, time.perf_counter() - start, reply
                )
                print(line, flush=True)

        response.body_iterator = logged()
        return response


def _add_routes(app, fastapi, engine: ChatEngine, model_name: str, limits: Limits) -> None:
    from fastapi.responses import StreamingResponse

    created = int(time.time())

    @app.get("/health")
    async def health():
        return {"status": "ok", "model": model_name, "queued": engine.pending}

    @app.get("/v1/models")
    async def models():
        return {
            "object": "list",
            "data": [{"id": model_name, "object": "model", "created": created, "owned_by": "lathe"}],
        }

    async def serve(request, parse, kind: str):
        try:
            body = parse_body(await request.body(), limits)
            prompt_ids, parsed = parse(body, engine, limits)
        except InvalidRequest as error:
            status = 413 if error.code == "request_too_large" else 400
            return _fail(status, str(error), param=error.param, code=error.code)
        run = _Run(engine, prompt_ids, parsed, asyncio.get_running_loop())
        reply = _Reply(
            kind,
            model_name,
            len(prompt_ids),
            parsed.n,
            extract_tool=engine.template.extract_tool if parsed.with_tools else None,
        )
        request.state.reply = reply  # the access log's token counts
        if parsed.stream:
            return StreamingResponse(reply.stream(run, parsed.include_usage), media_type="text/event-stream")
        return await reply.whole(run)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: fastapi.Request):
        return await serve(request, parse_chat, "chat")

    @app.post("/v1/completions")
    async def completions(request: fastapi.Request):
        return await serve(request, parse_completion, "text")


class _Run:
    """The n jobs of one request, their text and ends delivered to an asyncio queue."""

    def __init__(self, engine: ChatEngine, prompt_ids, parsed, loop):
        self.events: asyncio.Queue = asyncio.Queue()
        self.jobs = []
        for index in range(parsed.n):
            params = _copy_params(parsed.params, index)
            on_text, on_done = self._deliver("text", index, loop), self._deliver("done", index, loop)
            self.jobs.append(
                engine.submit(
                    prompt_ids,
                    params,
                    on_text=on_text if parsed.stream else None,
                    on_done=on_done,
                    media=parsed.media,
                )
            )

    def _deliver(self, kind: str, index: int, loop):
        """A callback for the engine's thread that puts (kind, choice index, value) on this run's queue."""

        def put(value):
            loop.call_soon_threadsafe(self.events.put_nowait, (kind, index, value))

        return put

    async def events_until_done(self):
        remaining = len(self.jobs)
        while remaining:
            event = await self.events.get()
            if event[0] == "done":
                remaining -= 1
                if event[2].error is not None:
                    raise event[2].error
            yield event


def _copy_params(params, index: int):
    import dataclasses

    seed = None if params.seed is None else params.seed + index  # n choices differ, yet reproducibly
    return dataclasses.replace(params, seed=seed, stop=list(params.stop))


class _Reply:
    def __init__(self, kind: str, model_name: str, prompt_tokens: int, n: int, extract_tool=None):
        self.kind, self.model, self.prompt_tokens, self.n = kind, model_name, prompt_tokens, n
        self.extract_tool = extract_tool  # the template's tool-call parser, when the request offered tools
        self.id = ("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex
        self.created = int(time.time())
        self.object = "chat.completion" if kind == "chat" else "text_completion"
        self.completion_tokens = 0  # so far (the access log reads it when the reply is sent)

    def usage(self, completion_tokens: int) -> dict:
        return {
            "prompt_tokens": self.prompt_tokens * self.n,
            "completion_tokens": completion_tokens,
            "total_tokens": self.prompt_tokens * self.n + completion_tokens,
        }

    def _envelope(self, choices: list, chunk: bool = False, **extra) -> dict:
        return {
            "id": self.id,
            "object": self.object + (".chunk" if chunk and self.kind == "chat" else ""),
            "created": self.created,
            "model": self.model,
            "choices": choices,
            **extra,
        }

    async def whole(self, run: _Run) -> dict:
        finished = {}
        async for kind, index, payload in run.events_until_done():
            if kind == "done":
                finished[index] = payload.sequence
        choices, used = [], 0
        for index in range(self.n):
            sequence = finished[index]
            used += sequence.completion_tokens
            if self.kind == "chat":
                choices.append({"index": index, **self._message(sequence), "logprobs": None})
            else:
                choices.append(
                    {"index": index, "text": sequence.text, "finish_reason": sequence.finish_reason, "logprobs": None}
                )
        self.completion_tokens = used
        return self._envelope(choices, usage=self.usage(used))

    def _message(self, sequence) -> dict:
        """The assistant message; a reply in the template's tool-call format becomes OpenAI tool_calls."""
        calls = self.extract_tool(sequence.text) if self.extract_tool is not None else sequence.text
        if isinstance(calls, str) or not calls:
            return {"message": {"role": "assistant", "content": sequence.text}, "finish_reason": sequence.finish_reason}
        tool_calls = [
            {
                "id": "call_" + uuid.uuid4().hex[:24],
                "type": "function",
                "function": {"name": call.name, "arguments": call.arguments},
            }
            for call in calls
        ]
        return {
            "message": {"role": "assistant", "content": None, "tool_calls": tool_calls},
            "finish_reason": "tool_calls",
        }

    async def stream(self, run: _Run, include_usage: bool):
        def event(payload: dict) -> str:
            return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"

        if self.kind == "chat":
            for index in range(self.n):
                yield event(
                    self._envelope(
                        [{"index": index, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}],
                        chunk=True,
                    )
                )
        used = 0
        try:
            async for kind, index, payload in run.events_until_done():
                if kind == "text":
                    piece = {"delta": {"content": payload}} if self.kind == "chat" else {"text": payload}
                    yield event(self._envelope([{"index": index, **piece, "finish_reason": None}], chunk=True))
                else:
                    sequence = payload.sequence
                    used += sequence.completion_tokens
                    self.completion_tokens = used
                    end = {"delta": {}} if self.kind == "chat" else {"text": ""}
                    yield event(
                        self._envelope([{"index": index, **end, "finish_reason": sequence.finish_reason}], chunk=True)
                    )
        except Exception as error:  # headers are sent: report in the stream, as OpenAI does
            logger.exception("Generation failed while streaming")
            yield event(error_body(f"Generation failed: {error}", "server_error"))
        if include_usage:
            yield event(self._envelope([], chunk=True, usage=self.usage(used)))
        yield "data: [DONE]\n\n"


def api_command(
    config_path: str,
    overrides: list[str],
    host: str = "127.0.0.1",
    port: int = 8000,
    api_key: str | None = None,
    model_name: str | None = None,
    max_tokens: int | None = None,
    max_batch: int = 16,
    media_dir: str | None = None,
    max_body_bytes: int | None = None,
    allowed_hosts: tuple[str, ...] = (),
    access_log: bool = True,
) -> int:
    from lathe.llm.inference.config import parse_infer_config
    from lathe.llm.inference.image_urls import ImageRules

    _fastapi()
    import uvicorn

    if media_dir is not None and not os.path.isdir(media_dir):  # before minutes of model loading
        raise ValueError(f"--media_dir {media_dir!r} is not a folder (image_url files are served from it).")
    config = parse_infer_config(config_path, overrides, command="api")
    engine = ChatEngine.from_config(config, max_batch=max_batch)
    name = model_name or os.path.basename(os.path.normpath(config.model.model_name_or_path))
    limits = Limits(max_tokens=max_tokens or config.generating.max_new_tokens, images=ImageRules(media_dir=media_dir))
    if max_body_bytes is not None:
        limits.max_body_bytes = max_body_bytes
    app = create_app(
        engine, name, api_key=api_key, limits=limits, boundary=Boundary(host, allowed_hosts), access_log=access_log
    )
    print(
        f"lathe api: serving {name!r} on http://{host}:{port}/v1 "
        f"({'API key required' if api_key else 'no API key'}; max_tokens up to {limits.max_tokens}"
        + (f"; image files from {media_dir}" if media_dir and engine.image_refusal() is None else "")
        + ")",
        flush=True,
    )
    uvicorn.run(app, host=host, port=port, log_level="warning")
    return 0
