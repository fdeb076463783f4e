"""/openapi.json says what this server takes, not only what any server could:
a request the schema allows is one the server answers (schemathesis'
positive_data_acceptance holds). The request models mark the bounds that
depend on the served model (`x-limit`: a token id below the vocabulary, at
most --max-logprobs alternatives), and the routes the model cannot serve
(pooling routes on a generative model, generation on a pooling one) are left
out of the schema; they still answer the 400 that names the runner to use."""
from __future__ import annotations

from collections.abc import Iterator

from pydantic.config import JsonDict

# the task each route serves; a route not named serves every model
ROUTE_TASKS = {
    "/v1/completions": "generate", "/v1/chat/completions": "generate",
    "/v1/responses": "generate", "/v1/embeddings": "embed", "/pooling": "embed",
    "/classify": "classify",
    **dict.fromkeys(("/score", "/v1/score", "/rerank", "/v1/rerank", "/v2/rerank"), "score"),
}

# json_schema_extra of a field whose bound is the served model's
TOKEN_ID: JsonDict = {"minimum": 0, "x-limit": "vocab"}
LOGPROBS: JsonDict = {"minimum": 0, "x-limit": "max_logprobs"}
CONTEXT: JsonDict = {"x-limit": "max_model_len"}  # new tokens, or a prompt's tokens kept
TOKEN_ID_KEYS: JsonDict = {"propertyNames": {"x-limit": "vocab_keys"}}  # a dict keyed by token ids


def served_paths(paths: dict, tasks: tuple[str, ...]) -> dict:
    """The routes of `paths` whose task is among `tasks` ("generate" for a
    generative model, its pooling tasks otherwise)."""
    return {p: ops for p, ops in paths.items() if ROUTE_TASKS.get(p, tasks[0]) in tasks}


def bound(schema: dict, vocab: int, max_logprobs: int, max_model_len: int) -> None:
    """Every `x-limit` mark in `schema` made a maximum (in place): token ids
    below `vocab`, alternatives at most `max_logprobs` (-1: the vocabulary),
    new tokens at most the context."""
    top = {"vocab": vocab - 1, "max_logprobs": vocab if max_logprobs == -1 else max_logprobs,
           "max_model_len": max_model_len}
    for node in _nodes(schema):
        limit = node.pop("x-limit", None)
        if limit == "vocab_keys":
            node["pattern"] = below(vocab)
        elif limit is not None:
            node["maximum"] = top[limit]
        if node.get("type") in ("integer", "number"):
            # pydantic writes ge/le unrenamed where an Annotated int with a validator
            # (protocol.Int) sits in a union with None; the server checks them
            for theirs, ours in _KEYWORDS.items():
                if theirs in node:
                    node[ours] = node.pop(theirs)


_KEYWORDS = {"ge": "minimum", "le": "maximum", "gt": "exclusiveMinimum", "lt": "exclusiveMaximum"}


def below(n: int) -> str:
    """A regular expression for the decimal numbers 0 .. n - 1 (n >= 1), as
    JSON object keys: no sign, no leading zeros."""
    top = str(n - 1)
    if len(top) == 1:
        return f"^[0-{top}]$"
    shorter = ["[0-9]"] + [f"[1-9][0-9]{{{k - 1}}}" for k in range(2, len(top))]
    same = [top]  # len(top) digits: a prefix of top, a smaller digit, then any digits
    for i, d in enumerate(top):
        low = 1 if i == 0 else 0
        if int(d) > low:
            rest = len(top) - i - 1
            same.append(top[:i] + f"[{low}-{int(d) - 1}]" + (f"[0-9]{{{rest}}}" if rest else ""))
    return "^(?:" + "|".join(shorter + same) + ")$"


def _nodes(node) -> Iterator[dict]:
    if isinstance(node, dict):
        yield node
        for value in node.values():
            yield from _nodes(value)
    elif isinstance(node, list):
        for value in node:
            yield from _nodes(value)
