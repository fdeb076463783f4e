"""Llama 3.x / 4 JSON tool calls: the answer is `{"name": ..., "parameters":
{...}}` (or "arguments"), several separated by `;`, after an optional
`<|python_tag|>`."""
from __future__ import annotations

import json

from engine.entrypoints.openai.tool_parsers.abstract_tool_parser import (
    ExtractedToolCalls,
    ToolParser,
    ToolParserManager,
    tool_call,
)

BOT = "<|python_tag|>"


@ToolParserManager.register_module(["llama3_json", "llama4_json"])
class Llama3JsonToolParser(ToolParser):
    def may_start(self, text: str) -> int | None:
        s = text.lstrip()
        if not s or s.startswith("{") or s.startswith(BOT) or BOT.startswith(s):
            return 0
        return None

    def extract_tool_calls(self, text: str) -> ExtractedToolCalls:
        s = text.strip()
        if s.startswith(BOT):
            s = s[len(BOT):].lstrip()
        if not s.startswith("{"):
            return ExtractedToolCalls(False, content=text)
        decoder, calls, i = json.JSONDecoder(), [], 0
        try:
            while i < len(s):
                obj, i = decoder.raw_decode(s, i)
                args = obj.get("arguments", obj.get("parameters", {}))
                calls.append(tool_call(obj["name"], args))
                while i < len(s) and s[i] in " \t\r\n;":
                    i += 1
        except (json.JSONDecodeError, KeyError, TypeError, AttributeError):
            return ExtractedToolCalls(False, content=text)
        return ExtractedToolCalls(bool(calls), calls, None)
