"""Upstream's small routes beside the OpenAI API: /version, /load,
/tokenize and /detokenize (outside /v1, without the API key, as upstream's)."""
from __future__ import annotations

import json
from typing import Annotated

from fastapi import Depends, FastAPI, Response
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictStr

from engine.core import cpu_share
from engine.entrypoints.openai.openapi_limits import TOKEN_ID
from engine.entrypoints.openai.protocol import ChatMessage, Int, when
from engine.entrypoints.openai.serving_chat import render_chat
from engine.entrypoints.openai.serving_engine import APIError, ServerState, json_body

# json.dumps of a list is one C call that holds the GIL: 5.4 million ids (a
# 10 MB /tokenize) held the event loop 6 s. Longer answers are written in a
# worker thread, a slice of ids at a time, the event loop running between.
LONG_ANSWER_IDS = 1 << 14


def tokens_json(ids: list[int], max_model_len: int) -> bytes:
    """/tokenize's answer for many ids, as JSON, written a slice at a time."""
    parts = [b'{"count":%d,"max_model_len":%d,"tokens":[' % (len(ids), max_model_len)]
    for i in range(0, len(ids), LONG_ANSWER_IDS):
        part = json.dumps(ids[i:i + LONG_ANSWER_IDS], separators=(",", ":"))[1:-1]
        parts.append(b"," + part.encode() if i else part.encode())
    parts.append(b'],"token_strs":null}')
    return b"".join(parts)


class TokenizeRequest(BaseModel):
    """A prompt, or chat messages rendered by the chat template (upstream's
    two forms); add_special_tokens defaults to true for a prompt, false for
    messages (the template writes its own)."""

    model_config = ConfigDict(extra="ignore", json_schema_extra={
        "oneOf": [{"properties": {"prompt": {"type": "string"}}, "required": ["prompt"]},
                  {"properties": {"messages": {"type": "array"}}, "required": ["messages"]}],
        **when("continue_final_message", {"const": True},
               {"add_generation_prompt": {"const": False},
                "messages": {"type": "array", "minItems": 1}})})

    model: StrictStr | None = None
    prompt: StrictStr | None = None
    messages: list[ChatMessage] | None = None
    add_generation_prompt: StrictBool = True
    continue_final_message: StrictBool = False
    chat_template_kwargs: dict | None = None
    add_special_tokens: StrictBool | None = None
    return_token_strs: StrictBool = False


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: StrictStr | None = None
    tokens: list[Annotated[Int, Field(ge=0, json_schema_extra=TOKEN_ID)]]


def add_token_routes(app: FastAPI, state: ServerState) -> None:
    vocab = state.llm.model_config.vocab_size

    def check_model(name: str | None) -> None:
        if name is not None and name not in state.model_names:
            raise APIError(404, f"The model `{name}` does not exist; this server serves "
                           f"{', '.join(state.model_names)}", "model")

    @app.get("/version")
    async def version():
        from engine import __version__

        return {"version": __version__}

    @app.get("/load")
    async def load():
        return {"server_load": state.llm.num_requests()}

    @app.post("/tokenize", dependencies=[Depends(json_body)])
    async def tokenize(body: TokenizeRequest):
        check_model(body.model)
        if (body.prompt is None) == (body.messages is None):
            raise APIError(400, "prompt: give either prompt or messages", "prompt")
        text, special = body.prompt, body.add_special_tokens
        if body.messages is not None:
            if body.continue_final_message and body.add_generation_prompt:
                raise APIError(400, "continue_final_message: not with add_generation_prompt="
                               "true; set add_generation_prompt to false",
                               "continue_final_message")
            text = await render_chat(state, body.messages, body.add_generation_prompt,
                                     body.continue_final_message,
                                     body.chat_template_kwargs or {})
        assert text is not None
        try:
            ids = await state.llm.tokenize(
                text, body.prompt is not None if special is None else special)
        except ValueError as exc:  # not Unicode text
            raise APIError(400, f"prompt: {exc}", "prompt") from None
        if len(ids) > LONG_ANSWER_IDS:
            answer = await cpu_share.in_thread(tokens_json, ids, state.max_model_len)
            return Response(answer, media_type="application/json")
        strs = ([state.llm.tokenizer.id_to_token(t) for t in ids]
                if body.return_token_strs else None)
        return {"count": len(ids), "max_model_len": state.max_model_len, "tokens": ids,
                "token_strs": strs}

    @app.post("/detokenize", dependencies=[Depends(json_body)])
    async def detokenize(body: DetokenizeRequest):
        check_model(body.model)
        bad = [t for t in body.tokens if not 0 <= t < vocab]
        if bad:
            raise APIError(400, f"tokens: token ids must be in [0, {vocab}), got {bad[:5]}",
                           "tokens")
        return {"prompt": state.llm.detokenize(body.tokens)}
