"""Limits where the work is cheap to refuse (no model): a request body over the
limit answered 413 before it is read, a prompt too long for the context
however it tokenizes, and chat templates that loop, recurse or grow without
end refused in seconds, while real templates render as transformers renders them."""
from __future__ import annotations

import asyncio
import json
import socket
import threading
import time

import httpx
import jinja2
import jinja2.ext
import pytest
from fastapi import FastAPI, Request
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers

from engine.entrypoints import chat_utils
from engine.entrypoints.openai.request_limits import (BodySizeLimit, default_max_body_bytes,
                                                      max_token_bytes,
                                                      prompt_surely_too_long)

LIMIT = 1024


def _app(calls: list) -> BodySizeLimit:
    app = FastAPI()

    @app.post("/echo")
    async def echo(request: Request):
        calls.append(1)
        return {"bytes": len(await request.body())}

    return BodySizeLimit(app, max_bytes=LIMIT)


def _post(app, content) -> httpx.Response:
    async def go():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                     base_url="http://t") as http:
            return await http.post("/echo", content=content)

    return asyncio.run(go())


def _chunks(total: int, size: int = 100):
    async def gen():
        for start in range(0, total, size):
            yield b"x" * min(size, total - start)

    return gen()


def _refusal(message: str) -> dict:
    return {"error": {"message": message, "type": "RequestEntityTooLarge", "param": None,
                      "code": 413}}


def test_a_declared_length_over_the_limit_is_413_before_the_endpoint():
    calls = []
    res = _post(_app(calls), b"x" * (LIMIT + 1))
    assert res.status_code == 413
    assert res.json() == _refusal("the request body is 1025 bytes; this server takes at "
                                  "most 1024 (--max-request-body-bytes)")
    assert res.headers["connection"] == "close"
    assert calls == []


def test_a_chunked_body_over_the_limit_is_413_before_the_endpoint():
    calls = []
    res = _post(_app(calls), _chunks(10 * LIMIT))
    assert res.status_code == 413
    # refused at the chunk that crossed the limit, not after reading all of it
    assert res.json() == _refusal("the request body is at least 1100 bytes; this server "
                                  "takes at most 1024 (--max-request-body-bytes)")
    assert calls == []


@pytest.mark.parametrize("chunked", [False, True])
def test_a_body_at_the_limit_reaches_the_endpoint_whole(chunked):
    calls = []
    res = _post(_app(calls), _chunks(LIMIT) if chunked else b"x" * LIMIT)
    assert res.status_code == 200 and res.json() == {"bytes": LIMIT}
    assert calls == [1]


def test_lifespan_and_websocket_pass_through():
    seen = []

    async def app(scope, receive, send):
        seen.append(scope["type"])

    limited = BodySizeLimit(app, max_bytes=1)
    for kind in ("lifespan", "websocket"):
        asyncio.run(limited({"type": kind, "headers": [(b"content-length", b"99")]},
                            None, None))
    assert seen == ["lifespan", "websocket"]


@pytest.fixture(scope="module")
def served():
    """The middleware on a real uvicorn (its own framing of Content-Length and
    chunked bodies), on a free loopback port."""
    import uvicorn

    calls = []
    server = uvicorn.Server(uvicorn.Config(_app(calls), log_level="warning", lifespan="off"))
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.02)
    yield sock.getsockname()[1], calls
    server.should_exit = True
    thread.join(10)
    sock.close()


def _raw(port: int, head: bytes, body: bytes) -> tuple[int, dict]:
    """One request (small enough to sit in the socket's buffers whole), the
    answer's status and JSON read until the server closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
        conn.sendall(b"POST /echo HTTP/1.1\r\nHost: t\r\nConnection: close\r\n" + head
                     + b"\r\n" + body)
        answer = b""
        while chunk := conn.recv(65536):
            answer += chunk
    status = int(answer.split(b" ", 2)[1])
    return status, json.loads(answer.split(b"\r\n\r\n", 1)[1])


def _chunked(total: int, size: int = 500) -> bytes:
    sizes = [min(size, total - start) for start in range(0, total, size)]
    return b"".join(b"%x\r\n%s\r\n" % (n, b"x" * n) for n in sizes) + b"0\r\n\r\n"


def test_uvicorn_answers_413_for_either_framing(served):
    port, calls = served
    before = len(calls)
    status, body = _raw(port, b"Content-Length: 4000\r\n", b"x" * 4000)
    assert status == 413 and "is 4000 bytes" in body["error"]["message"]
    status, body = _raw(port, b"Transfer-Encoding: chunked\r\n", _chunked(4000))
    # uvicorn may hand over several chunks at once: refused at the one that crossed
    assert status == 413 and "is at least" in body["error"]["message"]
    assert len(calls) == before
    assert _raw(port, b"Transfer-Encoding: chunked\r\n", _chunked(LIMIT)) == (
        200, {"bytes": LIMIT})
    assert _raw(port, b"Content-Length: 10\r\n", b"x" * 10) == (200, {"bytes": 10})


def test_the_default_body_limit_holds_a_context_of_escaped_text():
    assert default_max_body_bytes(2048) >= 1 << 20
    # a full context of CJK, which a client's json.dumps escapes to 6 bytes a character
    cjk = json.dumps({"prompt": "\u4e2d" * 2 * 131072})
    assert len(cjk) < default_max_body_bytes(131072)


# ---- prompts too long however they tokenize ------------------------------------

def _byte_level_bpe(normalizer=None) -> Tokenizer:
    """GPT-2 style: the byte alphabet ("Ġ" is a space), a merged run of eight
    spaces (16 bytes as spelled in the vocabulary, 8 as text), "Ã©" for "é" and
    eight A's."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {c: i for i, c in enumerate(alphabet)}
    merges = [("Ġ", "Ġ"), ("ĠĠ", "ĠĠ"), ("ĠĠĠĠ", "ĠĠĠĠ"), ("Ã", "©"), ("A", "A"),
              ("AA", "AA"), ("AAAA", "AAAA")]
    for a, b in merges:
        vocab[a + b] = len(vocab)
    tok = Tokenizer(models.BPE(vocab, merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    if normalizer is not None:
        tok.normalizer = normalizer
    return tok


def _llama2_style() -> Tokenizer:
    """SentencePiece-style BPE: "▁" for spaces, byte fallback for the rest."""
    vocab = {"<unk>": 0, **{f"<0x{b:02X}>": 1 + b for b in range(256)}}
    for piece in ["▁", "h", "e", "l", "o", "w", "r", "d", "▁h", "▁he", "▁hel", "▁hell",
                  "▁hello", "▁w", "▁wo", "▁wor", "▁worl", "▁world"]:
        vocab.setdefault(piece, len(vocab))
    merges = [("▁", "h"), ("▁h", "e"), ("▁he", "l"), ("▁hel", "l"), ("▁hell", "o"),
              ("▁", "w"), ("▁w", "o"), ("▁wo", "r"), ("▁wor", "l"), ("▁worl", "d")]
    tok = Tokenizer(models.BPE(vocab, merges, unk_token="<unk>", byte_fallback=True,
                               fuse_unk=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"),
                                           normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(),
                                     decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    return tok


TEXTS = ["hello world", " " * 64 + "x", "é" * 20, "AAAAAAAA" * 4, "日本語のテキスト",
         "😀 emoji 👍🏽", "mixed é 中 😀 \t\n tabs", "\x00\x01 controls"]


@pytest.mark.parametrize("make", [_byte_level_bpe, _llama2_style])
def test_max_token_bytes_bounds_every_token(make):
    tok = make()
    most = max_token_bytes(tok)
    assert most is not None
    for text in TEXTS + [t * 7 for t in TEXTS]:
        n = len(tok.encode(text).ids)
        assert len(text.encode()) <= n * most, (text, n, most)
        assert not prompt_surely_too_long(text, n, most)


def test_max_token_bytes_decodes_ids_rather_than_reading_the_vocabulary():
    most = max_token_bytes(_byte_level_bpe())
    # the longest token is eight spaces or eight A's: 8 bytes of text, while the
    # vocabulary spells the spaces in 16 ("Ġ" is 2 bytes of UTF-8)
    assert 8 <= most < 16


def test_a_normalizer_that_shrinks_text_widens_the_bound():
    tok = _byte_level_bpe(normalizers.NFKC())
    text = "\uff21" * 8  # fullwidth "Ａ", 3 bytes each: NFKC makes one 8-A token
    assert tok.encode(text).ids == [tok.token_to_id("AAAAAAAA")]
    assert not prompt_surely_too_long(text, 1, max_token_bytes(tok))


@pytest.mark.parametrize("tok", [
    Tokenizer(models.WordLevel({"a": 0, "[UNK]": 1}, unk_token="[UNK]")),
    Tokenizer(models.Unigram([("a", -1.0), ("<unk>", -2.0)], 1, False)),
    _byte_level_bpe(normalizers.Strip()),
], ids=["wordlevel-unk", "unigram-unk", "strip-normalizer"])
def test_no_bound_where_text_can_vanish_into_a_token(tok):
    assert max_token_bytes(tok) is None
    assert not prompt_surely_too_long("z" * 10_000, 1, None)


@pytest.mark.parametrize("pre", [None, pre_tokenizers.Whitespace()],
                         ids=["model-drops", "pre-tokenizer-drops"])
def test_a_bpe_that_drops_what_it_lacks_has_no_bound(pre):
    tok = Tokenizer(models.BPE({"a": 0}, []))
    if pre is not None:
        tok.pre_tokenizer = pre
    assert tok.encode("zzzz  a").ids == [0]
    assert max_token_bytes(tok) is None


def test_prompt_surely_too_long_counts_utf8_bytes():
    # 10 tokens of at most 3 bytes: 30 bytes fit
    assert not prompt_surely_too_long("x" * 30, 10, 3)
    assert prompt_surely_too_long("x" * 31, 10, 3)
    assert not prompt_surely_too_long("é" * 15, 10, 3)  # 30 bytes in 15 characters
    assert prompt_surely_too_long("é" * 16, 10, 3)
    assert not prompt_surely_too_long("😀" * 7, 10, 3)
    assert prompt_surely_too_long("😀" * 8, 10, 3)
    assert prompt_surely_too_long("\ud800" * 11, 10, 3)  # a lone surrogate from JSON
    # past a slice of a MiB of characters: 2 bytes each against a 5 MB budget
    assert not prompt_surely_too_long("é" * 2_500_000, 5_000_000, 1)
    assert prompt_surely_too_long("é" * 2_500_001, 5_000_000, 1)


def test_prompt_surely_too_long_answers_a_huge_string_by_its_length():
    assert prompt_surely_too_long("x" * 50_000_000, 4096, 64)


# ---- chat templates that never end ---------------------------------------------

MESSAGES = [{"role": "system", "content": "Be brief. Ünïcode ok"},
            {"role": "user", "content": "  Hello?  "},
            {"role": "assistant", "content": "Hi."}, {"role": "user", "content": "Again"}]
TOKENS = {"bos_token": "<s>", "eos_token": "</s>"}
LOOP = "{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}"

NEVER_ENDING = {
    "loop-writing": LOOP,
    "loop-silent": "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}"
                   "{% endfor %}",
    "loop-over-messages": "{% for i in range(100000) %}{% for j in range(100000) %}"
                          "{% for m in messages %}{% endfor %}{% endfor %}{% endfor %}",
    "macro-recursing": "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
    # nothing but calls: 2 ** 60 of them, none deeper than 60
    "macro-branching": "{% macro f(s) %}{% if s %}{{ f(s[1:]) }}{{ f(s[1:]) }}{% endif %}"
                       "{% endmacro %}{{ f('" + "x" * 60 + "') }}",
    # nothing but loops: no call, attribute or operator inside them
    "loop-over-a-list": "{% set big = messages * 100000 %}{% for a in big %}{% for b in big %}"
                        "{% endfor %}{% endfor %}",
    "filters-in-c": "{{ ([range(100000)] * 100000)|map('sum')|sum }}",
}


@pytest.mark.parametrize("name", sorted(NEVER_ENDING))
def test_a_template_that_never_ends_is_refused_in_time(name):
    t0 = time.monotonic()
    with pytest.raises(chat_utils.ChatTemplateError,
                       match=r"took longer than 0.3 s|recursed too deeply") as err:
        chat_utils.render(NEVER_ENDING[name], MESSAGES, timeout_s=0.3)
    assert time.monotonic() - t0 < 10
    assert str(err.value).endswith("fix the model's chat template or pass --chat-template FILE")


def test_the_default_deadline_and_its_message():
    assert chat_utils.RENDER_TIMEOUT_S == 2.0
    t0 = time.monotonic()
    with pytest.raises(chat_utils.ChatTemplateError) as err:
        chat_utils.render(LOOP, MESSAGES)
    assert time.monotonic() - t0 < 10
    assert str(err.value) == ("the chat template took longer than 2.0 s (its loops never "
                              "end?): fix the model's chat template or pass "
                              "--chat-template FILE")


# (2 ** 27 characters, where a doubling string would end unchecked: past the
# limit, yet small enough not to hurt the machine should a check be missing)
DOUBLING = ("{% set ns = namespace(s='x') %}{% for i in range(27) %}{% set ns.s = STEP %}"
            "{% endfor %}{{ ns.s|length }}")
GROWING = {
    "output": ("{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}",
               "wrote more than 8388608 characters"),
    "concat": (DOUBLING.replace("STEP", "ns.s ~ ns.s"), "built a string"),
    "plus": (DOUBLING.replace("STEP", "ns.s + ns.s"), "built a string"),
    "join": (DOUBLING.replace("STEP", "[ns.s, ns.s]|join"), "built a string"),
    "block-set": ("{% set ns = namespace(s='x') %}{% for i in range(27) %}"
                  "{% set b %}{{ ns.s }}{{ ns.s }}{% endset %}{% set ns.s = b %}{% endfor %}"
                  "{{ ns.s|length }}", "built a string"),
    "repeat": ("{{ ('x' * 100000000)|length }}", "repeats a string or list 100000000 times"),
    "power": ("{{ ((9 ** 9) ** (9 ** 9)) % 10 }}", "computes a power of more than"),
}


@pytest.mark.parametrize("name", sorted(GROWING))
def test_a_template_that_grows_without_end_is_refused(name):
    template, match = GROWING[name]
    t0 = time.monotonic()
    with pytest.raises(chat_utils.ChatTemplateError, match=match):
        chat_utils.render(template, MESSAGES, timeout_s=30)
    assert time.monotonic() - t0 < 10


def test_the_output_limit_is_a_keyword():
    assert chat_utils.MAX_RENDER_CHARS == 8 * 1024 * 1024
    tpl = "{% for i in range(10) %}{{ 'x' * 10 }}{% endfor %}"
    assert chat_utils.render(tpl, MESSAGES, max_chars=100) == "x" * 100
    with pytest.raises(chat_utils.ChatTemplateError, match="wrote more than 99 characters"):
        chat_utils.render(tpl, MESSAGES, max_chars=99)


def test_renders_in_threads_each_keep_their_own_deadline():
    took = {}

    def render(name, timeout_s):
        t0 = time.monotonic()
        with pytest.raises(chat_utils.ChatTemplateError):
            chat_utils.render(LOOP, MESSAGES, timeout_s=timeout_s)
        took[name] = time.monotonic() - t0

    threads = [threading.Thread(target=render, args=("short", 0.2)),
               threading.Thread(target=render, args=("long", 1.5))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert took["short"] < 1.5 <= took["long"], took


LLAMA3 = ("{% set loop_messages = messages %}{% for message in loop_messages %}"
          "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'"
          "+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
          "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}"
          "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>"
          "\n\n' }}{% endif %}")
# what real templates use beside loops: macros and call blocks, a recursive loop,
# loop.last/length, namespaces, ~ (with numbers and undefined), block sets with
# filters, string methods and %, slicing, selectattr/map, dictsort, tojson, range
FEATURES = """{{ bos_token }}
{%- macro box(tag) -%}[{{ tag }}:{{ caller() }}]{%- endmacro -%}
{% set ns = namespace(users=0, last='') %}
{% for m in messages[::-1] if m.role != 'system' %}
  {% set ns.users = ns.users + (1 if m['role'] == 'user' else 0) %}
  {% set ns.last = ns.last ~ m.role[0] ~ loop.index ~ nothing %}
  {% if loop.last %}{{ loop.length }} turns, {{ ns.users }} user, {{ ns.last }}{% endif %}
{% endfor %}
{% for m in messages %}
{% call box(m.role | upper) %}{{ m.content.strip() }}{% endcall %}
{% set said | trim %}  {{ "%s says %r" % (m.role, m.content.split()[0] if m.content else '') }}
{% endset %}{{ said }}{{ '' if loop.last else ' | ' }}
{% endfor %}
{{ messages | selectattr('role', 'equalto', 'user') | map(attribute='content') | join('/') }}
{% for k, v in {'b': 2, 'a': 1} | dictsort %}{{ k }}={{ v }};{% endfor %}
{{ messages[0] | tojson }} {{ range(5) | length }} {{ range(10)[2:5] | list }}
{{ "{} and {}".format(1, 'two') }} {{ 2 ** 10 }} {{ 7 % 3 }} {{ 'ab' * 3 }}
{% for item in [{'n': 'a', 'kids': [{'n': 'b', 'kids': []}]}] recursive %}
{{ item.n }}{% if item.kids %}({{ loop(item.kids) }}){% endif %}
{% endfor %}
{% filter upper %}end {{ eos_token }}{% endfilter %}
{% if add_generation_prompt %}ASSISTANT:{% endif %}"""


def _transformers_render(template: str, **variables) -> str:
    # transformers' apply_chat_template environment, plain
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = lambda x, **kw: json.dumps(x, ensure_ascii=False, **kw)
    return env.from_string(template).render(**variables)


@pytest.mark.parametrize("template", [LLAMA3, FEATURES], ids=["llama3", "features"])
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_real_templates_render_as_before(template, add_generation_prompt):
    want = _transformers_render(template, messages=MESSAGES,
                                add_generation_prompt=add_generation_prompt, **TOKENS)
    got = chat_utils.render(template, MESSAGES, add_generation_prompt=add_generation_prompt,
                            tokens=TOKENS)
    assert got == want


def test_llama3_renders_exactly():
    got = chat_utils.render(LLAMA3, MESSAGES[:2], tokens=TOKENS)
    assert got == ("<s><|start_header_id|>system<|end_header_id|>\n\nBe brief. Ünïcode ok"
                   "<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHello?<|eot_id|>"
                   "<|start_header_id|>assistant<|end_header_id|>\n\n")
