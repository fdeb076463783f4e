"""What both OpenAI endpoints share (upstream's OpenAIServing): OpenAI-shaped
errors, turning a request into checked engine sequences, running them, text
handed out as tokens arrive, and the pieces of a streamed answer."""
from __future__ import annotations

import asyncio
import json
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import AsyncIterator

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from engine.core.async_llm import (EngineDeadError, QueueFullError, RequestFailedError,
                                   RequestUpdate)
from engine.core.engine_client import EngineClient
from engine.entrypoints.openai.metrics import Metrics
from engine.entrypoints.openai.protocol import _Sampling
from engine.entrypoints.openai.request_limits import prompt_surely_too_long
from engine.entrypoints.openai.structured_outputs import StructuredOutputError
from engine.entrypoints.openai import structured_outputs
from engine.sampling_params import StructuredOutputsParams

ERROR_TYPES = {400: "BadRequestError", 401: "AuthenticationError", 404: "NotFoundError",
               405: "MethodNotAllowed", 500: "InternalServerError", 503: "ServiceUnavailable"}


RETRY_AFTER_S = 1  # the Retry-After of a 503 for a full waiting queue


class APIError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None,
                 headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.headers = status, message, param, headers


async def json_body(request: Request) -> None:
    """A dependency of every route with a JSON body, as upstream's validate_json_request:
    the body must come as `Content-Type: application/json` (parameters such as charset
    aside), else a 400 naming the header instead of a validator's sentence about bytes."""
    given = request.headers.get("content-type", "")
    if given.split(";", 1)[0].strip().lower() != "application/json":
        got = f"got {given!r}" if given else "none was sent"
        raise APIError(400, "Unsupported Media Type: the request body must be JSON sent with "
                       f"the header 'Content-Type: application/json' ({got})")


def error_body(status: int, message: str, param: str | None = None) -> dict:
    return {"error": {"message": message, "type": ERROR_TYPES.get(status, "Error"),
                      "param": param, "code": status}}


def error_response(status: int, message: str, param: str | None = None,
                   headers: dict | None = None) -> JSONResponse:
    return JSONResponse(error_body(status, message, param), status_code=status,
                        headers=headers)


@dataclass
class ServerState:
    llm: EngineClient
    model_names: list[str]
    model_dir: Path
    metrics: Metrics
    api_key: str | None
    chat_template: str | None
    special_tokens: dict[str, str]
    max_model_len: int
    created: int
    max_body_bytes: int | None = None  # a larger body is a 413 (None: no bound)
    max_tok_bytes: int | None = None  # the tokenizer's longest token, in UTF-8 bytes
    # tool calling and reasoning (--tool-call-parser, --enable-auto-tool-choice,
    # --reasoning-parser): parser names
    tool_call_parser: str | None = None
    enable_auto_tool_choice: bool = False
    reasoning_parser: str | None = None


def failure_response(line: str) -> JSONResponse:
    """A request the engine failed: a 400 naming structured_outputs where its
    grammar would not compile in the core, else a 500."""
    if "structured_outputs:" in line:
        return error_response(400, line.split("structured_outputs:", 1)[1].strip(),
                              "structured_outputs")
    return error_response(500, line)


def check_prompt_fits(state: ServerState, text: str, param: str) -> None:
    """A text that cannot fit the context however it tokenizes is a 400
    before it is tokenized (tokenizing megabytes takes seconds)."""
    if prompt_surely_too_long(text, state.max_model_len, state.max_tok_bytes):
        raise APIError(400, f"{param}: the prompt cannot fit the model's context of "
                       f"{state.max_model_len} tokens however it tokenizes; shorten it", param)


# ---- requests ----------------------------------------------------------------


def check_request(state: ServerState, body: _Sampling) -> str:
    """The served model name the request asked for; refuses unknown models and
    options this engine does not implement."""
    if body.model is not None and body.model not in state.model_names:
        raise APIError(404, f"The model `{body.model}` does not exist; this server serves "
                       f"{', '.join(state.model_names)}", "model")
    bad = body.unsupported()
    if bad:
        raise APIError(400, f"{bad} is not supported by this engine; leave it unset", bad)
    try:
        body.check()
    except ValueError as exc:
        raise APIError(400, str(exc), str(exc).split(" ")[0].rstrip(":")) from None
    return body.model or state.model_names[0]


async def output_constraint(body: _Sampling, given: tuple | None = None
                            ) -> StructuredOutputsParams | None:
    """The request's structured output (given: (params, field) made for it, as
    tool_choice required makes), checked (a 400 naming its field), or None."""
    try:
        found = given or structured_outputs.from_request(body)
        if found is not None:
            await structured_outputs.check(*found)
    except StructuredOutputError as exc:
        raise APIError(400, str(exc), exc.field) from None
    return found[0] if found is not None else None


async def make_sequences(state: ServerState, body: _Sampling, prompt, prompt_index: int,
                         max_tokens: int | None, default_max_tokens,
                         constraint: StructuredOutputsParams | None = None) -> list:
    """body.n requests of one prompt. max_tokens: what the request asked
    for (checked against the context), None for default_max_tokens(prompt
    length); constraint: the output's (output_constraint)."""
    llm = state.llm
    if isinstance(prompt, str):
        check_prompt_fits(state, prompt, "prompt")
    try:
        defaults = llm.model_config.generation_defaults
        params = [body.sampling_params(max_tokens or max(body.min_tokens, 1), j, defaults)
                  for j in range(body.n)]
        for p in params:
            p.structured_outputs = constraint
    except ValueError as exc:
        raise APIError(400, str(exc), str(exc).split(" ")[0].rstrip(":")) from None
    try:
        first = await llm.make_request(prompt, params[0], prompt_index)
        ids = first.token_ids  # the prompt tokenized once for all n
        seqs = [first] + [await llm.make_request(ids, p, prompt_index) for p in params[1:]]
    except ValueError as exc:
        raise APIError(400, str(exc), "prompt") from None
    for s in seqs[1:]:
        s.prompt = first.prompt
    n = seqs[0].num_prompt_tokens
    room = state.max_model_len - n
    if max_tokens is None:
        max_tokens = max(1, min(default_max_tokens(n), room))
        for s in seqs:
            s.params.max_tokens = max_tokens
            s.params.min_tokens = min(s.params.min_tokens, max_tokens)
    elif max_tokens > room:
        raise APIError(400, f"max_tokens ({max_tokens}) plus the prompt's {n} tokens exceeds "
                       f"the model's context ({state.max_model_len}); ask for at most {room}",
                       "max_tokens")
    return seqs


def check_fan_out(state: ServerState, count: int, param: str) -> None:
    """A request of more sequences (n x prompts) than could ever wait at once
    is a 400 naming `param`: refused before any of them is tokenized."""
    bound = state.llm.max_waiting
    if bound is not None and count > bound:
        raise APIError(400, f"{param}: n x prompts is {count} sequences; this server "
                       f"queues at most {bound} (--max-waiting-queue-length)", param)


def admit(state: ServerState, seqs, param: str) -> None:
    """Queue a request's sequences in the engine, all or none: a request that
    could never fit the waiting bound is a 400 naming `param` (n, or the
    prompt list), one that does not fit now a 503 with Retry-After. The
    answer (stream_answer / unless_disconnected) must end with release()."""
    check_fan_out(state, len(seqs), param)
    try:
        state.llm.add(seqs)
    except QueueFullError as exc:
        raise APIError(503, str(exc), None, {"Retry-After": str(RETRY_AFTER_S)}) from None
    except EngineDeadError as exc:
        raise APIError(503, str(exc)) from None
    for s in seqs:
        state.metrics.on_prompt(s.num_prompt_tokens)


def release(state: ServerState, seqs) -> None:
    """Abort whatever of an admitted request is still queued or running (a
    no-op for sequences that finished): an answer that ends early, or never
    starts (its client left first), leaves nothing behind."""
    for s in seqs:
        state.llm.abort(s.request_id)


def usage(seqs) -> dict:
    prompt = sum({s.index: s.num_prompt_tokens for s in seqs}.values())
    completion = sum(s.num_output_tokens for s in seqs)
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion}


def wants_usage(body) -> bool:
    """The final usage chunk of a stream: only when asked for, as upstream and OpenAI."""
    return body.stream_options is not None and bool(body.stream_options.include_usage)


def usage_per_chunk(body, seqs):
    """continuous_usage_stats: the usage so far on every chunk (else None)."""
    o = body.stream_options
    if o is not None and o.include_usage and o.continuous_usage_stats:
        return lambda: usage(seqs)
    return lambda: None


# ---- running -----------------------------------------------------------------


async def run(state: ServerState, seqs) -> AsyncIterator[tuple[int, RequestUpdate]]:
    """(choice index, update) for every sequence (admitted), as they come;
    stopping early (the client went away) aborts every sequence."""
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


async def run_to_end(state: ServerState, seqs) -> str | None:
    """Run the sequences to their end; the engine's error if it died meanwhile."""
    try:
        async for _ in run(state, seqs):  # each request's text is whole at its end
            pass
    except (EngineDeadError, RequestFailedError) as exc:
        return str(exc)
    return None


async def unless_disconnected(request: Request, work, state: ServerState, seqs):
    """Run a non-streamed request; a client that leaves before the answer
    aborts it (release() on the way out, whatever happened)."""
    task = asyncio.ensure_future(work)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=0.5)
            if done:
                return task.result()
            if await request.is_disconnected():
                task.cancel()
                return Response(status_code=499)
    finally:
        release(state, seqs)


# ---- streaming ---------------------------------------------------------------


class Chunks:
    """The chunks of one streamed answer: each carries the answer's id, object
    type, creation time and model name."""

    def __init__(self, prefix: str, obj: str, model: str):
        self.head = {"id": f"{prefix}-{secrets.token_hex(16)}", "object": obj,
                     "created": int(time.time()), "model": model}

    def __call__(self, choices: list, usage: dict | None = None) -> dict:
        out = {**self.head, "choices": choices}
        if usage is not None:
            out["usage"] = usage
        return out


def full_answer(prefix: str, obj: str, model: str, choices: list, seqs) -> dict:
    return {**Chunks(prefix, obj, model)(choices), "usage": usage(seqs)}


class _ReleasingStream(StreamingResponse):
    """A stream that releases its request's sequences once sent, or dropped
    before it began (its body then never runs)."""

    def __init__(self, content, on_close, **kw):
        super().__init__(content, **kw)
        self.on_close = on_close

    async def __call__(self, scope, receive, send):
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.on_close()


def sse(chunks: AsyncIterator[dict], state: ServerState, seqs,
        events: bool = False) -> StreamingResponse:
    """Server-sent events ending with `data: [DONE]`; events: each named by
    its chunk's type and no [DONE] (the Responses API's stream)."""
    async def body():
        try:
            async for chunk in chunks:
                name = b"event: %s\n" % chunk["type"].encode() if events else b""
                yield name + b"data: %s\n\n" % json.dumps(chunk, separators=(",", ":")).encode()
        except (EngineDeadError, RequestFailedError) as exc:
            error = ({"type": "error", "code": "500", "message": str(exc), "param": None}
                     if events else error_body(500, str(exc)))
            yield ("event: error\n" if events else "") + f"data: {json.dumps(error)}\n\n"
        if not events:
            yield "data: [DONE]\n\n"

    return _ReleasingStream(body(), lambda: release(state, seqs),
                            media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
