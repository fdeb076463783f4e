"""/openapi.json names every status the server answers: the OpenAI-shaped
errors (400 for a bad field or a body that is not JSON, 401 without the API
key, 404 for an unknown model, 413 for a body past the bound, 503 while the
queue is full or the engine is gone), so that a client generated from it
(or schemathesis) meets no undocumented status. FastAPI's own 422 is never
sent (RequestValidationError answers 400): it is dropped."""
from __future__ import annotations

import warnings
from collections.abc import Callable

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

ERROR_SCHEMA = {"type": "object", "required": ["error"], "properties": {"error": {
    "type": "object", "required": ["message", "type", "code"],
    "properties": {"message": {"type": "string"}, "type": {"type": "string"},
                   "param": {"type": ["string", "null"]}, "code": {"type": "integer"}}}}}
# status -> when; the body routes get all of them, the others those that apply
BODY_ERRORS = {400: "a field is invalid, or the body is not JSON sent as application/json",
               401: "the API key is missing or wrong (--api-key)",
               404: "the model named is not served",
               413: "the body is larger than the server takes",
               503: "the waiting queue is full (Retry-After) or the engine stopped"}


STREAMED = ("/v1/completions", "/v1/chat/completions", "/v1/responses")


def _error(why: str) -> dict:
    return {"description": why, "content": {"application/json": {"schema": ERROR_SCHEMA}}}


# /health and /ping answer 200 with no body (no content type), as upstream's
PROBE_RESPONSES: dict = {200: {"description": "the engine is running (no body)", "content": {}},
                         503: _error("the engine core stopped")}


def document_errors(app: FastAPI, tailor: Callable[[dict], None] | None = None) -> None:
    """tailor: what the served model changes in the schema (openapi_limits)."""

    def openapi() -> dict:
        if app.openapi_schema is None:
            with warnings.catch_warnings():  # /ping's GET and POST share their operation id
                warnings.simplefilter("ignore")
                schema = get_openapi(title=app.title, version=app.version, routes=app.routes)
            for path, ops in schema.get("paths", {}).items():
                for method, op in ops.items():
                    if len(ops) > 1:
                        op["operationId"] = f"{op.get('operationId', path)}_{method}"
                    responses = op.setdefault("responses", {})
                    responses.pop("422", None)
                    if path in STREAMED:  # stream=true answers server-sent events
                        ok = responses.setdefault("200", {"description": "the answer"})
                        ok.setdefault("content", {})["text/event-stream"] = {"schema": {}}
                    if method in ("post", "put", "patch") or path.startswith("/v1"):
                        for status, why in BODY_ERRORS.items():
                            responses.setdefault(str(status), _error(why))
            if tailor is not None:
                tailor(schema)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
