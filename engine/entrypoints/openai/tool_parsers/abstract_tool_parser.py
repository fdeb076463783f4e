"""What every tool parser is (upstream's ToolParser): extract_tool_calls on
the whole text, and a streaming form built on it that holds text back only
from where a tool call may begin, so plain answers stream as they come."""
from __future__ import annotations

import json
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field


def tool_call(name: str, arguments, call_id: str | None = None) -> dict:
    """An OpenAI tool call; arguments as a JSON string."""
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments, ensure_ascii=False)
    return {"id": call_id or f"chatcmpl-tool-{secrets.token_hex(16)}", "type": "function",
            "function": {"name": name, "arguments": arguments}}


@dataclass
class ExtractedToolCalls:
    tools_called: bool
    tool_calls: list[dict] = field(default_factory=list)
    content: str | None = None


class ToolParser:
    # where a tool call begins in the text (None: the parser decides, see may_start)
    start_token: str | None = None

    def __init__(self, tools: list[dict] | None = None):
        self.tools = tools or []
        self._sent = 0  # characters of the text streamed as content
        self._held = False

    def extract_tool_calls(self, text: str) -> ExtractedToolCalls:
        raise NotImplementedError

    def tool_schema(self, name: str) -> dict:
        for t in self.tools:
            f = t.get("function") or {}
            if f.get("name") == name:
                return f.get("parameters") or {}
        return {}

    def may_start(self, text: str) -> int | None:
        """Where in text a tool call begins or might begin (a prefix of
        start_token at its end counts), or None: all of it is content."""
        if self.start_token is None:
            return 0
        at = text.find(self.start_token)
        if at >= 0:
            return at
        for k in range(min(len(self.start_token) - 1, len(text)), 0, -1):
            if self.start_token.startswith(text[-k:]):
                return len(text) - k
        return None

    def stream(self, text: str, finished: bool) -> tuple[str, list[dict]]:
        """(content to send now, tool calls to send now) given all the text so
        far: content up to where a tool call may begin; at the end, the calls
        (or, if none parse, the rest as content)."""
        if not finished:
            at = self.may_start(text)
            upto = len(text) if at is None else at
            out, self._sent = text[self._sent:max(upto, self._sent)], max(upto, self._sent)
            return out, []
        got = self.extract_tool_calls(text)
        if not got.tools_called:
            out, self._sent = text[self._sent:], len(text)
            return out, []
        content = got.content or ""
        rest = content[self._sent:] if content.startswith(text[:self._sent]) else ""
        return rest, got.tool_calls


class ToolParserManager:
    tool_parsers: dict[str, type[ToolParser]] = {}

    @classmethod
    def register_module(cls, name: str | list[str]) -> Callable[[type], type]:
        names = [name] if isinstance(name, str) else list(name)

        def register(parser: type) -> type:
            for n in names:
                cls.tool_parsers[n] = parser
            return parser

        return register
