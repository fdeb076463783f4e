"""/score and /rerank (also /v1/rerank, the Jina and Cohere shape), as
upstream's serving_score: a cross-encoder (a *ForSequenceClassification
with one label) reads each (query, document) pair whole and its sigmoid is
the score; an embedding model scores a pair by the cosine similarity of the
two texts' embeddings."""
from __future__ import annotations

import time

import numpy as np
from fastapi import Request
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictStr

from engine.entrypoints.openai.protocol import Int
from engine.entrypoints.openai.serving_engine import APIError, ServerState
from engine.entrypoints.openai.serving_pooling import (
    check_model,
    pool,
    refuse_unsupported,
    request_id,
    usage,
    vector,
)
from engine.pooling_params import PoolingParams

Texts = StrictStr | list[StrictStr]


class ScoreRequest(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: StrictStr | None = None
    text_1: Texts
    text_2: Texts


class RerankRequest(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: StrictStr | None = None
    query: StrictStr
    documents: list[StrictStr]
    top_n: Int | None = Field(default=None, ge=0)  # 0 or unset: every document
    return_documents: StrictBool = True


def pairs_of(first: Texts, second: Texts) -> tuple[list[str], list[str]]:
    a = [first] if isinstance(first, str) else list(first)
    b = [second] if isinstance(second, str) else list(second)
    if not a:
        raise APIError(400, "text_1: give at least one text", "text_1")
    if not b:
        raise APIError(400, "text_2: give at least one text", "text_2")
    if len(a) == 1:
        a = a * len(b)
    if len(a) != len(b):
        raise APIError(400, f"text_2: {len(b)} texts for {len(a)} in text_1; give one text_1 "
                       "for many text_2, or two lists of one length", "text_2")
    return a, b


async def scores(state: ServerState, request: Request, firsts: list[str], seconds: list[str],
                 param: str):
    """(each pair's score, the requests run), or the Response that ended it early."""
    cross = "classify" in state.llm.pooling_tasks
    if cross:
        seqs = await pool(state, request, firsts, PoolingParams(task="score"), param, seconds)
        if isinstance(seqs, Response):
            return seqs
        return [float(vector(s)[0]) for s in seqs], seqs
    # an embedding model: each distinct text embedded once
    texts = list(dict.fromkeys(firsts + seconds))
    seqs = await pool(state, request, texts, PoolingParams(task="embed", normalize=True), param)
    if isinstance(seqs, Response):
        return seqs
    by_text = {t: vector(s) for t, s in zip(texts, seqs)}
    return [float(np.dot(by_text[a], by_text[b])) for a, b in zip(firsts, seconds)], seqs


async def create_score(state: ServerState, body: ScoreRequest, request: Request):
    name = check_model(state, body.model, "/score")
    refuse_unsupported(body)
    firsts, seconds = pairs_of(body.text_1, body.text_2)
    got = await scores(state, request, firsts, seconds, "text_2")
    if isinstance(got, Response):
        return got
    values, seqs = got
    return {"id": f"score-{request_id()}", "object": "list", "created": int(time.time()),
            "model": name, "data": [{"index": i, "object": "score", "score": v}
                                    for i, v in enumerate(values)], "usage": usage(seqs)}


async def create_rerank(state: ServerState, body: RerankRequest, request: Request):
    name = check_model(state, body.model, "/rerank")
    refuse_unsupported(body)
    if not body.documents:
        raise APIError(400, "documents: give at least one document", "documents")
    got = await scores(state, request, [body.query] * len(body.documents), body.documents,
                       "documents")
    if isinstance(got, Response):
        return got
    values, seqs = got
    ranked = sorted(range(len(values)), key=lambda i: values[i], reverse=True)
    if body.top_n:
        ranked = ranked[:body.top_n]
    results = []
    for i in ranked:
        r: dict = {"index": i, "relevance_score": values[i]}
        if body.return_documents:
            r["document"] = {"text": body.documents[i]}
        results.append(r)
    return {"id": f"rerank-{request_id()}", "model": name, "results": results,
            "usage": {"total_tokens": usage(seqs)["total_tokens"]}}
