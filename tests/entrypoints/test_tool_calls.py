"""Tool calling against `engine serve` on the tiny random model, with the real
OpenAI SDK, LangChain and litellm: tool_choice required and named hold on random
weights (structured outputs make the answer calls), auto reads the model's
text with the --tool-call-parser (a plugin's here, a hermes subclass: the
server is conftest's agent_server), each
whole and streamed; histories with tool calls and tool results are taken."""
from __future__ import annotations

import json
from typing import Literal

import pytest
from test_serve import client

openai = pytest.importorskip("openai", reason="openai is a dev requirement (requirements/dev.txt)")
jsonschema = pytest.importorskip("jsonschema", reason="a dev requirement (requirements/dev.txt)")
pytest.importorskip("xgrammar", reason="a runtime requirement (requirements/common.txt)")
from pydantic import BaseModel, Field  # noqa: E402

pytestmark = pytest.mark.slow

class Weather(BaseModel):
    city: Literal["Paris", "Oslo", "Lima"]
    unit: Literal["celsius", "fahrenheit"]


class Add(BaseModel):
    a: int = Field(ge=0, le=999)
    b: int = Field(ge=0, le=999)


def _tool(name, model):
    return {"type": "function", "function": {"name": name, "description": name,
                                             "parameters": model.model_json_schema()}}


TOOLS = [_tool("get_weather", Weather), _tool("add", Add)]
SCHEMAS = {"get_weather": Weather.model_json_schema(), "add": Add.model_json_schema()}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
SAMPLED = {"temperature": 1.0, "seed": 3}


@pytest.fixture
def server(agent_server):  # one server with tests/engine/test_structured_outputs.py (conftest)
    return agent_server


def _valid(call) -> None:
    name = call.function.name
    jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[name])


def test_required_and_named_hold_100_of_100(server):
    c = client(server)
    r = c.chat.completions.create(model="tiny", messages=ASK, tools=TOOLS, n=100,
                                  tool_choice="required", parallel_tool_calls=False,
                                  max_tokens=120, **SAMPLED)
    names = set()
    for ch in r.choices:
        assert ch.finish_reason == "tool_calls" and len(ch.message.tool_calls) == 1, ch.message
        _valid(ch.message.tool_calls[0])
        names.add(ch.message.tool_calls[0].function.name)
    assert names == {"get_weather", "add"}  # random weights pick both
    r = c.chat.completions.create(model="tiny", messages=ASK, tools=TOOLS, n=20,
                                  tool_choice="required", max_tokens=600, **SAMPLED)
    # parallel calls: a list the random model may go on with past max_tokens
    done = [ch for ch in r.choices if ch.finish_reason == "tool_calls"]
    assert len(done) >= 10 and max(len(ch.message.tool_calls) for ch in done) > 1
    for call in (call for ch in done for call in ch.message.tool_calls):
        _valid(call)
    named = {"type": "function", "function": {"name": "add"}}
    r = c.chat.completions.create(model="tiny", messages=ASK, tools=TOOLS, n=100,
                                  tool_choice=named, max_tokens=60, **SAMPLED)
    for ch in r.choices:
        (call,) = ch.message.tool_calls
        assert call.function.name == "add" and call.id
        _valid(call)


def _streamed(c, **kw):
    calls: dict[int, dict] = {}
    content, finish = "", None
    for chunk in c.chat.completions.create(model="tiny", messages=ASK, tools=TOOLS,
                                           stream=True, max_tokens=120, **SAMPLED, **kw):
        delta = chunk.choices[0].delta
        content += delta.content or ""
        for d in delta.tool_calls or []:
            call = calls.setdefault(d.index, {"id": d.id, "name": "", "arguments": ""})
            call["name"] += d.function.name or "" if d.function else ""
            call["arguments"] += (d.function.arguments or "") if d.function else ""
        finish = chunk.choices[0].finish_reason or finish
    return content, list(calls.values()), finish


def test_streamed_required_named_and_auto(server):
    c = client(server)
    _, calls, finish = _streamed(c, tool_choice="required", parallel_tool_calls=False)
    assert calls and finish == "tool_calls"
    for call in calls:
        jsonschema.validate(json.loads(call["arguments"]), SCHEMAS[call["name"]])
    _, (call,), _ = _streamed(c, tool_choice={"type": "function",
                                              "function": {"name": "get_weather"}})
    assert call["name"] == "get_weather" and call["id"]
    jsonschema.validate(json.loads(call["arguments"]), SCHEMAS["get_weather"])
    # auto: the parser reads the model's own text; a regex makes the random model
    # write one hermes call after some words
    regex = r'[a-z ]{1,10}<tool_call>\{"name": "add", "arguments": \{"a": [1-9], "b": [1-9]\}\}' \
            r'</tool_call>'
    content, (call,), finish = _streamed(c, tool_choice="auto",
                                         extra_body={"structured_outputs": {"regex": regex}})
    assert finish == "tool_calls" and content and "<tool_call>" not in content
    assert call["name"] == "add" and set(json.loads(call["arguments"])) == {"a", "b"}
    whole = c.chat.completions.create(model="tiny", messages=ASK, tools=TOOLS, max_tokens=120,
                                      extra_body={"structured_outputs": {"regex": regex}},
                                      **SAMPLED)
    msg = whole.choices[0].message
    assert whole.choices[0].finish_reason == "tool_calls" and msg.content == content
    assert msg.tool_calls[0].function.arguments == call["arguments"]
    plain = c.chat.completions.create(model="tiny", messages=ASK, tools=TOOLS, max_tokens=8,
                                      **SAMPLED)  # auto, no call written: text
    assert plain.choices[0].message.tool_calls is None


def test_a_history_of_calls_and_results_is_taken(server):
    c = client(server)
    history = ASK + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {
                "name": "get_weather", "arguments": '{"city": "Paris", "unit": "celsius"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "21 degrees"},
        {"role": "assistant"}]  # no content at all
    r = c.chat.completions.create(model="tiny", messages=history[:-1], tools=TOOLS,
                                  tool_choice="none", max_tokens=4)
    assert r.choices[0].message.content is not None
    r = c.chat.completions.create(model="tiny", messages=history + [ASK[0]], max_tokens=4)
    assert r.choices[0].finish_reason in ("stop", "length")


@pytest.mark.parametrize("kw,field,needle", [
    ({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice",
     "no tool named 'nope'"),
    ({"tool_choice": "sometimes"}, "tool_choice", "sometimes"),
    ({"tool_choice": {"type": "function", "function": [None]}}, "tool_choice", '"name": ...'),
    ({"tool_choice": "required", "response_format": {"type": "json_object"}}, "tool_choice",
     "leave response_format unset"),
    ({"tools": [{"type": "function", "function": {"parameters": {}}}]}, "tools", "tools.0"),
])
def test_bad_tool_requests_are_400s(server, kw, field, needle):
    body = {"tools": TOOLS, **kw}
    with pytest.raises(openai.BadRequestError) as e:
        client(server).chat.completions.create(model="tiny", messages=ASK, max_tokens=4,
                                               **body)
    assert e.value.body["param"] == field and needle in e.value.body["message"], e.value.body


def test_vllm_fields_with_tools_and_structured_outputs(server):
    """issue 38's two halves together: a named call with the request's id,
    token ids and echo-free role; streamed, every token's id comes back even
    while the tool parser holds its text; beam search refuses what it cannot
    keep, by name, in one line."""
    c = client(server)
    named = {"type": "function", "function": {"name": "add"}}
    r = c.chat.completions.create(model="tiny", messages=ASK, tools=TOOLS, tool_choice=named,
                                  max_tokens=60, extra_body={"return_token_ids": True,
                                                             "request_id": "merged-1"},
                                  **SAMPLED)
    ch = r.choices[0]
    assert r.id == "chatcmpl-merged-1" and ch.message.role == "assistant"
    _valid(ch.message.tool_calls[0])
    assert len(ch.token_ids) == r.usage.completion_tokens and r.prompt_token_ids
    ids, calls = [], []
    for chunk in c.chat.completions.create(model="tiny", messages=ASK, tools=TOOLS,
                                           tool_choice="auto", max_tokens=30, stream=True,
                                           stream_options={"include_usage": True},
                                           extra_body={"return_token_ids": True}, **SAMPLED):
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            ids += getattr(choice, "token_ids", None) or []
            calls += choice.delta.tool_calls or []
    assert len(ids) == usage.completion_tokens
    for kw, needle in (({"response_format": {"type": "json_object"}}, "structured output"),
                       ({"tools": TOOLS, "tool_choice": "required"}, "structured output"),
                       ({"tools": TOOLS}, "tool calling")):
        with pytest.raises(openai.BadRequestError) as e:
            c.chat.completions.create(model="tiny", messages=ASK, max_tokens=4, n=2,
                                      extra_body={"use_beam_search": True}, **kw)
        body = e.value.body
        assert body["param"] == "use_beam_search" and needle in body["message"], body
        assert "\n" not in body["message"]
    with pytest.raises(openai.BadRequestError) as e:
        c.completions.create(model="tiny", prompt="hi", max_tokens=4,
                             extra_body={"use_beam_search": True,
                                         "structured_outputs": {"regex": "[a-z]+"}})
    assert e.value.body["param"] == "use_beam_search", e.value.body


def test_langchain_two_tool_rounds_and_structured_output(server):
    lc = pytest.importorskip("langchain_openai", reason="a dev requirement")
    from langchain_core.messages import HumanMessage, ToolMessage
    from langchain_core.tools import tool

    @tool
    def add(a: int, b: int) -> int:
        """Add two numbers."""
        return a + b

    @tool
    def weather(city: Literal["Paris", "Oslo"]) -> str:
        """The weather in a city."""
        return f"sunny in {city}"

    llm = lc.ChatOpenAI(base_url=server.url + "/v1", api_key="none", model="tiny",
                        temperature=1.0, seed=5, max_tokens=80, max_retries=0)
    tools = {"add": add, "weather": weather}
    agent = llm.bind_tools(list(tools.values()), tool_choice="any",  # "required"
                           parallel_tool_calls=False)
    messages = [HumanMessage("Add 2 and 3, then tell me the weather.")]
    for _ in range(2):  # two rounds of calls and their results
        ai = agent.invoke(messages)
        assert ai.tool_calls, ai
        messages.append(ai)
        for call in ai.tool_calls:
            result = tools[call["name"]].invoke(call["args"])  # the args fit the tool
            messages.append(ToolMessage(str(result), tool_call_id=call["id"]))
    final = llm.invoke(messages)
    assert isinstance(final.content, str)

    class City(BaseModel):
        name: Literal["Paris", "Oslo", "Lima"]
        people: int = Field(ge=0, le=10**6)

    got = llm.with_structured_output(City).invoke("A city, please.")
    assert isinstance(got, City)


def test_litellm_tool_calls_and_structured_output(server, monkeypatch):
    monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no fetch at import
    litellm = pytest.importorskip("litellm", reason="a dev requirement (requirements/dev.txt)")
    common = {"model": "openai/tiny", "api_base": server.url + "/v1", "api_key": "none",
              "messages": ASK, "max_tokens": 120, **SAMPLED}
    r = litellm.completion(tools=TOOLS, tool_choice="required", parallel_tool_calls=False,
                           **common)
    (call,) = r.choices[0].message.tool_calls
    jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])
    r = litellm.completion(response_format=Weather, **common)
    Weather.model_validate_json(r.choices[0].message.content)
