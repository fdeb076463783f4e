"""The pooling routes (upstream's serving_embedding / serving_pooling /
serving_classification): /v1/embeddings in OpenAI's shape (float or base64
vectors, `dimensions`), /pooling, and /classify. Each input is one request
to the engine core, all admitted together; a pooling request is one
prefill-only step there (engine/core/pooling_scheduler.py)."""
from __future__ import annotations

import base64
import time
from typing import Literal

import numpy as np
from fastapi import Request
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, StrictBool, StrictStr

from engine.entrypoints.openai.openapi_limits import ROUTE_TASKS
from engine.entrypoints.openai.protocol import Int
from engine.entrypoints.openai.serving_engine import (
    APIError,
    ServerState,
    admit,
    check_fan_out,
    check_prompt_fits,
    error_response,
    run_to_end,
    unless_disconnected,
)
from engine.pooling_params import PoolingParams

Input = StrictStr | list[StrictStr] | list[Int] | list[list[Int]]


# upstream's fields this engine does not implement: refused by name when set
REFUSED = ("truncate_prompt_tokens", "embed_dtype", "endianness", "mm_processor_kwargs")


def refuse_unsupported(body: BaseModel) -> None:
    extra = body.model_extra or {}
    for name in REFUSED:
        if extra.get(name) is not None:
            raise APIError(400, f"{name} is not supported by this engine; leave it unset "
                           "(an input longer than the model's context is refused, not cut)"
                           if name == "truncate_prompt_tokens" else
                           f"{name} is not supported by this engine; leave it unset", name)


class EmbeddingRequest(BaseModel):
    model_config = ConfigDict(extra="allow")  # user, ...: ignored, as upstream

    model: StrictStr | None = None
    input: Input
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: Int | None = None
    normalize: StrictBool | None = None  # vLLM's: None is the model's own
    add_special_tokens: StrictBool = True

    def inputs(self) -> list:
        p = self.input
        if isinstance(p, str) or (p and all(isinstance(x, int) for x in p)):
            return [p]
        return list(p)


class ClassificationRequest(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: StrictStr | None = None
    input: Input


def check_model(state: ServerState, name: str | None, route: str) -> str:
    """The served name; 404 for another model, 400 when the model does not do
    the route's task (ROUTE_TASKS, which /openapi.json's routes follow too)."""
    task = ROUTE_TASKS[route]
    if name is not None and name not in state.model_names:
        raise APIError(404, f"The model `{name}` does not exist; this server serves "
                       f"{', '.join(state.model_names)}", "model")
    tasks = state.llm.pooling_tasks
    if task not in tasks:
        if not tasks:
            why = ("this server runs a generative model; serve an embedding or reranking model "
                   "(--runner pooling) for it")
        else:
            why = f"this model serves {', '.join(tasks)} (see --convert)"
        raise APIError(400, f"{route}: {why}")
    return name or state.model_names[0]


async def pool(state: ServerState, request: Request, inputs: list, params: PoolingParams,
               param: str, pairs: list[str] | None = None, add_special_tokens: bool = True):
    """Run one pooling request per input (with pairs: a cross-encoder's
    pairs); their states in order, or the Response that ended the request
    early (a client that left). A bad input is a 400 naming param[i]."""
    if not inputs:
        raise APIError(400, f"{param}: give at least one input", param)
    check_fan_out(state, len(inputs), param)
    seqs = []
    for i, prompt in enumerate(inputs):
        where = f"{param}[{i}]" if len(inputs) > 1 or pairs else param
        if isinstance(prompt, str):
            check_prompt_fits(state, prompt + (pairs[i] if pairs else ""), where)
        try:
            seqs.append(await state.llm.make_pooling_request(
                prompt, params, i, pairs[i] if pairs else None, add_special_tokens))
        except ValueError as exc:
            message = str(exc).replace(f"input {i}", where, 1)
            raise APIError(400, message if message.startswith(where) else f"{where}: {message}",
                           param) from None
    admit(state, seqs, param)
    dead = await unless_disconnected(request, run_to_end(state, seqs), state, seqs)
    if isinstance(dead, Response):
        return dead
    if dead is not None:
        return error_response(500, dead)
    return seqs


def vector(seq) -> np.ndarray:
    return np.frombuffer(seq.pooled, dtype="<f4")


def usage(seqs) -> dict:
    n = sum(s.num_prompt_tokens for s in seqs)
    return {"prompt_tokens": n, "total_tokens": n, "completion_tokens": 0,
            "prompt_tokens_details": None}


def _encoded(seq, fmt: str):
    if fmt == "base64":  # what the OpenAI SDK asks for by default, and decodes as float32
        return base64.b64encode(seq.pooled).decode()
    return vector(seq).tolist()


async def create_embedding(state: ServerState, body: EmbeddingRequest, request: Request,
                           obj: str = "embedding"):
    """/v1/embeddings (obj "embedding") and /pooling (obj "pooling")."""
    route = "/v1/embeddings" if obj == "embedding" else "/pooling"
    name = check_model(state, body.model, route)
    refuse_unsupported(body)
    params = PoolingParams(task="embed", dimensions=body.dimensions, normalize=body.normalize)
    try:
        params.check(state.llm.model_config.hidden_size,
                     state.llm.model_config.hf.get("matryoshka_dimensions"))
    except ValueError as exc:
        raise APIError(400, str(exc), "dimensions") from None
    seqs = await pool(state, request, body.inputs(), params, "input",
                      add_special_tokens=body.add_special_tokens)
    if isinstance(seqs, Response):
        return seqs
    key = "embedding" if obj == "embedding" else "data"
    data = [{"index": i, "object": obj, key: _encoded(s, body.encoding_format)}
            for i, s in enumerate(seqs)]
    return {"id": f"{obj[:5]}-{request_id()}", "object": "list", "created": int(time.time()),
            "model": name, "data": data, "usage": usage(seqs)}


async def create_classification(state: ServerState, body: ClassificationRequest,
                                request: Request):
    name = check_model(state, body.model, "/classify")
    refuse_unsupported(body)
    inputs = EmbeddingRequest(input=body.input).inputs()
    seqs = await pool(state, request, inputs, PoolingParams(task="classify"), "input")
    if isinstance(seqs, Response):
        return seqs
    labels = state.llm.model_config.hf.get("id2label") or {}
    data = []
    for i, s in enumerate(seqs):
        probs = vector(s).tolist()
        best = int(np.argmax(probs))
        data.append({"index": i, "label": labels.get(str(best), f"LABEL_{best}"),
                     "probs": probs, "num_classes": len(probs)})
    return {"id": f"classify-{request_id()}", "object": "list", "created": int(time.time()),
            "model": name, "data": data, "usage": usage(seqs)}


def request_id() -> str:
    import secrets

    return secrets.token_hex(16)

