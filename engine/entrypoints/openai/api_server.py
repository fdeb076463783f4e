"""`engine serve`: the OpenAI-compatible HTTP API on FastAPI and uvicorn, over
an AsyncLLM. Every error is an OpenAI-shaped JSON body (400, 401, 404); a
client that disconnects mid-stream aborts its request."""
from __future__ import annotations

import asyncio
import json
import logging
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import AsyncIterator

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from engine.async_llm import AsyncLLM, EngineDeadError
from engine.entrypoints import chat_utils
from engine.entrypoints.openai.metrics import Metrics
from engine.entrypoints.openai.protocol import ChatCompletionRequest, CompletionRequest, _Sampling

logger = logging.getLogger("engine")

ERROR_TYPES = {400: "BadRequestError", 401: "AuthenticationError", 404: "NotFoundError",
               405: "MethodNotAllowed", 500: "InternalServerError", 503: "ServiceUnavailable"}


class APIError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param = status, message, param


def error_body(status: int, message: str, param: str | None = None) -> dict:
    return {"error": {"message": message, "type": ERROR_TYPES.get(status, "Error"),
                      "param": param, "code": status}}


def error_response(status: int, message: str, param: str | None = None) -> JSONResponse:
    return JSONResponse(error_body(status, message, param), status_code=status)


@dataclass
class ServerState:
    llm: AsyncLLM
    model_names: list[str]
    model_dir: Path
    metrics: Metrics
    api_key: str | None
    chat_template: str | None
    special_tokens: dict[str, str]
    max_model_len: int
    created: int


def build_app(state: ServerState) -> FastAPI:
    app = FastAPI(title="vllm-engine", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.s = state

    @app.exception_handler(APIError)
    async def _api_error(_, exc: APIError):
        return error_response(exc.status, exc.message, exc.param)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_, exc: RequestValidationError):
        first = exc.errors()[0] if exc.errors() else {}
        loc = ".".join(str(x) for x in first.get("loc", ()) if x != "body")
        msg = first.get("msg", "invalid request")
        if first.get("type") == "json_invalid":
            msg = "the request body is not valid JSON"
        return error_response(400, f"{loc}: {msg}" if loc else msg, loc or None)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_, exc: StarletteHTTPException):
        return error_response(exc.status_code, str(exc.detail))

    @app.exception_handler(Exception)
    async def _unexpected(_, exc: Exception):  # logged here; the client gets no traceback
        logger.exception("request failed")
        return error_response(500, f"internal error: {type(exc).__name__}")

    async def authorized(request: Request) -> None:
        # a dependency, not a middleware: Starlette's BaseHTTPMiddleware hides a client's
        # disconnect from the endpoint, and a disconnect must abort the request. async:
        # FastAPI runs a plain def in a worker thread, a thread hop per request
        key = state.api_key
        if key:
            given = request.headers.get("authorization", "")
            if not secrets.compare_digest(given.encode(), f"Bearer {key}".encode()):
                raise APIError(401, "missing or wrong API key: send 'Authorization: Bearer <key>'")

    v1 = [Depends(authorized)]

    @app.get("/health")
    async def health():
        if state.llm.dead is not None:
            return error_response(503, f"the engine loop stopped: {state.llm.dead}")
        return Response(status_code=200)

    @app.get("/metrics")
    async def metrics():
        return Response(state.metrics.render(), media_type="text/plain; version=0.0.4")

    @app.get("/v1/models", dependencies=v1)
    async def models():
        return {"object": "list", "data": [
            {"id": name, "object": "model", "created": state.created, "owned_by": "vllm-engine",
             "root": str(state.model_dir), "parent": None, "max_model_len": state.max_model_len}
            for name in state.model_names]}

    @app.post("/v1/completions", dependencies=v1)
    async def completions(body: CompletionRequest, request: Request):
        _check(state, body)
        prompts = body.prompts()
        if not prompts:
            raise APIError(400, "prompt: give at least one prompt", "prompt")
        seqs = []
        for i, prompt in enumerate(prompts):
            seqs += _sequences(state, body, prompt, i, body.max_tokens or 16)
        name = body.model or state.model_names[0]
        texts = [p if isinstance(p, str) and body.echo else "" for p in prompts
                 for _ in range(body.n)]
        if body.stream:
            return _sse(_completion_stream(state, seqs, name, body, texts))
        return await _unless_disconnected(request, _completion_full(state, seqs, name, texts))

    @app.post("/v1/chat/completions", dependencies=v1)
    async def chat(body: ChatCompletionRequest, request: Request):
        _check(state, body)
        if state.chat_template is None:
            raise APIError(400, "this model has no chat template (none in its "
                           "tokenizer_config.json or chat_template.jinja); use /v1/completions "
                           "or start the server with --chat-template FILE", "messages")
        try:
            text = chat_utils.render(state.chat_template, _messages(body),
                                     add_generation_prompt=body.add_generation_prompt,
                                     tokens=state.special_tokens, tools=None, documents=None,
                                     **(body.chat_template_kwargs or {}))
        except chat_utils.ChatTemplateError as exc:
            raise APIError(400, str(exc), "messages") from None
        # as transformers' apply_chat_template(tokenize=True): the template
        # already wrote the special tokens it wants
        ids = state.llm.core.tokenizer.encode(text, add_special_tokens=False).ids
        max_tokens = body.max_completion_tokens or body.max_tokens
        seqs = _sequences(state, body, ids, 0, max_tokens or max(state.max_model_len - len(ids), 1))
        name = body.model or state.model_names[0]
        if body.stream:
            return _sse(_chat_stream(state, seqs, name, body))
        return await _unless_disconnected(request, _chat_full(state, seqs, name))

    return app


# ---- requests ----------------------------------------------------------------


def _check(state: ServerState, body: _Sampling) -> None:
    if body.model is not None and body.model not in state.model_names:
        raise APIError(404, f"The model `{body.model}` does not exist; this server serves "
                       f"{', '.join(state.model_names)}", "model")
    bad = body.unsupported()
    if bad:
        raise APIError(400, f"{bad} is not supported by this engine; leave it unset", bad)


def _messages(body: ChatCompletionRequest) -> list[dict]:
    out = []
    for i, m in enumerate(body.messages):
        d = m.model_dump(exclude_none=False)
        if isinstance(m.content, list):  # parts: the text ones, joined as upstream does
            texts = []
            for part in m.content:
                if part.get("type") != "text" or not isinstance(part.get("text"), str):
                    raise APIError(400, f"messages.{i}.content: only text parts are supported, "
                                   f"got {part.get('type')!r}", "messages")
                texts.append(part["text"])
            d["content"] = "\n".join(texts)
        out.append(d)
    return out


def _sequences(state: ServerState, body: _Sampling, prompt, prompt_index: int,
               max_tokens: int) -> list:
    llm = state.llm
    try:
        seqs = [llm.make_sequence(prompt, body.sampling_params(max_tokens, j), prompt_index)
                for j in range(body.n)]
    except ValueError as exc:
        raise APIError(400, str(exc), "prompt") from None
    room = state.max_model_len - seqs[0].num_prompt_tokens
    if max_tokens > room and body.max_tokens is not None:
        raise APIError(400, f"max_tokens ({max_tokens}) plus the prompt's "
                       f"{seqs[0].num_prompt_tokens} tokens exceeds the model's context "
                       f"({state.max_model_len}); ask for at most {room}", "max_tokens")
    return seqs


def _usage(seqs) -> dict:
    prompt = sum({s.index: s.num_prompt_tokens for s in seqs}.values())
    completion = sum(s.num_output_tokens for s in seqs)
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion}


class _Text:
    """One choice's text as tokens arrive: hands out only what can no longer
    change (not a partial UTF-8 character, not the start of a stop string).
    Decoded incrementally by the tokenizer's own DecodeStream, as upstream's
    detokenizer does: each token decodes a window of the last few tokens in
    Rust, not the whole output again."""

    def __init__(self, tokenizer, seq):
        from tokenizers.decoders import DecodeStream

        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.text = ""           # the stable text decoded so far
        self.stream = DecodeStream(skip_special_tokens=True)  # as Tokenizer.decode
        self.sent = 0
        self.hold = max((len(s) for s in seq.params.stop), default=1) - 1

    def add(self, update) -> str:
        self.ids += update.new_token_ids
        if update.finish_reason is not None:
            text = update.text if update.text is not None else self.tokenizer.decode(self.ids)
            end = len(text)
        else:
            for i in update.new_token_ids:
                piece = self.stream.step(self.tokenizer, i)
                if piece:
                    self.text += piece
            text = self.text
            end = len(text) - self.hold
        delta = text[self.sent:end] if end > self.sent else ""
        self.sent = max(self.sent, end)
        return delta


async def _run(state: ServerState, seqs) -> AsyncIterator[tuple[int, object]]:
    """(choice index, update) for every sequence, as they come; stopping
    early (the client went away) aborts every sequence."""
    for s in seqs:
        state.metrics.on_prompt(s.num_prompt_tokens)
    if len(seqs) == 1:  # the common case, without a task per sequence
        async for update in state.llm.generate(seqs[0]):
            yield 0, update
        return
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(i, seq):
        try:
            async for update in state.llm.generate(seq):
                await queue.put((i, update))
        except Exception as exc:  # noqa: BLE001 - handed to the reader
            await queue.put((i, exc))

    tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(seqs)]
    try:
        left = len(seqs)
        while left:
            i, update = await queue.get()
            if isinstance(update, Exception):
                raise update
            if update.finish_reason is not None:
                left -= 1
            yield i, update
    finally:
        for t in tasks:
            t.cancel()


async def _unless_disconnected(request: Request, work):
    """Run a non-streamed request; a client that leaves before the answer
    aborts it (its sequences are aborted when the work is cancelled)."""
    task = asyncio.ensure_future(work)
    while True:
        done, _ = await asyncio.wait({task}, timeout=0.5)
        if done:
            return task.result()
        if await request.is_disconnected():
            task.cancel()
            return Response(status_code=499)


def _sse(chunks: AsyncIterator[dict]) -> StreamingResponse:
    async def body():
        try:
            async for chunk in chunks:
                yield b"data: %s\n\n" % json.dumps(chunk, separators=(",", ":")).encode()
        except EngineDeadError as exc:
            yield f"data: {json.dumps(error_body(500, str(exc)))}\n\n"
        yield "data: [DONE]\n\n"

    return StreamingResponse(body(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache"})


async def _completion_full(state, seqs, name, prefixes):
    try:
        async for _ in _run(state, seqs):  # the text comes from output_text at the end
            pass
    except EngineDeadError as exc:
        return error_response(500, str(exc))
    choices = [{"index": i, "text": prefixes[i] + state.llm.core.output_text(s), "logprobs": None,
                "finish_reason": s.finish_reason} for i, s in enumerate(seqs)]
    return {"id": f"cmpl-{secrets.token_hex(16)}", "object": "text_completion",
            "created": int(time.time()), "model": name, "choices": choices,
            "usage": _usage(seqs)}


async def _completion_stream(state, seqs, name, body, prefixes):
    rid, created = f"cmpl-{secrets.token_hex(16)}", int(time.time())
    texts = [_Text(state.llm.core.tokenizer, s) for s in seqs]

    def chunk(choices, usage=None):
        out = {"id": rid, "object": "text_completion", "created": created, "model": name,
               "choices": choices}
        if usage is not None:
            out["usage"] = usage
        return out

    for i, prefix in enumerate(prefixes):
        if prefix:
            yield chunk([{"index": i, "text": prefix, "logprobs": None, "finish_reason": None}])
    async for i, update in _run(state, seqs):
        delta = texts[i].add(update)
        if delta or update.finish_reason is not None:
            yield chunk([{"index": i, "text": delta, "logprobs": None,
                          "finish_reason": update.finish_reason}])
    if body.stream_options is None or body.stream_options.include_usage:
        yield chunk([], _usage(seqs))


async def _chat_full(state, seqs, name):
    try:
        async for _ in _run(state, seqs):
            pass
    except EngineDeadError as exc:
        return error_response(500, str(exc))
    choices = [{"index": i, "message": {"role": "assistant", "content":
                                        state.llm.core.output_text(s)},
                "logprobs": None, "finish_reason": s.finish_reason}
               for i, s in enumerate(seqs)]
    return {"id": f"chatcmpl-{secrets.token_hex(16)}", "object": "chat.completion",
            "created": int(time.time()), "model": name, "choices": choices,
            "usage": _usage(seqs)}


async def _chat_stream(state, seqs, name, body):
    rid, created = f"chatcmpl-{secrets.token_hex(16)}", int(time.time())
    texts = [_Text(state.llm.core.tokenizer, s) for s in seqs]

    def chunk(choices, usage=None):
        out = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": name,
               "choices": choices}
        if usage is not None:
            out["usage"] = usage
        return out

    yield chunk([{"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                  "finish_reason": None} for i in range(len(seqs))])
    async for i, update in _run(state, seqs):
        delta = texts[i].add(update)
        if delta or update.finish_reason is not None:
            yield chunk([{"index": i, "delta": {"content": delta} if delta else {},
                          "logprobs": None, "finish_reason": update.finish_reason}])
    if body.stream_options is None or body.stream_options.include_usage:
        yield chunk([], _usage(seqs))
