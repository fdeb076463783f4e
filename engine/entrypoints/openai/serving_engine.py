"""What both OpenAI endpoints share (upstream's OpenAIServing): OpenAI-shaped
errors, turning a request into checked engine sequences, running them, text
handed out as tokens arrive, and the pieces of a streamed answer."""
from __future__ import annotations

import asyncio
import json
import logging
import secrets
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from engine.core.async_llm import EngineDeadError, QueueFullError, RequestFailedError, RequestUpdate
from engine.core.engine_client import EngineClient
from engine.entrypoints.openai import structured_outputs
from engine.entrypoints.openai.metrics import Metrics
from engine.entrypoints.openai.protocol import _Sampling
from engine.entrypoints.openai.request_limits import prompt_surely_too_long
from engine.entrypoints.openai.serving_models import LoRAModels
from engine.entrypoints.openai.structured_outputs import StructuredOutputError
from engine.lora.request import LoRARequest
from engine.sampling_params import MAX_LOGPROBS, StructuredOutputsParams

ERROR_TYPES = {400: "BadRequestError", 401: "AuthenticationError", 404: "NotFoundError",
               405: "MethodNotAllowed", 500: "InternalServerError", 503: "ServiceUnavailable"}


logger = logging.getLogger("engine")

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


@dataclass(frozen=True)
class ServeOptions:
    """What `engine serve`'s vLLM flags (cli_args.py) change about answers."""

    response_role: str = "assistant"  # --response-role
    max_logprobs: int = MAX_LOGPROBS  # --max-logprobs (-1: the vocabulary)
    log_requests: bool = False  # --enable-log-requests
    max_log_len: int | None = None  # --max-log-len
    tokens_as_ids: bool = False  # --return-tokens-as-token-ids
    request_id_headers: bool = False  # --enable-request-id-headers


def serve_options(args) -> ServeOptions:
    return ServeOptions(
        response_role=args.response_role,
        max_logprobs=MAX_LOGPROBS if args.max_logprobs is None else args.max_logprobs,
        log_requests=args.enable_log_requests, max_log_len=args.max_log_len,
        tokens_as_ids=args.return_tokens_as_token_ids,
        request_id_headers=args.enable_request_id_headers)


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
    options: ServeOptions = ServeOptions()
    # tool calling and reasoning (--tool-call-parser, --enable-auto-tool-choice,
    # --reasoning-parser): parser names
    tool_call_parser: str | None = None
    enable_auto_tool_choice: bool = False
    reasoning_parser: str | None = None
    lora: LoRAModels | None = None  # --enable-lora: the adapters served by name


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
    adapter = lora_request(state, body.model)
    if body.model is not None and body.model not in state.model_names and adapter is None:
        served = state.model_names + (list(state.lora.requests) if state.lora else [])
        raise APIError(404, f"The model `{body.model}` does not exist; this server serves "
                       f"{', '.join(served)}", "model")
    if adapter is not None and getattr(body, "use_beam_search", False):
        raise APIError(400, "use_beam_search: beam search runs the base model only; leave it "
                       "out with a LoRA adapter", "use_beam_search")
    bad = body.unsupported()
    if bad:
        raise APIError(400, f"{bad} is not supported by this engine; leave it unset", bad)
    try:
        body.check()
    except ValueError as exc:
        raise APIError(400, str(exc), str(exc).split(" ")[0].rstrip(":")) from None
    bound = state.options.max_logprobs
    bound = state.llm.model_config.vocab_size if bound == -1 else bound
    for name, asked in body.logprob_asks().items():
        if asked is not None and (asked > bound or asked < 0):
            raise APIError(400, f"{name}: at most {bound} (the server's --max-logprobs), "
                           f"got {asked}", name)
    return body.model or state.model_names[0]


def lora_request(state: ServerState, name: str | None) -> LoRARequest | None:
    """The adapter a request's `model` names; None: the base model."""
    return state.lora.requests.get(name) if state.lora is not None and name else None


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
        state.metrics.rejected.inc()  # --max-waiting-queue-length
        raise APIError(503, str(exc), None, {"Retry-After": str(RETRY_AFTER_S)}) from None
    except EngineDeadError as exc:
        raise APIError(503, str(exc)) from None
    state.metrics.on_request(seqs)
    for s in seqs:
        if state.options.log_requests:
            log_request(state, s)


def log_request(state: ServerState, seq) -> None:
    """--enable-log-requests: one line per sequence, its prompt cut at --max-log-len."""
    cut = state.options.max_log_len
    ids = seq.token_ids[:seq.num_prompt_tokens]
    text = seq.prompt
    if cut is not None:
        ids, text = ids[:cut], None if text is None else text[:cut]
    logger.info("Received request %s: prompt: %r, params: %s, prompt_token_ids: %s",
                seq.request_id, text, seq.params, ids)


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

    def __init__(self, prefix: str, obj: str, model: str, rid: str | None = None):
        self.head = {"id": f"{prefix}-{rid or secrets.token_hex(16)}", "object": obj,
                     "created": int(time.time()), "model": model}

    def __call__(self, choices: list, usage: dict | None = None) -> dict:
        out = {**self.head, "choices": choices}
        if usage is not None:
            out["usage"] = usage
        return out


def full_answer(prefix: str, obj: str, model: str, choices: list, seqs,
                rid: str | None = None) -> dict:
    return {**Chunks(prefix, obj, model, rid)(choices), "usage": usage(seqs)}


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
