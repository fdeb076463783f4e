"""vLLM's own request fields (issue 38), through the `openai` SDK's
extra_body against a real `engine serve` on 127.0.0.1, each as vLLM 0.32
answers it on the same tiny checkpoint (compared by hand against
`vllm serve`; the rows below say where the peer's answer is the reference)."""
from __future__ import annotations

import re

import pytest

openai = pytest.importorskip("openai", reason="openai is a dev requirement (requirements/dev.txt)")
httpx = pytest.importorskip("httpx2", reason="httpx2 comes with openai")

pytestmark = pytest.mark.slow
LEN = 128  # the server's context (conftest's vllm_compat_server): max_tokens past it is cheap
PROMPT = "hello there"
LONE_BYTE = 98  # the tiny tokenizer's byte 0x80 alone: no character until more come


@pytest.fixture(scope="module")
def server(vllm_compat_server):
    return vllm_compat_server  # conftest's: context LEN, served as "tiny"


@pytest.fixture(scope="module")
def c(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)


@pytest.fixture(scope="module")
def tokenizer(server):
    import transformers

    return transformers.AutoTokenizer.from_pretrained(server.model)


def _complete(c, **extra):
    kw = {k: extra.pop(k) for k in ("max_tokens", "logprobs", "n", "stream", "temperature")
          if k in extra}
    return c.completions.create(model="tiny", prompt=extra.pop("prompt", PROMPT),
                                **{"max_tokens": 3, "temperature": 0, **kw}, extra_body=extra)


def _400(fn, needle):
    with pytest.raises(openai.BadRequestError) as info:
        fn()
    message = info.value.body["message"]
    assert needle in message and "\n" not in message, message


def test_ids_and_their_text(c, tokenizer):
    out = _complete(c, return_token_ids=True).choices[0]
    ids = tokenizer(PROMPT)["input_ids"]
    assert out.prompt_token_ids == ids and len(out.token_ids) == 3
    assert out.text == tokenizer.decode(out.token_ids).rstrip("\ufffd")  # a partial char held
    # add_special_tokens=false: no <|begin_of_text|> (it was silently added)
    plain = _complete(c, add_special_tokens=False, return_token_ids=True).choices[0]
    assert plain.prompt_token_ids == ids[1:]
    given = _complete(c, prompt=ids, add_special_tokens=False, truncate_prompt_tokens=3,
                      return_token_ids=True).choices[0]  # ids: taken as they are (was a 500)
    assert given.prompt_token_ids == ids[-3:]
    # truncate_prompt_tokens keeps the last tokens, the special ones kept (the peer: [0, 440])
    cut = _complete(c, truncate_prompt_tokens=2, return_token_ids=True).choices[0]
    assert cut.prompt_token_ids == [ids[0], ids[-1]]


def test_stop_token_ids_leave_the_token_text_out(c, tokenizer):
    ids = _complete(c, max_tokens=12, return_token_ids=True, ignore_eos=True).choices[0].token_ids
    # a stop token with text of its own (not a byte of a longer character), first seen at j
    j = next(j for j in range(1, len(ids)) if ids[j] not in ids[:j]
             and "\ufffd" not in tokenizer.decode(ids[j:j + 1]))
    out = _complete(c, max_tokens=12, stop_token_ids=[ids[j]], return_token_ids=True).choices[0]
    assert (out.finish_reason, out.stop_reason) == ("stop", ids[j])
    assert out.token_ids == ids[:j + 1]
    assert out.text == tokenizer.decode(ids[:j]).rstrip("\ufffd")
    kept = _complete(c, max_tokens=12, stop_token_ids=[ids[j]],
                     include_stop_str_in_output=True).choices[0]
    assert kept.text == tokenizer.decode(ids[:j + 1])


def test_sampling_fields(c, tokenizer):
    allowed = [5, 6, 7]
    out = _complete(c, allowed_token_ids=allowed, max_tokens=8, ignore_eos=True,
                    return_token_ids=True).choices[0]
    assert set(out.token_ids) <= set(allowed)
    first = _complete(c, return_token_ids=True).choices[0].token_ids[0]
    word = tokenizer.decode([first])
    assert tokenizer(word.lstrip(), add_special_tokens=False)["input_ids"] == [first] or \
        tokenizer(" " + word.lstrip(), add_special_tokens=False)["input_ids"] == [first]
    banned = _complete(c, bad_words=[word], return_token_ids=True).choices[0]
    assert banned.token_ids[0] != first
    # skip_special_tokens=false writes them (<|im_start|> is id 2)
    special = _complete(c, allowed_token_ids=[2], max_tokens=2, ignore_eos=True,
                        skip_special_tokens=False).choices[0]
    assert special.text == "<|im_start|><|im_start|>"
    assert _complete(c, allowed_token_ids=[2], ignore_eos=True).choices[0].text == ""
    one = _complete(c, best_of=1).choices  # best_of as upstream: >= n, one answer per n
    assert len(one) == 1 and len(_complete(c, best_of=2).choices) == 1
    _400(lambda: _complete(c, best_of=1, n=2, temperature=1), "best_of: must be >= n")



def test_beam_search_as_upstream(c):
    """Beam search keeps the n best continuations by cumulative logprob each
    step: checked against the same search done by hand with plain requests'
    logprobs (a beam of one is greedy, as the peer answers)."""
    greedy = _complete(c, return_token_ids=True, ignore_eos=True).choices[0].token_ids
    one = _complete(c, use_beam_search=True, ignore_eos=True, return_token_ids=True)
    assert [ch.token_ids for ch in one.choices] == [greedy]
    width, steps = 2, 3
    prompt = c.completions.create(model="tiny", prompt=PROMPT, max_tokens=1, extra_body={
        "return_token_ids": True}).choices[0].prompt_token_ids
    beams = [([], 0.0)]
    for _ in range(steps):
        grown = []
        for tokens, cum in beams:
            top = _complete(c, prompt=prompt + tokens, max_tokens=1, logprobs=2 * width,
                            return_tokens_as_token_ids=True).choices[0].logprobs.top_logprobs[0]
            grown += [(tokens + [int(t.split(":")[1])], cum + lp) for t, lp in top.items()]
        beams = sorted(grown, key=lambda b: b[1], reverse=True)[:width]
    out = _complete(c, use_beam_search=True, n=width, max_tokens=steps, ignore_eos=True,
                    return_token_ids=True)
    assert [ch.token_ids for ch in out.choices] == [b[0] for b in beams]
    assert out.usage.completion_tokens == width * steps


def test_beam_search_streams_its_answer(c):
    """stream=true: the beams' answer as chunks once the search ends (upstream's
    chat stream of a finished output: role chunks, then each whole text)."""
    beam = {"use_beam_search": True, "n": 2, "ignore_eos": True}
    whole = _complete(c, max_tokens=4, **beam)
    chunks = list(_complete(c, max_tokens=4, stream=True, stream_options={"include_usage": True},
                            **beam))
    assert sorted((ch.index, ch.text, ch.finish_reason) for k in chunks[:-1]
                  for ch in k.choices) == [(ch.index, ch.text, ch.finish_reason)
                                           for ch in whole.choices]
    assert chunks[-1].usage.completion_tokens == 8 and not chunks[-1].choices
    msgs = [{"role": "user", "content": PROMPT}]
    full = c.chat.completions.create(model="tiny", messages=msgs, max_tokens=4, temperature=0,
                                     extra_body=beam)
    text = ["", ""]
    for k in c.chat.completions.create(model="tiny", messages=msgs, max_tokens=4, stream=True,
                                       temperature=0, extra_body=beam):
        for ch in k.choices:
            text[ch.index] += ch.delta.content or ""
            assert ch.delta.role == "assistant" or ch.finish_reason == "length"
    assert text == [ch.message.content for ch in full.choices]


def test_logprobs_as_token_ids(c):
    lp = _complete(c, logprobs=2, return_tokens_as_token_ids=True).choices[0].logprobs
    assert all(re.fullmatch(r"token_id:\d+", t) for t in lp.tokens), lp.tokens
    assert all(re.fullmatch(r"token_id:\d+", t) for top in lp.top_logprobs for t in top)


def test_max_tokens_capped_at_the_context_and_empty_prompts(c, tokenizer):
    n = len(tokenizer(PROMPT)["input_ids"])
    out = _complete(c, max_tokens=LEN, ignore_eos=True)
    assert out.usage.completion_tokens == LEN - n and out.choices[0].finish_reason == "length"
    _400(lambda: _complete(c, max_tokens=LEN + 1), "cannot be greater than max_model_len")
    _400(lambda: _complete(c, prompt=""), "prompt: Either prompt or prompt_embeds")


def test_trailing_partial_character_is_held_back(c):
    for stream in (False, True):
        out = _complete(c, allowed_token_ids=[LONE_BYTE], ignore_eos=True, stream=stream)
        text = "".join(ch.choices[0].text for ch in out) if stream else out.choices[0].text
        assert text == "", repr(text)  # before: one U+FFFD per byte


MESSAGES = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Sure, the"}]


def test_chat_fields(c, tokenizer, server):
    base = dict(model="tiny", messages=MESSAGES, max_tokens=3, temperature=0)
    echo = c.chat.completions.create(**base, extra_body={"echo": True})
    assert echo.choices[0].message.content.startswith("Sure, the")
    cont = c.chat.completions.create(**base, extra_body={
        "continue_final_message": True, "add_generation_prompt": False, "return_token_ids": True})
    want = tokenizer.apply_chat_template(MESSAGES, continue_final_message=True, tokenize=True,
                                         return_dict=False)
    assert cont.model_extra["prompt_token_ids"] == list(want)
    _400(lambda: c.chat.completions.create(**base, extra_body={"continue_final_message": True}),
         "continue_final_message: not with add_generation_prompt")
    # /tokenize with messages renders as the chat endpoint does (transformers' reference)
    r = httpx.post(server.url + "/tokenize", json={"messages": MESSAGES[:1]}).json()
    assert r["tokens"] == list(tokenizer.apply_chat_template(
        MESSAGES[:1], add_generation_prompt=True, tokenize=True, return_dict=False))


def test_x_request_id_names_the_request(c, server):
    raw = c.completions.with_raw_response.create(
        model="tiny", prompt=PROMPT, max_tokens=2, extra_headers={"X-Request-Id": "trace-42"})
    assert raw.headers["x-request-id"] == "trace-42"
    assert raw.parse().id == "cmpl-trace-42"
    chat = c.chat.completions.with_raw_response.create(
        model="tiny", messages=MESSAGES[:1], max_tokens=2,
        extra_headers={"X-Request-Id": "trace-43"})
    assert chat.parse().id == "chatcmpl-trace-43"
