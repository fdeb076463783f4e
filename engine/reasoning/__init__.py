"""Reasoning parsers (upstream's vllm/reasoning/): `--reasoning-parser NAME`
splits a thinking model's answer into `reasoning_content` (what it wrote
between <think> and </think>) and `content`, whole and streamed. The end
tag's token ids also tell the engine core where a structured output begins
(StructuredOutputsParams.reasoning_end)."""
from __future__ import annotations

import importlib
from collections.abc import Callable

_BUILTIN = {"deepseek_r1": "deepseek_r1_reasoning_parser", "qwen3": "qwen3_reasoning_parser"}


class ReasoningParser:
    start_token = "<think>"
    end_token = "</think>"

    def extract(self, text: str, finished: bool = True) -> tuple[str | None, str | None]:
        """(reasoning, content) of the text so far; before the end, what may
        still turn into a tag is in neither."""
        raise NotImplementedError

    @staticmethod
    def held(text: str, tag: str) -> int:
        """How many characters at text's end could begin `tag`."""
        for k in range(min(len(tag) - 1, len(text)), 0, -1):
            if tag.startswith(text[-k:]):
                return k
        return 0


class ReasoningParserManager:
    reasoning_parsers: dict[str, type[ReasoningParser]] = {}

    @classmethod
    def register_module(cls, name: str) -> Callable[[type], type]:
        def register(parser: type) -> type:
            cls.reasoning_parsers[name] = parser
            return parser

        return register


def get_reasoning_parser(name: str) -> type[ReasoningParser]:
    """The class `--reasoning-parser name` means (ValueError naming the choices)."""
    if name not in ReasoningParserManager.reasoning_parsers and name in _BUILTIN:
        importlib.import_module(f"{__name__}.{_BUILTIN[name]}")
    try:
        return ReasoningParserManager.reasoning_parsers[name]
    except KeyError:
        names = sorted(set(_BUILTIN) | set(ReasoningParserManager.reasoning_parsers))
        raise ValueError(f"--reasoning-parser {name!r} is not known; use one of "
                         f"{', '.join(names)}") from None


class ReasoningStream:
    """One streamed answer's deltas: each call gives the reasoning and the
    content written since the last."""

    def __init__(self, parser: ReasoningParser):
        self.parser, self.text = parser, ""
        self.sent_reasoning = self.sent_content = 0

    def feed(self, delta: str, finished: bool) -> tuple[str, str]:
        self.text += delta
        reasoning, content = self.parser.extract(self.text, finished)
        reasoning, content = reasoning or "", content or ""
        out = reasoning[self.sent_reasoning:], content[self.sent_content:]
        self.sent_reasoning = max(self.sent_reasoning, len(reasoning))
        self.sent_content = max(self.sent_content, len(content))
        return out
