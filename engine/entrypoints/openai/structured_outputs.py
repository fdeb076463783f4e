"""A request's output constraint, as upstream vLLM reads it: `response_format`
(json_object, json_schema), `structured_outputs` {json, regex, choice,
grammar, json_object, structural_tag} and the older guided_json /
guided_regex / guided_choice / guided_grammar fields. It is checked here, in a
worker thread bounded in time (a hostile schema is a 400 naming its field,
never a hung server), then compiled by the engine core."""
from __future__ import annotations

import asyncio
import json
from concurrent.futures import ThreadPoolExecutor

from engine import envs
from engine.sampling_params import StructuredOutputsParams

# two builds at once at most: a schema that runs past its time keeps its
# thread, and the next requests wait for the other one (and time out)
_POOL = ThreadPoolExecutor(2, thread_name_prefix="grammar-check")
_FIELDS = ("json", "regex", "choice", "grammar", "json_object", "structural_tag")
# JSON levels of a schema: a real one has a few dozen; xgrammar takes seconds
# per level past a hundred (2,000 levels ran for minutes)
MAX_SCHEMA_DEPTH = 128
GUIDED = {"guided_json": "json", "guided_regex": "regex", "guided_choice": "choice",
          "guided_grammar": "grammar"}


class StructuredOutputError(ValueError):
    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field


def from_request(body) -> tuple[StructuredOutputsParams, str] | None:
    """(the constraint, the field that set it) of a chat or completion request,
    or None; StructuredOutputError naming the field when it is malformed."""
    extra = body.model_extra or {}
    found = []
    rf = getattr(body, "response_format", None)
    if rf is not None and rf.get("type", "text") != "text":
        found.append(("response_format", from_response_format(rf, "response_format")))
    so = extra.get("structured_outputs")
    if so is not None:
        found.append(("structured_outputs", _from_fields(so, "structured_outputs")))
    guided = {GUIDED[k]: v for k, v in extra.items() if k in GUIDED and v is not None}
    if guided:
        name = next(k for k in GUIDED if extra.get(k) is not None)
        found.append((name, _from_fields(guided, name)))
    if len(found) > 1:
        raise StructuredOutputError(found[1][0], f"{found[0][0]} and {found[1][0]} both "
                                    "constrain the output; give one of them")
    return (found[0][1], found[0][0]) if found else None


def from_response_format(rf, field: str) -> StructuredOutputsParams:
    """OpenAI's {"type": "json_object"} or {"type": "json_schema", "json_schema":
    {"name", "schema", "strict"}} (the Responses API's text.format puts the
    schema beside type: `field` says which)."""
    if not isinstance(rf, dict):
        raise StructuredOutputError(field, f"{field}: an object such as "
                                    '{"type": "json_object"}')
    kind = rf.get("type")
    if kind == "json_object":
        return StructuredOutputsParams(json_object=True)
    if kind == "json_schema":
        spec = rf if field == "text.format" else rf.get("json_schema")
        if not isinstance(spec, dict):
            raise StructuredOutputError(field, f"{field}: json_schema must be an object such "
                                        'as {"name": "x", "schema": {...}}')
        schema = spec.get("schema", {})  # OpenAI's default: any JSON object
        if not isinstance(schema, dict):
            where = "schema" if field == "text.format" else "json_schema.schema"
            raise StructuredOutputError(field, f"{field}: {where} must be a JSON schema "
                                        "object")
        _check_depth(schema, field)
        return StructuredOutputsParams(json=json.dumps(schema or {"type": "object"}))
    if kind == "structural_tag":
        return StructuredOutputsParams(structural_tag=json.dumps(rf))
    raise StructuredOutputError(field, f"{field}: type must be text, json_object, json_schema "
                                f"or structural_tag, got {kind!r}")


def _from_fields(given, field: str) -> StructuredOutputsParams:
    if not isinstance(given, dict):
        raise StructuredOutputError(field, f"{field}: an object such as "
                                    '{"regex": "[0-9]+"}')
    unknown = sorted(set(given) - set(_FIELDS) - {"disable_any_whitespace", "backend",
                                                  "whitespace_pattern", "disable_fallback",
                                                  "disable_additional_properties"})
    if unknown:
        raise StructuredOutputError(field, f"{field}: unknown key {unknown[0]!r}; use one of "
                                    f"{', '.join(_FIELDS)}")
    if given.get("whitespace_pattern") is not None:  # outlines' option; xgrammar has none
        raise StructuredOutputError(field, f"{field}: whitespace_pattern is not supported by "
                                    "xgrammar; use disable_any_whitespace")
    backend = given.get("backend")
    if backend not in (None, "auto", "xgrammar"):
        raise StructuredOutputError(field, f"{field}: backend {backend!r} is not available; "
                                    "use xgrammar")
    values = {k: given[k] for k in _FIELDS if given.get(k) not in (None, False)}
    if len(values) != 1:
        raise StructuredOutputError(field, f"{field}: set exactly one of {', '.join(_FIELDS)}")
    (k, v), = values.items()
    if k == "json":
        if isinstance(v, str):
            try:
                v = json.loads(v)
            except json.JSONDecodeError as exc:
                raise StructuredOutputError(field, f"{field}: json is not valid JSON: "
                                            f"{exc}") from None
        if not isinstance(v, (dict, bool)):
            raise StructuredOutputError(field, f"{field}: json must be a JSON schema object")
        _check_depth(v, field)
        v = json.dumps(v)
    elif k == "choice":
        if not isinstance(v, list) or not v or not all(isinstance(c, str) for c in v):
            raise StructuredOutputError(field, f"{field}: choice must be a list of strings")
    elif k == "json_object":
        v = True
    elif k == "structural_tag":
        v = v if isinstance(v, str) else json.dumps(v)
    elif not isinstance(v, str) or not v:
        raise StructuredOutputError(field, f"{field}: {k} must be a non-empty string")
    return StructuredOutputsParams(**{k: v},
                                   disable_any_whitespace=bool(given.get("disable_any_whitespace")))


def _check_depth(schema, field: str) -> None:
    level, deepest = [(schema, 1)], 0
    while level:
        value, depth = level.pop()
        deepest = max(deepest, depth)
        if deepest > MAX_SCHEMA_DEPTH:
            raise StructuredOutputError(field, f"{field}: the JSON schema nests deeper than "
                                        f"{MAX_SCHEMA_DEPTH} levels; flatten it")
        children = value.values() if isinstance(value, dict) else \
            value if isinstance(value, list) else ()
        level += [(c, depth + 1) for c in children if isinstance(c, (dict, list))]


async def check(params: StructuredOutputsParams, field: str) -> None:
    """StructuredOutputError naming `field` when the constraint is too large,
    does not build, or takes longer than VLLM_STRUCTURED_OUTPUTS_TIMEOUT_S."""
    from engine.structured_output.backend_xgrammar import NAMES, check_spec

    kind, text = params.kind()
    limit = envs.structured_outputs_max_bytes()
    if len(text.encode("utf-8", "surrogatepass")) > limit:
        raise StructuredOutputError(field, f"{field}: the {NAMES[kind]} is larger than "
                                    f"{limit} bytes (VLLM_STRUCTURED_OUTPUTS_MAX_BYTES); "
                                    "shorten it")
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(_POOL, _import)  # seconds the first time, not the check's
    timeout = envs.structured_outputs_timeout_s()
    try:
        await asyncio.wait_for(loop.run_in_executor(_POOL, check_spec, params, field), timeout)
    except asyncio.TimeoutError:
        raise StructuredOutputError(field, f"{field}: the {NAMES[kind]} took more than "
                                    f"{timeout:g} s to build; simplify it") from None
    except ValueError as exc:
        raise StructuredOutputError(field, str(exc)) from None


def _import() -> None:
    import xgrammar  # noqa: F401
