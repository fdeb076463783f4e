"""Mistral tool calls: `[TOOL_CALLS]` then a JSON list of {"name", "arguments"}
(older tokenizers), or `[TOOL_CALLS]name[ARGS]{...}` per call (v11+); ids
of nine letters and digits, as Mistral's templates require."""
from __future__ import annotations

import json
import secrets
import string

from engine.entrypoints.openai.tool_parsers.abstract_tool_parser import (
    ExtractedToolCalls,
    ToolParser,
    ToolParserManager,
    tool_call,
)

_ALNUM = string.ascii_letters + string.digits


def mistral_id() -> str:
    return "".join(secrets.choice(_ALNUM) for _ in range(9))


@ToolParserManager.register_module("mistral")
class MistralToolParser(ToolParser):
    start_token = "[TOOL_CALLS]"

    def extract_tool_calls(self, text: str) -> ExtractedToolCalls:
        if self.start_token not in text:
            return ExtractedToolCalls(False, content=text)
        content, _, rest = text.partition(self.start_token)
        calls = []
        try:
            if "[ARGS]" in rest:
                for part in rest.split(self.start_token):
                    name, _, args = part.partition("[ARGS]")
                    calls.append(tool_call(name.strip(), json.loads(args), mistral_id()))
            else:
                for c in json.loads(rest.strip()):
                    calls.append(tool_call(c["name"], c.get("arguments", {}), mistral_id()))
        except (json.JSONDecodeError, KeyError, TypeError, AttributeError):
            return ExtractedToolCalls(False, content=text)
        return ExtractedToolCalls(bool(calls), calls, content or None)
