"""`engine serve` as upstream vLLM serves: requests that used to stop the server,
the sampling API through the `openai` SDK's typed responses, streams the
SDK's naive loop reads, the text's separator, and upstream's small routes.
A real server process on 127.0.0.1 (tests/entrypoints/test_serve.py's)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from helpers import REPO
from test_serve import KEY, PROMPTS, ServerProcess, client, tiny_model  # noqa: F401

openai = pytest.importorskip("openai", reason="openai is a dev requirement (requirements/dev.txt)")
httpx = pytest.importorskip("httpx2", reason="httpx2 comes with openai")

pytestmark = pytest.mark.slow
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def server(tiny_model):  # noqa: F811 - the fixture above
    s = ServerProcess(tiny_model, "--api-key", KEY, "--served-model-name", "tiny")
    yield s
    s.close()


@pytest.fixture(scope="module")
def tokenizer(tiny_model):  # noqa: F811
    import transformers

    return transformers.AutoTokenizer.from_pretrained(tiny_model)


def _post(server, path, body):
    return httpx.post(server.url + path, json=body, headers=AUTH, timeout=120)


def _still_serving(server):
    assert httpx.get(server.url + "/health").status_code == 200
    r = _post(server, "/v1/completions", {"prompt": "one two", "max_tokens": 2})
    assert r.status_code == 200, r.text


DEGENERATE = [  # (body, status, words in the error)
    ({"prompt": "one", "temperature": 1e-39}, 200, None),
    ({"prompt": "one", "seed": 18446744073709551617}, 400, "seed"),
    ({"prompt": "one", "seed": 2**64 - 1}, 400, "seed"),
    ({"prompt": "one", "top_k": 10**30}, 400, "top_k: Value error, must be an integer within"),
    ({"prompt": "one", "top_k": 1e308}, 400, "top_k: Value error, must be an integer within"),
    ({"prompt": "one", "top_k": 3.0, "max_tokens": 1}, 200, None),  # JSON Schema's integer
    ({"prompt": "one", "temperature": 1e6}, 400, "temperature must be in [0, 2]"),
    ({"prompt": "one", "top_p": 0}, 400, "top_p"),
    ({"prompt": "one", "top_k": -5}, 400, "top_k"),
    ({"prompt": "one", "stop_token_ids": [10**12, -3]}, 400, "stop_token_ids"),
    ({"prompt": "one", "stop_token_ids": [10**6]}, 400, "stop_token_ids: token ids must be in"),
    ({"prompt": [[1, [2]]]}, 400, "prompt: must be a string"),
    ({"prompt": [True, 3]}, 400, "prompt: must be a string"),
    ({"prompt": "one", "n": 2, "temperature": 0}, 400, "n must be 1"),
    ({"prompt": "one", "logprobs": 21}, 400, "logprobs"),
    ({"prompt": "one", "logit_bias": {"x": 1}}, 400, "logit_bias"),
    ({"prompt": "one", "min_tokens": 9, "max_tokens": 3}, 400, "min_tokens"),
    ({"prompt": "one", "stream_options": {"include_usage": True}}, 400, "stream_options"),
    ({"prompt": "one", "suffix": "x"}, 400, "suffix"),
    ({"prompt": "one", "response_format": {"type": "yaml"}}, 400, "response_format"),
]


@pytest.mark.parametrize("body, status, needle", DEGENERATE,
                         ids=[json.dumps(b)[:50] for b, _, _ in DEGENERATE])
def test_degenerate_completions_never_stop_the_server(server, body, status, needle):
    r = _post(server, "/v1/completions", {"max_tokens": 3, **body})
    assert r.status_code == status, r.text
    if needle:
        err = r.json()["error"]
        assert needle in err["message"] and "\n" not in err["message"], err
    _still_serving(server)


@pytest.mark.parametrize("body, needle", [
    ({"chat_template_kwargs": {"messages": []}}, "chat_template_kwargs may not set messages"),
    ({"max_completion_tokens": 10**6}, "cannot be greater than max_model_len"),
    ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "--enable-auto-tool-choice"),
    ({"tool_choice": "auto"}, "tool_choice"),
    ({"top_logprobs": 2}, "top_logprobs: only with logprobs"),
    ({"response_format": {"type": "json_schema"}}, "response_format"),
])
def test_degenerate_chats_are_400(server, body, needle):
    r = _post(server, "/v1/chat/completions",
              {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, **body})
    assert r.status_code == 400 and needle in r.json()["error"]["message"], r.text
    _still_serving(server)


def test_seeds_do_not_collide(server):
    c = client(server)

    def text(seed):
        return c.completions.create(model="tiny", prompt=PROMPTS[0], max_tokens=12, seed=seed,
                                    temperature=1.0, extra_body={"ignore_eos": True}
                                    ).choices[0].text

    top = text(2**63 - 1)
    assert top == text(2**63 - 1) and top != text(-(2**63)) and top != text(0)


def test_the_sdk_naive_stream_loop_and_usage_only_when_asked(server):
    c = client(server)
    stream = c.chat.completions.create(model="tiny", messages=[{"role": "user",
                                                                "content": "hi"}],
                                       max_tokens=5, stream=True)
    for chunk in stream:  # the SDK's own example: raises IndexError on a choice-less chunk
        chunk.choices[0].delta.content
    chunks = list(c.completions.create(model="tiny", prompt="one", max_tokens=4, stream=True,
                                       stream_options={"include_usage": True,
                                                       "continuous_usage_stats": True},
                                       extra_body={"ignore_eos": True}))
    assert not chunks[-1].choices and chunks[-1].usage.completion_tokens == 4
    assert all(ch.usage is not None for ch in chunks)


def test_text_keeps_its_separator_in_full_streamed_and_echo(server, tokenizer):
    c = client(server)
    prompt = PROMPTS[2]
    full = c.completions.create(model="tiny", prompt=prompt, max_tokens=10, temperature=0,
                                echo=True, extra_body={"ignore_eos": True}).choices[0].text
    ids = tokenizer(prompt)["input_ids"]
    plain = c.completions.create(model="tiny", prompt=prompt, max_tokens=10, temperature=0,
                                 extra_body={"ignore_eos": True}).choices[0].text
    assert full == prompt + plain
    streamed = "".join(ch.choices[0].text for ch in c.completions.create(
        model="tiny", prompt=prompt, max_tokens=10, temperature=0, stream=True, echo=True,
        extra_body={"ignore_eos": True}) if ch.choices)
    assert streamed == full
    # echo with token ids: their decode, then the completion
    echoed = c.completions.create(model="tiny", prompt=ids, max_tokens=10, temperature=0,
                                  echo=True, extra_body={"ignore_eos": True}).choices[0].text
    assert echoed == tokenizer.decode(ids, skip_special_tokens=True) + plain


def test_logprobs_and_penalties_through_the_sdk(server, tokenizer):
    c = client(server)
    got = c.completions.create(model="tiny", prompt=PROMPTS[0], max_tokens=5, temperature=0,
                               logprobs=3, extra_body={"ignore_eos": True}).choices[0]
    lp = got.logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 5
    # each token's own decode, special ones too (as upstream's); the text skips those
    special = set(tokenizer.all_special_tokens)
    assert "".join(t for t in lp.tokens if t not in special) == got.text
    assert lp.text_offset[0] == 0
    for token, value, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert value <= 0 and top[token] == value and value == max(top.values())  # greedy
    chat = c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}],
                                     max_tokens=4, temperature=0, logprobs=True, top_logprobs=2,
                                     extra_body={"ignore_eos": True}).choices[0]
    entries = chat.logprobs.content
    assert len(entries) == 4 and all(len(e.top_logprobs) == 2 for e in entries)
    # greedy: each token is its step's best (texts of byte pieces need not join up)
    assert all(e.logprob == e.top_logprobs[0].logprob <= 0 for e in entries)
    # applied, not ignored: each changes the greedy answer
    (g,) = greedy_texts(c, {})
    for extra in ({"repetition_penalty": 2.0}, {"frequency_penalty": 2.0},
                  {"presence_penalty": 2.0}, {"logit_bias": {"5": 100}}):
        assert greedy_texts(c, extra) != [g], extra
    assert greedy_texts(c, {"logit_bias": {"5": 100}})[0][0] == tokenizer.decode([5] * 32)


def greedy_texts(c, extra):
    """The greedy answer's text and its tokens' logprobs (tokens may decode alike)."""
    got = c.completions.create(model="tiny", prompt=PROMPTS[0], max_tokens=32, temperature=0,
                               logprobs=0, extra_body={"ignore_eos": True, **extra}).choices[0]
    return [(got.text, got.logprobs.token_logprobs)]


def test_upstreams_small_routes(server, tokenizer):
    u = server.url
    assert httpx.get(u + "/ping").status_code == 200 and httpx.post(u + "/ping").status_code == 200
    assert httpx.get(u + "/version").json()["version"]
    assert httpx.get(u + "/load").json() == {"server_load": 0}
    assert httpx.get(u + "/docs").status_code == 200
    schema = httpx.get(u + "/openapi.json").json()
    assert "/v1/completions" in schema["paths"] and "/v1/chat/completions" in schema["paths"]
    ids = httpx.post(u + "/tokenize", json={"prompt": "one two"}).json()
    assert ids["tokens"] == tokenizer("one two")["input_ids"] and ids["count"] == len(ids["tokens"])
    text = httpx.post(u + "/detokenize", json={"tokens": ids["tokens"]}).json()["prompt"]
    assert text == tokenizer.decode(ids["tokens"], skip_special_tokens=True)
    assert httpx.post(u + "/detokenize", json={"tokens": [10**9]}).status_code == 400
    # an answer of more ids than one slice of serving_tokens.tokens_json: the same JSON
    long = "one two three " * 12_000
    got = httpx.post(u + "/tokenize", json={"prompt": long}, timeout=60).json()
    want = tokenizer(long)["input_ids"]
    assert len(want) > 2 * 16384 and got["tokens"] == want and got["count"] == len(want)


def test_tokens_json_is_the_answer_json_writes():
    import json

    from engine.entrypoints.openai import serving_tokens

    for n in (0, 1, serving_tokens.LONG_ANSWER_IDS, 2 * serving_tokens.LONG_ANSWER_IDS + 3):
        ids = list(range(n))
        assert json.loads(serving_tokens.tokens_json(ids, 77)) == {
            "count": n, "max_model_len": 77, "tokens": ids, "token_strs": None}


def test_a_port_in_use_is_one_line_and_exit_1(tiny_model, server):  # noqa: F811
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "0.05", "VLLM_CPU_OMP_THREADS_BIND": "nobind",
           "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    res = subprocess.run([sys.executable, "-m", "engine.cli", "serve", str(tiny_model),
                          "--port", str(server.port), "--dtype", "float32",
                          "--max-model-len", "256"], env=env, capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 1, res.stderr
    assert "Traceback" not in res.stderr + res.stdout
    assert f"{server.port}" in res.stderr and "address already in use" in res.stderr, res.stderr


def _fuzz_bodies():
    from hypothesis import strategies as st

    anything = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70),
                         st.floats(allow_nan=False, allow_infinity=False),  # JSON has neither
                         st.text(max_size=8),
                         st.lists(st.integers(-5, 10**6), max_size=4))

    def mostly(plausible):  # an out-of-type value one time in four
        return st.sampled_from(range(4)).flatmap(lambda i: anything if i == 0 else plausible)

    ids = st.lists(st.integers(-1, 600), max_size=4)
    fields = {"temperature": st.floats(0, 2.5), "top_p": st.floats(0, 1.2),
              "top_k": st.integers(-2, 600), "min_p": st.floats(0, 1.1),
              "seed": st.integers(-2**64, 2**64), "n": st.integers(-1, 3),
              "stop": st.lists(st.text(max_size=3), max_size=2), "stop_token_ids": ids,
              "presence_penalty": st.floats(-3, 3), "frequency_penalty": st.floats(-3, 3),
              "repetition_penalty": st.floats(-0.5, 3),
              "logit_bias": st.dictionaries(st.integers(-1, 600).map(str),
                                            st.floats(-1e3, 1e3), max_size=2),
              "min_tokens": st.integers(-1, 6), "logprobs": st.integers(-1, 22),
              "echo": st.booleans(), "stream": st.booleans(), "ignore_eos": st.booleans()}
    prompt = mostly(st.one_of(st.text(max_size=20), ids, st.lists(ids, max_size=2)))
    # a few fields at a time: with all of them, one is nearly always invalid (a 400
    # before the others are looked at)
    return st.lists(st.sampled_from(sorted(fields)), max_size=3, unique=True).flatmap(
        lambda keys: st.fixed_dictionaries({"max_tokens": st.integers(1, 4), "prompt": prompt,
                                            **{k: mostly(fields[k]) for k in keys}}))


def test_random_requests_never_get_a_5xx(server):
    """Random bodies, every field of any JSON type: 200 or 400, never a 5xx, and
    the server answers a plain request after them."""
    from hypothesis import HealthCheck, given, settings

    @settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck))
    @given(_fuzz_bodies())
    def check(body):
        r = _post(server, "/v1/completions", body)
        assert r.status_code in (200, 400), (body, r.status_code, r.text)
        if r.status_code == 400:
            assert "\n" not in r.json()["error"]["message"]

    check()
    _still_serving(server)
