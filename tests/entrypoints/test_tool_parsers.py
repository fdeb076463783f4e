"""Each tool parser on fixed model outputs (upstream's test strings), whole
and streamed, and the registry (--tool-call-parser, --tool-parser-plugin)."""
from __future__ import annotations

import json

import pytest
from test_serve import tiny_model  # noqa: F401

from engine.entrypoints.openai.tool_parsers import ToolParser, get_tool_parser, import_tool_parser

WEATHER = {"name": "get_current_weather", "arguments": {"city": "Dallas", "state": "TX",
                                                       "unit": "fahrenheit"}}
TOOLS = [{"type": "function", "function": {"name": "get_current_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "state": {"type": "string"},
                                     "unit": {"type": "string"}, "days": {"type": "integer"},
                                     "hourly": {"type": "boolean"},
                                     "extra": {"type": "object"}}}}}]

CASES = {
    "hermes": ('Let me check. <tool_call>\n{"name": "get_current_weather", "arguments": '
               '{"city": "Dallas", "state": "TX", "unit": "fahrenheit"}}\n</tool_call>',
               "Let me check. "),
    "llama3_json": ('<|python_tag|>{"name": "get_current_weather", "parameters": {"city": '
                    '"Dallas", "state": "TX", "unit": "fahrenheit"}}', None),
    "mistral": ('[TOOL_CALLS][{"name": "get_current_weather", "arguments": {"city": "Dallas", '
                '"state": "TX", "unit": "fahrenheit"}}]', None),
    "qwen3_coder": ("Sure.\n<tool_call>\n<function=get_current_weather>\n<parameter=city>\n"
                    "Dallas\n</parameter>\n<parameter=state>\nTX\n</parameter>\n"
                    "<parameter=unit>\nfahrenheit\n</parameter>\n</function>\n</tool_call>",
                    "Sure.\n"),
    "pythonic": ("[get_current_weather(city='Dallas', state='TX', unit='fahrenheit')]", None),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_each_parser_reads_its_format_whole_and_streamed(name):
    text, content = CASES[name]
    got = get_tool_parser(name)(TOOLS).extract_tool_calls(text)
    assert got.tools_called and got.content == content
    (call,) = got.tool_calls
    assert call["type"] == "function" and call["function"]["name"] == WEATHER["name"]
    assert json.loads(call["function"]["arguments"]) == WEATHER["arguments"]
    parser, sent, calls = get_tool_parser(name)(TOOLS), "", []
    for i in range(0, len(text), 3):  # three characters a delta
        out, new = parser.stream(text[:i + 3], i + 3 >= len(text))
        sent, calls = sent + out, calls + new
    assert sent == (content or "") and len(calls) == 1
    assert json.loads(calls[0]["function"]["arguments"]) == WEATHER["arguments"]


@pytest.mark.parametrize("name", sorted(CASES))
def test_plain_text_is_content_and_streams_whole(name):
    text = "The weather in Dallas is fine; [it] is {warm}."
    parser = get_tool_parser(name)(TOOLS)
    got = parser.extract_tool_calls(text)
    assert not got.tools_called and got.content == text
    streamed = "".join(parser.stream(text[:i], i == len(text))[0]
                       for i in range(1, len(text) + 1))
    assert streamed == text


def test_more_forms():
    two = get_tool_parser("llama3_json")().extract_tool_calls(
        '{"name": "a", "parameters": {"x": 1}}; {"name": "b", "arguments": {}}')
    assert [c["function"]["name"] for c in two.tool_calls] == ["a", "b"]
    new = get_tool_parser("mistral")().extract_tool_calls('hi[TOOL_CALLS]add[ARGS]{"a": 1}')
    assert new.content == "hi" and json.loads(new.tool_calls[0]["function"]["arguments"]) == \
        {"a": 1} and len(new.tool_calls[0]["id"]) == 9
    typed = get_tool_parser("qwen3_xml")(TOOLS).extract_tool_calls(
        "<tool_call><function=get_current_weather><parameter=days>3</parameter>"
        "<parameter=hourly>true</parameter><parameter=extra>{\"k\": [1]}</parameter>"
        "</function></tool_call>")
    assert json.loads(typed.tool_calls[0]["function"]["arguments"]) == \
        {"days": 3, "hourly": True, "extra": {"k": [1]}}
    llama4 = get_tool_parser("pythonic")().extract_tool_calls(
        '<|python_start|>[f(a=1, b=[2, "x"]), g()]<|python_end|>')
    assert [json.loads(c["function"]["arguments"]) for c in llama4.tool_calls] == \
        [{"a": 1, "b": [2, "x"]}, {}]
    for bad in ("<tool_call>{not json}</tool_call>", "[f(1)]"):
        assert not get_tool_parser("hermes" if "<" in bad else "pythonic")() \
            .extract_tool_calls(bad).tools_called


def test_unknown_parser_and_plugin(tmp_path):
    with pytest.raises(ValueError, match="'nope' is not known; use one of .*hermes"):
        get_tool_parser("nope")
    plugin = tmp_path / "my_parser.py"
    plugin.write_text(
        "from engine.entrypoints.openai.tool_parsers import ToolParserManager\n"
        "from engine.entrypoints.openai.tool_parsers.hermes_tool_parser import "
        "Hermes2ProToolParser\n"
        "@ToolParserManager.register_module('mine')\n"
        "class Mine(Hermes2ProToolParser):\n    start_token = '<call>'\n")
    import_tool_parser(str(plugin))
    assert issubclass(get_tool_parser("mine"), ToolParser)
    with pytest.raises(ValueError, match="no such file"):
        import_tool_parser(str(tmp_path / "missing.py"))
    (tmp_path / "broken.py").write_text("raise RuntimeError('boom')\n")
    with pytest.raises(ValueError, match="failed to import: RuntimeError: boom"):
        import_tool_parser(str(tmp_path / "broken.py"))


@pytest.mark.parametrize("flags,needle", [
    (["--tool-call-parser", "nope"], "'nope' is not known"),
    (["--enable-auto-tool-choice"], "needs --tool-call-parser"),
    (["--tool-parser-plugin", "/nonexistent.py"], "no such file"),
])
def test_serve_refuses_bad_tool_flags_at_start(tiny_model, flags, needle, capsys):  # noqa: F811
    from engine.cli import main

    assert main(["serve", str(tiny_model), "--port", "1", *flags]) == 2  # before binding
    assert needle in capsys.readouterr().err
