"""Input that is not valid gets a 400 naming the field, never a 500, and the
server goes on (issue 39): lone surrogates, chat messages without content,
/v1/responses' text that is not an object, a template that fails on the
messages' shape. The app in process, over the engine core in a thread."""
from __future__ import annotations

import asyncio

import pytest
from helpers import app_in_process

httpx = pytest.importorskip("httpx")

LOOSE_TEMPLATE = ("{% for m in messages %}{{ m['role'] + ': ' + m['content'] }}"
                  "{% if m.get('name') %}{{ ' (' + m['name'] + ')' }}{% endif %}\n{% endfor %}"
                  "{% if add_generation_prompt %}assistant:{% endif %}")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from engine.tiny_model import make_tiny_model

    path = make_tiny_model(tmp_path_factory.mktemp("m") / "tiny")
    (path / "chat_template.jinja").write_text(LOOSE_TEMPLATE)  # `+` on content, as many do
    return path


def ask(tiny, requests: list[tuple[str, str]]) -> list[httpx.Response]:
    app, llm = app_in_process(tiny)

    async def main():
        run = asyncio.ensure_future(llm.run())
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
            got = [await c.post(path, content=body, headers={"content-type": "application/json"})
                   for path, body in requests]
            got.append(await c.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2}))
        llm.shutdown()
        await run
        return got

    got = asyncio.run(main())
    assert got[-1].status_code == 200, got[-1].text[:300]  # and the server went on
    return got[:-1]


@pytest.mark.parametrize("path, body, param", [
    ("/v1/completions", '{"prompt": "a\\ud800b", "max_tokens": 2}', "prompt"),
    ("/v1/completions", '{"prompt": ["ok", "\\udfff"], "max_tokens": 2}', "prompt"),
    ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "\\ud800"}]}',
     "messages"),
    ("/v1/chat/completions",
     '{"messages": [{"role": "user", "content": [{"type": "text", "text": "\\udc00"}]}]}',
     "messages"),
    ("/tokenize", '{"prompt": "\\ud83d"}', "prompt"),
    ("/v1/responses", '{"input": "\\ud800", "max_output_tokens": 2}', "messages"),
])
def test_lone_surrogates_are_a_400_naming_the_field(tiny, path, body, param):
    (r,) = ask(tiny, [(path, body)])
    assert r.status_code == 400, r.text[:300]
    err = r.json()["error"]
    assert "surrogate" in err["message"] and err["param"] == param, err


def test_a_surrogate_pair_is_one_character_and_fine(tiny):
    (r,) = ask(tiny, [("/tokenize", '{"prompt": "\\ud83d\\ude00"}')])
    assert r.status_code == 200 and r.json()["count"] >= 1, r.text[:300]


@pytest.mark.parametrize("messages", [
    '[{"role": "user", "content": null}]',
    '[{"role": "user", "content": "hi"}, {"role": "assistant"}, {"role": "user", "content": "go"}]',
    '[{"role": "user", "content": "hi"}, {"role": "assistant", "content": null, "tool_calls": []},'
    ' {"role": "user", "content": "go"}]',
])
def test_null_or_missing_content_is_empty_text_as_upstream(tiny, messages):
    (r,) = ask(tiny, [("/v1/chat/completions", '{"messages": %s, "max_tokens": 2}' % messages)])
    assert r.status_code == 200, r.text[:300]


def test_a_template_failing_on_the_messages_shape_is_a_400(tiny):
    body = '{"messages": [{"role": "user", "content": "hi", "name": %s}], "max_tokens": 2}'
    ok, bad = ask(tiny, [("/v1/chat/completions", body % '"ann"'),
                         ("/v1/chat/completions", body % "1")])  # str + int in the template
    assert ok.status_code == 200, ok.text[:300]
    assert bad.status_code == 400 and "TypeError" in bad.json()["error"]["message"], bad.text[:300]


@pytest.mark.parametrize("text", ['"abc"', '{"format": [1]}', '[1]', '{"format": "json"}'])
def test_responses_text_must_be_an_object(tiny, text):
    (r,) = ask(tiny, [("/v1/responses", '{"input": "hi", "text": %s, "max_output_tokens": 2}'
                       % text)])
    assert r.status_code == 400 and r.json()["error"]["param"] == "text", r.text[:300]


def test_a_tokenizer_larger_than_the_model_fails_only_its_own_request(tmp_path):
    """config.json's vocab_size 400, its tokenizer 512 ids: a prompt the
    tokenizer writes with an id the model has no row for is a 400 naming the
    mismatch, and a request beside it is answered."""
    import json

    from safetensors.torch import load_file, save_file

    from engine.tiny_model import make_tiny_model

    path = make_tiny_model(tmp_path / "tiny")
    tensors = load_file(str(path / "model.safetensors"))
    for key, t in tensors.items():
        if t.shape[0] == 512 and ("embed" in key or "lm_head" in key):
            tensors[key] = t[:400].contiguous()
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    cfg = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**cfg, "vocab_size": 400}))
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(path / "tokenizer.json"))
    high = next(tok.decode([i]) for i in range(511, 400, -1) if tok.decode([i]).strip())
    assert max(tok.encode(high).ids) >= 400
    bad, = ask(path, [("/v1/completions", json.dumps({"prompt": high, "max_tokens": 2}))])
    assert bad.status_code == 400, bad.text[:300]
    assert "vocabulary has 400" in bad.json()["error"]["message"], bad.text[:300]
