"""Tool calling in chat completions, as upstream vLLM's: `tool_choice` auto
(the --tool-call-parser reads the model's text, --enable-auto-tool-choice),
none, required (the answer constrained to a JSON list of calls) and named
(the answer constrained to the tool's parameters), whole or streamed."""
from __future__ import annotations

import json

from engine.entrypoints.openai.structured_outputs import StructuredOutputError
from engine.entrypoints.openai.tool_parsers import ToolParser, get_tool_parser
from engine.entrypoints.openai.tool_parsers.abstract_tool_parser import tool_call
from engine.sampling_params import StructuredOutputsParams


class ToolError(ValueError):
    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field


def _functions(tools: list) -> dict[str, dict]:
    out = {}
    for i, t in enumerate(tools):
        f = t.get("function") if isinstance(t, dict) else None
        if not isinstance(t, dict) or t.get("type", "function") != "function" or \
                not isinstance(f, dict) or not isinstance(f.get("name"), str):
            raise ToolError("tools", f"tools.{i}: a function tool, "
                            '{"type": "function", "function": {"name": ..., "parameters": ...}}')
        params = f.get("parameters", {})
        if not isinstance(params, dict):
            raise ToolError("tools", f"tools.{i}.function.parameters must be a JSON schema")
        out[f["name"]] = params or {"type": "object", "properties": {}}
    return out


class ToolMode:
    """What a chat request's tools and tool_choice ask of its answer."""

    def __init__(self, body, parser: str | None, enable_auto: bool):
        tools = body.tools or []
        self.functions = _functions(tools)
        self.tools = tools
        choice = body.tool_choice
        if choice is None:
            choice = "auto" if tools else "none"
        self.named: str | None = None
        if isinstance(choice, dict):
            function = choice.get("function")
            name = function.get("name") if isinstance(function, dict) else None
            if choice.get("type") != "function" or not isinstance(name, str):
                raise ToolError("tool_choice", 'tool_choice: "none", "auto", "required" or '
                                '{"type": "function", "function": {"name": ...}}')
            if name not in self.functions:
                raise ToolError("tool_choice", f"tool_choice: no tool named {name!r} in tools")
            self.named, choice = name, "named"
        elif choice not in ("none", "auto", "required"):
            raise ToolError("tool_choice", f'tool_choice: "none", "auto", "required" or a '
                            f"named function, got {choice!r}")
        if choice in ("required", "named", "auto") and not tools:
            raise ToolError("tool_choice", f"tool_choice {choice!r} needs tools")
        if choice == "auto" and not (enable_auto and parser):
            raise ToolError("tool_choice", '"auto" tool choice requires '
                            "--enable-auto-tool-choice and --tool-call-parser to be set")
        self.choice = choice
        self.parallel = body.parallel_tool_calls
        self.parser = get_tool_parser(parser) if choice == "auto" and parser else None

    def constraint(self) -> tuple[StructuredOutputsParams, str] | None:
        """required and named: the structured output that makes the answer calls."""
        if self.choice == "named":
            assert self.named is not None
            schema = self.functions[self.named]
        elif self.choice == "required":
            schema = {"type": "array", "minItems": 1, "items": {"anyOf": [
                {"type": "object", "properties": {"name": {"type": "string", "enum": [n]},
                                                  "parameters": p},
                 "required": ["name", "parameters"]} for n, p in self.functions.items()]}}
            if self.parallel is False:
                schema["maxItems"] = 1
        else:
            return None
        # compact: the client sees the arguments re-serialized (named: as written),
        # and whitespace between them is only tokens spent
        return StructuredOutputsParams(json=json.dumps(schema), disable_any_whitespace=True), \
            "tools"

    def new_parser(self) -> ToolParser | None:
        return self.parser(self.tools) if self.parser is not None else None

    def message(self, text: str, finish_reason: str | None) -> tuple[dict, str | None]:
        """The assistant message of a whole answer, and its finish_reason."""
        calls, content = self.calls(text)
        if not calls:
            return {"role": "assistant", "content": content}, finish_reason
        msg = {"role": "assistant", "content": content, "tool_calls": calls}
        tool_finish = self.choice == "auto" or (self.choice == "required" and
                                                finish_reason == "stop")
        return msg, "tool_calls" if tool_finish else finish_reason

    def calls(self, text: str) -> tuple[list[dict], str | None]:
        if self.choice == "named":
            assert self.named is not None
            return [tool_call(self.named, text)], ""
        if self.choice == "required":
            try:
                got = json.loads(text)
                return [tool_call(c["name"], c["parameters"]) for c in got], ""
            except (json.JSONDecodeError, KeyError, TypeError):
                return [], text  # cut short by max_tokens: the text as it came
        parser = self.new_parser()
        if parser is None:
            return [], text
        got = parser.extract_tool_calls(text)
        return (got.tool_calls, got.content) if got.tools_called else ([], text)


class ToolStream:
    """One choice's streamed deltas: content as it comes (auto: up to where a
    tool call may begin), tool_calls deltas once a call is whole (named: its
    arguments as they come)."""

    def __init__(self, mode: ToolMode):
        self.mode, self.text, self.parser = mode, "", mode.new_parser()
        self.named_started = False

    def deltas(self, new_text: str, finished: bool) -> list[dict]:
        self.text += new_text
        mode = self.mode
        if mode.choice == "named":
            out = []
            if not self.named_started:
                self.named_started = True
                call = tool_call(mode.named or "", "")
                out.append({"tool_calls": [{"index": 0, **call}]})
            if new_text:
                out.append({"tool_calls": [{"index": 0, "function": {"arguments": new_text}}]})
            return out
        if mode.choice == "required":
            if not finished:
                return []
            calls, content = mode.calls(self.text)
            return self._calls(calls) if calls else ([{"content": content}] if content else [])
        if self.parser is None:
            return [{"content": new_text}] if new_text else []
        content, calls = self.parser.stream(self.text, finished)
        return ([{"content": content}] if content else []) + self._calls(calls)

    @staticmethod
    def _calls(calls: list[dict]) -> list[dict]:
        return [{"tool_calls": [{"index": i, **c}]} for i, c in enumerate(calls)]


def check_tools(body, parser: str | None, enable_auto: bool) -> ToolMode:
    """The request's ToolMode; ToolError naming the field when it cannot be served."""
    mode = ToolMode(body, parser, enable_auto)
    if mode.constraint() is not None and (body.response_format or {}).get("type", "text") \
            != "text":
        raise ToolError("tool_choice", f"tool_choice {mode.choice!r} constrains the answer to "
                        "tool calls; leave response_format unset")
    return mode


__all__ = ["StructuredOutputError", "ToolError", "ToolMode", "ToolStream", "check_tools"]
