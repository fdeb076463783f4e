"""Qwen3-Coder / Qwen3 XML tool calls:
`<tool_call><function=NAME><parameter=KEY>VALUE</parameter>...</function></tool_call>`;
each value is converted to its type in the tool's JSON schema (upstream's
qwen3_coder and qwen3_xml parsers)."""
from __future__ import annotations

import ast
import json
import re

from engine.entrypoints.openai.tool_parsers.abstract_tool_parser import (
    ExtractedToolCalls,
    ToolParser,
    ToolParserManager,
    tool_call,
)

_FUNCTION = re.compile(r"<function=(.*?)>(.*?)(?:</function>|$)", re.DOTALL)
_PARAMETER = re.compile(r"<parameter=(.*?)>(.*?)(?:</parameter>|(?=<parameter=)|$)", re.DOTALL)


def convert(value: str, schema: dict):
    """A parameter's text as its schema's type (the text itself when it does not fit)."""
    v = value[1:] if value.startswith("\n") else value
    v = v[:-1] if v.endswith("\n") else v
    kind = schema.get("type", "string")
    kind = kind[0] if isinstance(kind, list) and kind else kind
    if v.strip().lower() == "null" and kind != "string":
        return None
    try:
        if kind == "integer":
            return int(v.strip())
        if kind == "number":
            f = float(v.strip())
            return int(f) if f.is_integer() and "." not in v else f
        if kind == "boolean":
            return {"true": True, "false": False}[v.strip().lower()]
        if kind in ("object", "array"):
            try:
                return json.loads(v)
            except json.JSONDecodeError:
                return ast.literal_eval(v.strip())
    except (ValueError, KeyError, SyntaxError):
        pass
    return v


@ToolParserManager.register_module(["qwen3_coder", "qwen3_xml"])
class Qwen3CoderToolParser(ToolParser):
    start_token = "<tool_call>"

    def may_start(self, text: str) -> int | None:
        at = super().may_start(text)
        bare = text.find("<function=")  # some outputs leave out <tool_call>
        return bare if bare >= 0 and (at is None or bare < at) else at

    def extract_tool_calls(self, text: str) -> ExtractedToolCalls:
        if "<function=" not in text:
            return ExtractedToolCalls(False, content=text)
        calls = []
        for name, body in _FUNCTION.findall(text):
            props = self.tool_schema(name.strip()).get("properties", {})
            args = {k.strip(): convert(v, props.get(k.strip(), {}))
                    for k, v in _PARAMETER.findall(body)}
            calls.append(tool_call(name.strip(), args))
        start = self.may_start(text)
        content = text[:start] if start else ""
        return ExtractedToolCalls(bool(calls), calls, content or None)
