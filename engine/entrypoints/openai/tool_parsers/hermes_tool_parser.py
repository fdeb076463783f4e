"""Hermes / Qwen2.5 tool calls: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`,
one block per call, after any text."""
from __future__ import annotations

import json
import re

from engine.entrypoints.openai.tool_parsers.abstract_tool_parser import (
    ExtractedToolCalls,
    ToolParser,
    ToolParserManager,
    tool_call,
)

_CALL = re.compile(r"<tool_call>(.*?)</tool_call>|<tool_call>(.*)", re.DOTALL)


@ToolParserManager.register_module("hermes")
class Hermes2ProToolParser(ToolParser):
    start_token = "<tool_call>"

    def extract_tool_calls(self, text: str) -> ExtractedToolCalls:
        if self.start_token not in text:
            return ExtractedToolCalls(False, content=text)
        calls = []
        try:
            for closed, open_ in _CALL.findall(text):
                data = json.loads((closed or open_).strip())
                calls.append(tool_call(data["name"], data.get("arguments", {})))
        except (json.JSONDecodeError, KeyError, TypeError, AttributeError):
            return ExtractedToolCalls(False, content=text)
        content = text[:text.find(self.start_token)]
        return ExtractedToolCalls(bool(calls), calls, content or None)
