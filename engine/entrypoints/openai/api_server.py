"""`engine serve`: the OpenAI-compatible HTTP API on FastAPI and uvicorn, over
an AsyncLLM: the app, its routes and its error handlers. Every error is an
OpenAI-shaped JSON body (400, 401, 404); a client that disconnects mid-stream
aborts its request. The endpoints' work is in serving_completion/serving_chat."""
from __future__ import annotations

import logging
import secrets

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import PlainTextResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from engine import envs
from engine.entrypoints.openai import openapi_limits
from engine.entrypoints.openai.http_metrics import HttpMetrics
from engine.entrypoints.openai.lora_routes import add_lora_routes
from engine.entrypoints.openai.openapi_errors import PROBE_RESPONSES, document_errors
from engine.entrypoints.openai.protocol import ChatCompletionRequest, CompletionRequest
from engine.entrypoints.openai.request_id import RequestIdHeader
from engine.entrypoints.openai.request_limits import BodySizeLimit
from engine.entrypoints.openai.serving_chat import create_chat_completion
from engine.entrypoints.openai.serving_completion import create_completion
from engine.entrypoints.openai.serving_engine import (
    APIError,
    ServerState,
    error_response,
    json_body,
    serve_options,
)
from engine.entrypoints.openai.serving_pooling import (
    ClassificationRequest,
    EmbeddingRequest,
    create_classification,
    create_embedding,
)
from engine.entrypoints.openai.serving_responses import ResponsesRequest, create_response
from engine.entrypoints.openai.serving_score import (
    RerankRequest,
    ScoreRequest,
    create_rerank,
    create_score,
)
from engine.entrypoints.openai.serving_tokens import add_token_routes

logger = logging.getLogger("engine")

__all__ = ["ServerState", "build_app", "serve_options"]


def build_app(state: ServerState, docs: bool = True,
              allowed_origins: list[str] | None = None) -> FastAPI:
    """docs: /docs and /openapi.json (--disable-fastapi-docs turns them off);
    allowed_origins: CORS for those origins (--allowed-origins)."""
    app = FastAPI(title="vllm-engine", docs_url="/docs" if docs else None, redoc_url=None,
                  openapi_url="/openapi.json" if docs else None)
    app.state.s = state
    app.add_middleware(RequestIdHeader, always=state.options.request_id_headers)
    app.add_middleware(HttpMetrics, registry=state.metrics.registry)
    if allowed_origins:
        from fastapi.middleware.cors import CORSMiddleware

        app.add_middleware(CORSMiddleware, allow_origins=allowed_origins,
                           allow_methods=["*"], allow_headers=["*"])
    if state.max_body_bytes is not None:  # before FastAPI reads (and parses) a byte of it
        app.add_middleware(BodySizeLimit, max_bytes=state.max_body_bytes)

    @app.exception_handler(APIError)
    async def _api_error(_, exc: APIError):
        return error_response(exc.status, exc.message, exc.param, exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_, exc: RequestValidationError):
        first = exc.errors()[0] if exc.errors() else {}
        loc = ".".join(str(x) for x in first.get("loc", ()) if x != "body")
        msg = first.get("msg", "invalid request")
        if first.get("type") == "json_invalid":  # loc is a byte offset, not a field
            why = (first.get("ctx") or {}).get("error", "malformed")
            loc, msg = "", f"the request body is not valid JSON: {why} at byte {loc}"
        elif loc.split(".")[0] == "prompt":  # the union's own errors name its branches
            loc, msg = "prompt", ("must be a string, a list of strings, a list of token ids "
                                  "or a list of token id lists")
        return error_response(400, f"{loc}: {msg}" if loc else msg, loc or None)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_, exc: StarletteHTTPException):  # its headers too: a 405's Allow
        return error_response(exc.status_code, str(exc.detail),
                              headers=dict(exc.headers) if exc.headers else None)

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

    async def generates(request: Request) -> None:
        if state.llm.pooling_tasks:
            raise APIError(400, f"{request.url.path}: this server runs a pooling model, which "
                           f"serves {', '.join(state.llm.pooling_tasks)} "
                           "(/v1/embeddings, /classify, /score, /rerank), not text generation")

    v1 = [Depends(authorized)]
    v1_json = v1 + [Depends(json_body)]  # the key first: a stranger learns nothing more
    v1_generate = v1_json + [Depends(generates)]

    @app.get("/health", response_class=Response, responses=PROBE_RESPONSES)
    async def health():
        if state.llm.dead is not None:
            return error_response(503, f"the engine loop stopped: {state.llm.dead}")
        return Response(status_code=200)

    @app.api_route("/ping", methods=["GET", "POST"], response_class=Response,
                   responses=PROBE_RESPONSES)
    async def ping():  # upstream's load balancer probe: /health by another name
        return await health()

    add_token_routes(app, state)

    @app.get("/metrics", response_class=PlainTextResponse)
    async def metrics():
        return Response(state.metrics.render(), media_type="text/plain; version=0.0.4")

    @app.get("/v1/models", dependencies=v1)
    async def models():
        adapters = state.lora.cards() if state.lora is not None else []
        return {"object": "list", "data": [
            {"id": name, "object": "model", "created": state.created, "owned_by": "vllm-engine",
             "root": str(state.model_dir), "parent": None, "max_model_len": state.max_model_len}
            for name in state.model_names] + [{**a, "created": state.created} for a in adapters]}

    if state.lora is not None and envs.allow_runtime_lora_updating():
        add_lora_routes(app, state, v1_json)

    @app.post("/v1/completions", dependencies=v1_generate)
    async def completions(body: CompletionRequest, request: Request):
        return await create_completion(state, body, request)

    @app.post("/v1/chat/completions", dependencies=v1_generate)
    async def chat(body: ChatCompletionRequest, request: Request):
        return await create_chat_completion(state, body, request)

    @app.post("/v1/responses", dependencies=v1_generate)
    async def responses(body: ResponsesRequest, request: Request):
        return await create_response(state, body, request)

    add_pooling_routes(app, state, v1_json)

    def tailor(schema: dict) -> None:
        schema["paths"] = openapi_limits.served_paths(
            schema.get("paths", {}), state.llm.pooling_tasks or ("generate",))
        openapi_limits.bound(schema, state.llm.model_config.vocab_size,
                             state.options.max_logprobs, state.max_model_len)

    document_errors(app, tailor)
    return app


def add_pooling_routes(app: FastAPI, state: ServerState, deps: list) -> None:
    """Upstream's pooling routes; each answers 400 on a model without its task."""

    @app.post("/v1/embeddings", dependencies=deps)
    async def embeddings(body: EmbeddingRequest, request: Request):
        return await create_embedding(state, body, request)

    @app.post("/pooling", dependencies=deps)
    async def pooling(body: EmbeddingRequest, request: Request):
        return await create_embedding(state, body, request, obj="pooling")

    @app.post("/classify", dependencies=deps)
    async def classify(body: ClassificationRequest, request: Request):
        return await create_classification(state, body, request)

    for path in ("/score", "/v1/score"):
        @app.post(path, dependencies=deps)
        async def score(body: ScoreRequest, request: Request):
            return await create_score(state, body, request)

    for path in ("/rerank", "/v1/rerank", "/v2/rerank"):
        @app.post(path, dependencies=deps)
        async def rerank(body: RerankRequest, request: Request):
            return await create_rerank(state, body, request)
