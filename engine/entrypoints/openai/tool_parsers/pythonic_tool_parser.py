"""Python-call tool calls (Llama 3.2 / 4, ToolACE): the answer is a list of
calls, `[get_weather(city="Paris"), add(a=1, b=2)]`, arguments literals;
Llama 4's `<|python_start|>`/`<|python_end|>` around it are dropped."""
from __future__ import annotations

import ast

from engine.entrypoints.openai.tool_parsers.abstract_tool_parser import (
    ExtractedToolCalls,
    ToolParser,
    ToolParserManager,
    tool_call,
)

START, END = "<|python_start|>", "<|python_end|>"


def _unwrap(text: str) -> str:
    s = text.strip()
    if s.startswith(START):
        s = s[len(START):]
    if s.endswith(END):
        s = s[:-len(END)]
    return s.strip()


@ToolParserManager.register_module("pythonic")
class PythonicToolParser(ToolParser):
    def may_start(self, text: str) -> int | None:
        s = text.lstrip()
        if not s or s.startswith("[") or s.startswith(START) or START.startswith(s):
            return 0
        return None

    def extract_tool_calls(self, text: str) -> ExtractedToolCalls:
        s = _unwrap(text)
        if not s.startswith("["):
            return ExtractedToolCalls(False, content=text)
        try:
            tree = ast.parse(s, mode="eval").body
            if not isinstance(tree, ast.List):
                raise ValueError("not a list")
            calls = []
            for e in tree.elts:
                if not (isinstance(e, ast.Call) and isinstance(e.func, ast.Name)) or e.args:
                    raise ValueError("not a call with keyword arguments")
                calls.append(tool_call(e.func.id, {k.arg: ast.literal_eval(k.value)
                                                   for k in e.keywords}))
        except (SyntaxError, ValueError, TypeError):
            return ExtractedToolCalls(False, content=text)
        return ExtractedToolCalls(bool(calls), calls, None)
