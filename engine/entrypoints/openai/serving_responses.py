"""POST /v1/responses: the OpenAI Responses API, text in and text out, whole
or streamed as its typed events, as upstream vLLM serves it without tools;
text.format json_object and json_schema constrain the output.
The input (a string, or messages whose content is text or input_text /
output_text parts) and the instructions (a system message first) go through
the model's chat template, as a chat completion's messages do. Nothing is
stored: `previous_response_id` and `background` are refused, as are tools,
reasoning and other text formats (400 naming them)."""
from __future__ import annotations

import secrets
import time
from typing import Annotated

from fastapi import Request
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictStr, ValidationError
from pydantic.config import JsonDict

from engine.entrypoints.openai.openapi_limits import CONTEXT
from engine.entrypoints.openai.protocol import (
    TEMPERATURE,
    TOP_P,
    ChatCompletionRequest,
    Int,
    Number,
    Text,
)
from engine.entrypoints.openai.serving_chat import chat_sequences
from engine.entrypoints.openai.serving_engine import (
    APIError,
    ServerState,
    admit,
    failure_response,
    run,
    run_to_end,
    sse,
    unless_disconnected,
)

_TEXT: JsonDict = {"type": "object", "required": ["type", "text"], "properties": {
    "type": {"enum": ["input_text", "output_text"]}, "text": {"type": "string"}}}
INPUT_MESSAGE: JsonDict = {"type": "object", "required": ["role", "content"], "properties": {
    "type": {"const": "message"}, "role": {"type": "string"},
    "content": {"anyOf": [{"type": "string"}, {"type": "array", "items": _TEXT}]}}}


class ResponsesRequest(BaseModel):
    model_config = ConfigDict(extra="allow")  # unknown fields are ignored (refused ones named)

    model: StrictStr | None = None
    input: Text | Annotated[list[dict], Field(
        json_schema_extra={"minItems": 1, "items": INPUT_MESSAGE})]
    instructions: StrictStr | None = None
    max_output_tokens: Int | None = Field(default=None, ge=1, json_schema_extra=CONTEXT)
    temperature: Number | None = Field(default=None, json_schema_extra=TEMPERATURE)
    top_p: Number | None = Field(default=None, json_schema_extra=TOP_P)
    stream: StrictBool | None = False
    metadata: dict | None = None

    def unsupported(self) -> str | None:
        extra = self.model_extra or {}
        text = extra.get("text") or {}
        if not isinstance(text, dict) or not isinstance(text.get("format") or {}, dict):
            raise APIError(400, 'text: an object such as {"format": {"type": "text"}}', "text")
        fmt = (text.get("format") or {}).get("type", "text")
        for name, bad in (("tools", bool(extra.get("tools"))),
                          ("previous_response_id", extra.get("previous_response_id") is not None),
                          ("background", bool(extra.get("background"))),
                          ("reasoning", extra.get("reasoning") is not None),
                          ("include", bool(extra.get("include"))),
                          # upstream's Responses API has no beam search (it ignores the field)
                          ("use_beam_search", bool(extra.get("use_beam_search"))),
                          ("text", fmt not in ("text", "json_object", "json_schema")),
                          ("tool_choice", extra.get("tool_choice") not in (None, "none", "auto"))):
            if bad:
                return name
        return None

    def messages(self) -> list[dict]:
        out = [{"role": "system", "content": self.instructions}] if self.instructions else []
        if self.input in ("", []):
            raise APIError(400, "input: give a text or at least one message", "input")
        if isinstance(self.input, str):
            return out + [{"role": "user", "content": self.input}]
        for i, item in enumerate(self.input):
            content = item.get("content")
            if item.get("type", "message") != "message" or not isinstance(item.get("role"), str):
                raise APIError(400, f"input.{i}: only messages (role and content) are "
                               f"supported, got type {item.get('type')!r}", "input")
            if isinstance(content, list):
                if any(not isinstance(p, dict) or p.get("type") not in ("input_text", "output_text")
                       or not isinstance(p.get("text"), str) for p in content):
                    raise APIError(400, f"input.{i}.content: only input_text and output_text "
                                   "parts are supported", "input")
                content = "\n".join(p["text"] for p in content)
            if not isinstance(content, str):
                raise APIError(400, f"input.{i}.content: a string or a list of text parts",
                               "input")
            out.append({"role": "developer" if item["role"] == "developer" else item["role"],
                        "content": content})
        return out


async def create_response(state: ServerState, body: ResponsesRequest, request: Request):
    bad = body.unsupported()
    if bad:
        raise APIError(400, f"{bad} is not supported by this engine; leave it unset", bad)
    try:
        chat = ChatCompletionRequest.model_validate(
            {"model": body.model, "messages": body.messages(), "temperature": body.temperature,
             "top_p": body.top_p, "max_completion_tokens": body.max_output_tokens,
             "response_format": _response_format(body)})
    except ValidationError as exc:
        first = exc.errors()[0]
        raise APIError(400, f"input: {first.get('msg', 'invalid')}", "input") from None
    try:
        name, seqs, _ = await chat_sequences(state, chat)
    except APIError as exc:  # the schema's faults, named where this API takes it
        if exc.param == "response_format":
            exc.param, exc.message = "text.format", exc.message.replace("response_format",
                                                                        "text.format")
        raise
    admit(state, seqs, "input")
    head = _Head(name, body)
    if body.stream:
        return sse(_stream(state, seqs[0], head), state, seqs, events=True)
    return await unless_disconnected(request, _full(state, seqs[0], head), state, seqs)


def _response_format(body: ResponsesRequest) -> dict | None:
    """text.format as a chat request's response_format (the schema beside its type)."""
    fmt = ((body.model_extra or {}).get("text") or {}).get("format") or {}
    if fmt.get("type") != "json_schema":
        return fmt or None
    return {"type": "json_schema", "json_schema": {k: v for k, v in fmt.items() if k != "type"}}


class _Head:
    """What every form of one response carries: its ids, time and request."""

    def __init__(self, name: str, body: ResponsesRequest):
        self.id, self.item_id = f"resp_{secrets.token_hex(16)}", f"msg_{secrets.token_hex(16)}"
        self.name, self.body, self.created = name, body, int(time.time())

    def message(self, text: str, status: str) -> dict:
        content = [] if status == "in_progress" else [
            {"type": "output_text", "text": text, "annotations": [], "logprobs": []}]
        return {"id": self.item_id, "type": "message", "role": "assistant", "status": status,
                "content": content}

    def response(self, seq, text: str | None) -> dict:
        done = text is not None
        status = ("incomplete" if seq.finish_reason == "length" else "completed") if done \
            else "in_progress"
        b = self.body
        return {
            "id": self.id, "object": "response", "created_at": self.created, "model": self.name,
            "status": status, "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete"
            else None,
            "instructions": b.instructions, "max_output_tokens": b.max_output_tokens,
            "metadata": b.metadata, "temperature": b.temperature, "top_p": b.top_p,
            "output": [self.message(text or "", "completed")] if done else [],
            "parallel_tool_calls": True, "tool_choice": "auto", "tools": [],
            "previous_response_id": None, "reasoning": None, "store": False,
            "background": False, "text": {"format": {"type": "text"}}, "truncation": "disabled",
            "usage": _usage(seq) if done else None}


def _usage(seq) -> dict:
    return {"input_tokens": seq.num_prompt_tokens, "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": seq.num_output_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": seq.num_prompt_tokens + seq.num_output_tokens}


async def _full(state: ServerState, seq, head: _Head):
    dead = await run_to_end(state, [seq])
    if dead is not None:
        return failure_response(dead)
    return head.response(seq, seq.text)


async def _stream(state: ServerState, seq, head: _Head):
    n = 0

    def event(kind: str, **fields) -> dict:
        nonlocal n
        n += 1
        return {"type": f"response.{kind}", "sequence_number": n - 1, **fields}

    at = {"item_id": head.item_id, "output_index": 0, "content_index": 0}
    yield event("created", response=head.response(seq, None))
    yield event("in_progress", response=head.response(seq, None))
    yield event("output_item.added", output_index=0, item=head.message("", "in_progress"))
    yield event("content_part.added", **at,
                part={"type": "output_text", "text": "", "annotations": []})
    async for _, update in run(state, [seq]):
        delta = update.text
        if delta:
            yield event("output_text.delta", **at, delta=delta, logprobs=[])
    text = seq.text
    yield event("output_text.done", **at, text=text, logprobs=[])
    yield event("content_part.done", **at,
                part={"type": "output_text", "text": text, "annotations": []})
    yield event("output_item.done", output_index=0, item=head.message(text, "completed"))
    final = head.response(seq, text)
    yield event("completed" if final["status"] == "completed" else "incomplete", response=final)
