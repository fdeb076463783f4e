"""/v1/responses through the OpenAI SDK's typed client, the app in process:
text in, text out, whole and streamed, equal to the chat completion of the
same messages; what it does not implement is a 400 naming it."""
from __future__ import annotations

import asyncio

import pytest
from helpers import app_in_process

openai = pytest.importorskip("openai", reason="openai is a dev requirement (requirements/dev.txt)")
httpx = pytest.importorskip("httpx2", reason="httpx2 comes with openai")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from engine.tiny_model import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("m") / "tiny")


def test_responses_whole_and_streamed_equal_the_chat_answer(tiny):
    app, llm = app_in_process(tiny)
    greedy = {"model": "tiny", "temperature": 0}
    messages = [{"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Tell me a story"}]

    async def main():
        run = asyncio.ensure_future(llm.run())
        http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t")
        c = openai.AsyncOpenAI(base_url="http://t/v1", api_key="x", http_client=http,
                               max_retries=0)
        chat = await c.chat.completions.create(messages=messages, max_tokens=12, **greedy)
        whole = await c.responses.create(instructions="Be brief.", input="Tell me a story",
                                         max_output_tokens=12, **greedy)
        parts = await c.responses.create(
            input=[{"role": "system", "content": "Be brief."},
                   {"role": "user", "content": [{"type": "input_text",
                                                 "text": "Tell me a story"}]}],
            max_output_tokens=12, stream=True, **greedy)
        events = [e async for e in parts]
        refused = []
        for extra in ({"previous_response_id": "resp_1"}, {"tools": [{"type": "web_search"}]},
                      {"text": {"format": {"type": "yaml"}}}, {"use_beam_search": True}):
            try:
                await c.responses.create(input="hi", extra_body=extra, **greedy)
            except openai.BadRequestError as exc:
                refused.append(exc.body)
        odd = await http.post("/v1/responses", json={"input": [{"type": "function_call"}]})
        llm.shutdown()
        await run
        return chat, whole, events, refused, odd

    chat, whole, events, refused, odd = asyncio.run(main())
    want = chat.choices[0].message.content
    assert want and whole.output_text == want
    assert whole.status == ("incomplete" if chat.choices[0].finish_reason == "length"
                            else "completed")
    assert whole.usage.input_tokens == chat.usage.prompt_tokens
    assert whole.usage.output_tokens == chat.usage.completion_tokens
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress",
                         "response.output_item.added", "response.content_part.added"]
    assert kinds[-4:-1] == ["response.output_text.done", "response.content_part.done",
                            "response.output_item.done"]
    assert kinds[-1] in ("response.completed", "response.incomplete")
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == want
    assert events[-1].response.output_text == want
    assert [r["param"] for r in refused] == ["previous_response_id", "tools", "text",
                                              "use_beam_search"]
    assert odd.status_code == 400 and odd.json()["error"]["param"] == "input"
