"""Tool-call parsers (upstream's tool_parsers/): each turns a model's text
into OpenAI `tool_calls`, one file per format, registered by the name
`--tool-call-parser` takes. `--tool-parser-plugin FILE` imports a user's
file, whose `@ToolParserManager.register_module("name")` class then counts
as one of them."""
from __future__ import annotations

import importlib
import importlib.util
from pathlib import Path

from engine.entrypoints.openai.tool_parsers.abstract_tool_parser import (
    ExtractedToolCalls,
    ToolParser,
    ToolParserManager,
)

# name -> the module that registers it (imported on first use)
_BUILTIN = {"hermes": "hermes_tool_parser", "llama3_json": "llama_tool_parser",
            "llama4_json": "llama_tool_parser", "mistral": "mistral_tool_parser",
            "qwen3_coder": "qwen3coder_tool_parser", "qwen3_xml": "qwen3coder_tool_parser",
            "pythonic": "pythonic_tool_parser"}

__all__ = ["ExtractedToolCalls", "ToolParser", "ToolParserManager", "get_tool_parser",
           "import_tool_parser", "parser_names"]


def parser_names() -> list[str]:
    return sorted(set(_BUILTIN) | set(ToolParserManager.tool_parsers))


def import_tool_parser(path: str) -> None:
    """--tool-parser-plugin FILE: run the file, which registers its parsers."""
    file = Path(path)
    if not file.is_file():
        raise ValueError(f"--tool-parser-plugin {path}: no such file")
    spec = importlib.util.spec_from_file_location(f"tool_parser_plugin_{file.stem}", file)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # noqa: BLE001 - the user's file: one line at start
        raise ValueError(f"--tool-parser-plugin {path} failed to import: "
                         f"{type(exc).__name__}: {exc}".splitlines()[0]) from None


def get_tool_parser(name: str) -> type[ToolParser]:
    """The parser class `--tool-call-parser name` means (ValueError naming the choices)."""
    if name not in ToolParserManager.tool_parsers and name in _BUILTIN:
        importlib.import_module(f"{__name__}.{_BUILTIN[name]}")
    try:
        return ToolParserManager.tool_parsers[name]
    except KeyError:
        raise ValueError(f"--tool-call-parser {name!r} is not known; use one of "
                         f"{', '.join(parser_names())} (or register it with "
                         "--tool-parser-plugin FILE)") from None
