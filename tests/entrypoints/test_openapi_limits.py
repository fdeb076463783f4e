"""The served model's bounds in /openapi.json (engine/entrypoints/openai/openapi_limits.py)."""
from __future__ import annotations

import json
import re

import pytest

from engine.entrypoints.openai import openapi_limits
from engine.entrypoints.openai.protocol import ChatCompletionRequest, CompletionRequest


@pytest.mark.parametrize("n", [1, 2, 9, 10, 11, 99, 100, 101, 512, 1000, 1001, 49152, 151936])
def test_below_matches_exactly_the_ids_under_n(n):
    r = re.compile(openapi_limits.below(n))
    assert [i for i in range(n + 120) if r.match(str(i))] == list(range(n))
    assert not any(r.match(k) for k in ("", "-1", "01", "1.0", " 1", "x"))


def test_routes_are_listed_for_the_tasks_served():
    paths = dict.fromkeys(["/health", "/v1/completions", "/v1/embeddings", "/classify",
                           "/v2/rerank", "/tokenize"], {})
    assert set(openapi_limits.served_paths(paths, ("generate",))) == {
        "/health", "/v1/completions", "/tokenize"}
    assert set(openapi_limits.served_paths(paths, ("embed", "score"))) == {
        "/health", "/v1/embeddings", "/v2/rerank", "/tokenize"}


def _bounded(model) -> dict:
    schema = json.loads(json.dumps(model.model_json_schema()))
    openapi_limits.bound(schema, vocab=1000, max_logprobs=-1, max_model_len=64)
    return schema


def test_bounds_are_the_models_and_in_json_schema_words():
    schema = _bounded(CompletionRequest)
    text = json.dumps(schema)
    assert "x-limit" not in text and '"ge"' not in text and '"le"' not in text
    props = schema["properties"]
    assert props["stop_token_ids"]["anyOf"][0]["items"] == {
        "type": "integer", "minimum": 0, "maximum": 999}
    assert props["logprobs"]["maximum"] == 1000  # -1: the vocabulary
    assert props["max_tokens"]["anyOf"][0]["minimum"] == 0
    assert props["max_tokens"]["maximum"] == 64
    assert re.compile(props["logit_bias"]["propertyNames"]["pattern"]).match("999")
    assert not re.compile(props["logit_bias"]["propertyNames"]["pattern"]).match("1000")


def test_cross_field_rules_are_in_the_schema():
    """The rules check() enforces, said as if/then, so that a generator
    (schemathesis) never sends a body the server must refuse."""
    rules = _bounded(ChatCompletionRequest)["allOf"]
    ifs = [next(iter(r["if"]["properties"])) for r in rules]
    assert ifs == ["stream_options", "stream", "continue_final_message", "top_logprobs"]
    assert _bounded(CompletionRequest)["allOf"][-1]["then"] == {
        "properties": {"echo": {"const": True}}, "required": ["echo"]}
