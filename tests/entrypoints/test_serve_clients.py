"""The clients people point at an OpenAI-compatible server, against
`engine serve`: the OpenAI SDK's naive streaming loops, langchain-openai and
litellm, whole and streamed; each answer is the server's own greedy one.
A real server process on 127.0.0.1 (tests/entrypoints/test_serve.py's)."""
from __future__ import annotations

import os

import pytest
from test_serve import KEY, ServerProcess, client, tiny_model  # noqa: F401

openai = pytest.importorskip("openai", reason="openai is a dev requirement (requirements/dev.txt)")

pytestmark = pytest.mark.slow
CHAT = [{"role": "user", "content": "Tell me a story about a cat."}]
GREEDY = {"temperature": 0, "max_tokens": 12}


@pytest.fixture(scope="module")
def server(tiny_model):  # noqa: F811 - the fixture above
    s = ServerProcess(tiny_model, "--api-key", KEY, "--served-model-name", "tiny")
    yield s
    s.close()


@pytest.fixture(scope="module")
def want(server):
    """The server's own greedy answers, whole: (chat text, completion text)."""
    c = client(server)
    chat = c.chat.completions.create(model="tiny", messages=CHAT, **GREEDY)
    text = c.completions.create(model="tiny", prompt="one two three", **GREEDY)
    assert chat.choices[0].message.content and text.choices[0].text
    return chat.choices[0].message.content, text.choices[0].text


def test_the_sdk_naive_streaming_loops(server, want):
    """The SDK's README loops, which index choices[0] on every chunk."""
    c = client(server)
    got = ""
    for chunk in c.chat.completions.create(model="tiny", messages=CHAT, stream=True, **GREEDY):
        got += chunk.choices[0].delta.content or ""
    assert got == want[0]
    got = ""
    for chunk in c.completions.create(model="tiny", prompt="one two three", stream=True,
                                      echo=True, **GREEDY):
        got += chunk.choices[0].text
    assert got == "one two three" + want[1]


def test_langchain_openai(server, want):
    lc = pytest.importorskip("langchain_openai", reason="a dev requirement (requirements/dev.txt)")
    common = {"base_url": server.url + "/v1", "api_key": KEY, "model": "tiny",
              "temperature": 0, "max_tokens": 12, "max_retries": 0}
    chat = lc.ChatOpenAI(**common)
    assert chat.invoke([("user", CHAT[0]["content"])]).content == want[0]
    assert "".join(part.content for part in chat.stream([("user", CHAT[0]["content"])])) \
        == want[0]
    llm = lc.OpenAI(**common)
    assert llm.invoke("one two three") == want[1]
    assert "".join(llm.stream("one two three")) == want[1]


def test_litellm(server, want, monkeypatch):
    monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no fetch at import
    litellm = pytest.importorskip("litellm", reason="a dev requirement (requirements/dev.txt)")
    common = {"model": "openai/tiny", "api_base": server.url + "/v1", "api_key": KEY,
              **GREEDY}
    r = litellm.completion(messages=CHAT, **common)
    assert r.choices[0].message.content == want[0]
    parts = litellm.completion(messages=CHAT, stream=True, **common)
    assert "".join(p.choices[0].delta.content or "" for p in parts) == want[0]
    r = litellm.text_completion(prompt="one two three", **common)
    assert r.choices[0].text == want[1]
    assert os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] == "True"
