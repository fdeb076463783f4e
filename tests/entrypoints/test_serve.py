"""`engine serve` end to end: a real server process on 127.0.0.1, the real
`openai` client over HTTP, answers compared with the offline LLM's greedy
output on the same model (`engine make-tiny-model`)."""
from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import REPO, free_port, wait_for_health

openai = pytest.importorskip("openai", reason="openai is a dev requirement (requirements/dev.txt)")
httpx = pytest.importorskip("httpx2", reason="httpx2 comes with openai")

# real server processes (a minute or more on a busy 2-core machine)
pytestmark = pytest.mark.slow

KEY = "test-key"
MAX_MODEL_LEN = 2048
BLOCK = 32
PROMPTS = ["Hello, how are you today?", "Tell me a story about a cat.", "one two three",
           "What is the capital of France?", "The sea is wide", "Monday morning"]


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    from engine.cli import main

    path = tmp_path_factory.mktemp("models") / "tiny"
    assert main(["make-tiny-model", str(path)]) == 0
    return path


class ServerProcess:
    def __init__(self, model: Path, *extra: str):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "0.05",
               "VLLM_CPU_OMP_THREADS_BIND": "nobind", "OMP_NUM_THREADS": "1",
               "PYTHONPATH": str(REPO)}
        self.log = open(model.parent / f"server-{self.port}.log", "w+")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "engine.cli", "serve", str(model), "--port", str(self.port),
             "--dtype", "float32", "--block-size", str(BLOCK), "--max-model-len",
             str(MAX_MODEL_LEN), *extra], env=env, stdout=self.log, stderr=subprocess.STDOUT)
        try:
            wait_for_health(self.proc, self.url, self.output)
        except AssertionError:
            self.close()
            raise

    def output(self) -> str:
        self.log.flush()
        self.log.seek(0)
        return self.log.read()[-5000:]

    def metrics(self) -> dict[str, float]:
        text = httpx.get(self.url + "/metrics", timeout=10).text
        out = {}
        for line in text.splitlines():
            m = re.match(r'^(vllm:[a-z_]+)(\{[^}]*\})? ([0-9.e+-]+)$', line)
            if m:
                labels = re.sub(r'(model_name|engine)="[^"]*",?', "", m.group(2) or "")
                out[m.group(1) + ("" if labels == "{}" else labels)] = float(m.group(3))
        return out

    def close(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


@pytest.fixture(scope="module")
def server(tiny_model):
    s = ServerProcess(tiny_model, "--api-key", KEY, "--served-model-name", "tiny", "other-name")
    yield s
    s.close()


@pytest.fixture(scope="module")
def offline(tiny_model):
    from engine.entrypoints.llm import LLM

    return LLM(model=tiny_model, dtype="float32", block_size=BLOCK, num_kv_blocks=256,
               max_model_len=MAX_MODEL_LEN, bind_threads=False)


def client(server, key=KEY):
    return openai.OpenAI(base_url=server.url + "/v1", api_key=key, max_retries=0)


def greedy(offline, prompts, max_tokens=24, **kw):
    from engine.sampling_params import SamplingParams

    outs = offline.generate(prompts, SamplingParams(temperature=0, max_tokens=max_tokens,
                                                    ignore_eos=True, **kw))
    return [o.outputs[0] for o in outs]


def chat_ids(model: Path, messages) -> list[int]:
    """The prompt as transformers renders and tokenizes it (the reference)."""
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(model)
    return list(tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                        return_dict=False))


# ---- good requests ---------------------------------------------------------------


def test_health_models_metrics(server):
    assert httpx.get(server.url + "/health").status_code == 200
    models = client(server).models.list()
    assert [m.id for m in models.data] == ["tiny", "other-name"]
    m = server.metrics()
    assert "vllm:num_requests_running" in m and "vllm:num_requests_waiting" in m


def test_completion_equals_offline_greedy(server, offline):
    want = greedy(offline, PROMPTS[:3])
    got = client(server).completions.create(model="tiny", prompt=PROMPTS[:3], max_tokens=24,
                                            temperature=0, extra_body={"ignore_eos": True})
    assert [c.text for c in sorted(got.choices, key=lambda c: c.index)] == [w.text for w in want]
    assert all(c.finish_reason == "length" for c in got.choices)
    assert got.usage.completion_tokens == 3 * 24
    assert got.usage.prompt_tokens == sum(len(offline.get_tokenizer().encode(p).ids) for p in PROMPTS[:3])


def test_completion_stream_equals_offline_greedy(server, offline):
    (want,) = greedy(offline, PROMPTS[1], 30)
    stream = client(server).completions.create(model="tiny", prompt=PROMPTS[1], max_tokens=30,
                                               temperature=0, stream=True,
                                               stream_options={"include_usage": True},
                                               extra_body={"ignore_eos": True})
    chunks = list(stream)
    assert "".join(c.choices[0].text for c in chunks if c.choices) == want.text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage.completion_tokens == 30 and not chunks[-1].choices


def test_raw_stream_ends_with_done(server):
    with httpx.stream("POST", server.url + "/v1/completions", headers={
            "Authorization": f"Bearer {KEY}"}, json={"prompt": "one two", "max_tokens": 5,
                                                      "stream": True, "temperature": 0,
                                                      "stream_options": {"include_usage": True}}
                      ) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        events = [line for line in r.iter_lines() if line]
    assert events[-1] == "data: [DONE]"
    assert json.loads(events[-2][len("data: "):])["usage"]["total_tokens"] > 5


def test_chat_equals_offline_greedy_streamed_and_not(server, offline, tiny_model):
    messages = [{"role": "system", "content": "You are a helpful assistant."},
                {"role": "user", "content": "Tell me a story about a cat."}]
    (want,) = greedy(offline, [chat_ids(tiny_model, messages)], 20)
    c = client(server)
    full = c.chat.completions.create(model="tiny", messages=messages, max_tokens=20,
                                     temperature=0, extra_body={"ignore_eos": True})
    assert full.choices[0].message.content == want.text
    assert full.choices[0].message.role == "assistant"
    assert full.usage.prompt_tokens == len(chat_ids(tiny_model, messages))
    stream = list(c.chat.completions.create(model="tiny", messages=messages, max_tokens=20,
                                            temperature=0, stream=True,
                                            stream_options={"include_usage": True},
                                            extra_body={"ignore_eos": True}))
    assert stream[0].choices[0].delta.role == "assistant"
    assert "".join(ch.choices[0].delta.content or "" for ch in stream if ch.choices) == want.text
    assert stream[-1].usage.completion_tokens == 20


def test_sampling_fields(server, offline):
    c = client(server)

    def sample(top_k=None, max_tokens=12, **kw):
        extra = {"ignore_eos": True, **({"top_k": top_k} if top_k is not None else {})}
        return c.completions.create(model="tiny", prompt=PROMPTS[0], max_tokens=max_tokens,
                                    extra_body=extra, **kw).choices

    a, b = sample(temperature=1.0, seed=5), sample(temperature=1.0, seed=5)
    assert a[0].text == b[0].text  # a seed makes sampling repeatable across requests
    (g,) = greedy(offline, PROMPTS[0], 12)
    assert sample(temperature=0.8, top_k=1, seed=1)[0].text == g.text
    assert sample(temperature=0.8, top_p=1e-6, seed=1)[0].text == g.text
    n3 = sample(temperature=1.0, n=3, seed=7)  # (greedy with n > 1 is a 400, as upstream)
    assert sorted(ch.index for ch in n3) == [0, 1, 2] and len({ch.text for ch in n3}) > 1
    word = g.text.strip()[2:6]
    stopped = sample(temperature=0, stop=[word])[0]
    assert stopped.finish_reason == "stop" and word not in stopped.text
    assert g.text.startswith(stopped.text)
    short = sample(temperature=0, max_tokens=3)
    assert short[0].finish_reason == "length"


def test_64_concurrent_streaming_clients(server, offline):
    prompts = [f"{PROMPTS[i % len(PROMPTS)]} {i}" for i in range(64)]
    want = [w.text for w in greedy(offline, prompts, 16)]

    async def one(c, prompt):
        stream = await c.completions.create(model="tiny", prompt=prompt, max_tokens=16,
                                            temperature=0, stream=True,
                                            extra_body={"ignore_eos": True})
        return "".join([ch.choices[0].text async for ch in stream if ch.choices])

    async def all_of_them():
        c = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0,
                               timeout=300)
        try:
            return await asyncio.gather(*(one(c, p) for p in prompts))
        finally:
            await c.close()

    assert asyncio.run(all_of_them()) == want


def _wait_idle(server, deadline_s=120) -> dict:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        m = server.metrics()
        if m["vllm:num_requests_running"] == 0 and m["vllm:num_requests_waiting"] == 0:
            return m
        time.sleep(0.05)
    raise AssertionError("the server did not go idle")


def _finished(metrics: dict) -> float:
    return sum(v for k, v in metrics.items() if k.startswith("vllm:request_success_total"))


@pytest.mark.parametrize("stream", [True, False])
def test_dropped_client_frees_its_blocks(server, stream):
    before = _wait_idle(server)
    body = {"prompt": "one two three", "max_tokens": MAX_MODEL_LEN - 8, "stream": stream,
            "temperature": 0, "ignore_eos": True}
    auth = {"Authorization": f"Bearer {KEY}"}
    if stream:
        with httpx.stream("POST", server.url + "/v1/completions", headers=auth, json=body,
                          timeout=60) as r:
            lines = r.iter_lines()
            got = [next(lines) for _ in range(3)]  # a few tokens in: the request is running
            assert all(g.startswith("data: ") or not g for g in got)
            assert server.metrics()["vllm:kv_cache_usage_perc"] > 0
    else:  # the client gives up waiting for the whole answer, once it is running
        import socket

        payload = json.dumps(body).encode()
        with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
            sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                         b"Content-Type: application/json\r\n"
                         + f"Authorization: Bearer {KEY}\r\n".encode()
                         + f"Content-Length: {len(payload)}\r\n\r\n".encode() + payload)
            deadline = time.monotonic() + 30
            while server.metrics()["vllm:num_requests_running"] == 0:
                assert time.monotonic() < deadline, "the request never started running"
                time.sleep(0.01)
    # the connection is closed: the request must be aborted, not run to its end
    after = _wait_idle(server)
    assert after["vllm:kv_cache_usage_perc"] == 0
    # (had it run to its end, it would be counted as finished with reason "length")
    assert _finished(after) == _finished(before), "the dropped request ran to its end"


def test_engine_complete_and_chat_clients(server, capsys):
    from engine.cli import main

    url = server.url + "/v1"

    def generated(args) -> float:
        """Tokens the server generated for one client command (which sample at the
        server's default temperature, so the text itself may be empty: an EOS first)."""
        before = server.metrics()["vllm:generation_tokens_total"]
        assert main(args) == 0
        assert capsys.readouterr().out.endswith("\n")
        return server.metrics()["vllm:generation_tokens_total"] - before

    assert 1 <= generated(["complete", "--url", url, "--api-key", KEY, "-q", "one two",
                           "--max-tokens", "5"]) <= 5
    assert 1 <= generated(["chat", "--url", url, "--api-key", KEY, "-q", "Hello",
                           "--max-tokens", "5", "--model-name", "other-name"]) <= 5
    assert main(["chat", "--url", url, "--api-key", "wrong", "-q", "Hello"]) == 2
    assert "401" in capsys.readouterr().err
    assert main(["complete", "--url", f"http://127.0.0.1:{free_port()}/v1", "-q", "x"]) == 2
    assert "no server answers at" in capsys.readouterr().err


def test_metrics_count_tokens_and_latencies(server):
    before = server.metrics()
    client(server).completions.create(model="tiny", prompt="one two", max_tokens=7,
                                      temperature=0, extra_body={"ignore_eos": True})
    after = server.metrics()
    assert after["vllm:generation_tokens_total"] - before["vllm:generation_tokens_total"] == 7
    assert after["vllm:prompt_tokens_total"] > before["vllm:prompt_tokens_total"]
    assert after["vllm:time_to_first_token_seconds_count"] == \
        before["vllm:time_to_first_token_seconds_count"] + 1
    assert after["vllm:inter_token_latency_seconds_count"] == \
        before["vllm:inter_token_latency_seconds_count"] + 6


# ---- bad requests ----------------------------------------------------------------


def _error(fn, exc_type, status: int, needle: str):
    with pytest.raises(exc_type) as info:
        fn()
    assert info.value.status_code == status
    body = info.value.body
    assert isinstance(body, dict) and needle in body["message"], body
    assert "Traceback" not in json.dumps(body)


def test_bad_requests_get_openai_errors(server):
    c = client(server)
    _error(lambda: client(server, key="wrong").models.list(), openai.AuthenticationError, 401,
           "API key")
    _error(lambda: c.completions.create(model="nope", prompt="x"), openai.NotFoundError, 404,
           "`nope` does not exist")
    _error(lambda: c.completions.create(model="tiny", prompt="x", temperature=-1),
           openai.BadRequestError, 400, "temperature")
    _error(lambda: c.completions.create(model="tiny", prompt="x", max_tokens=MAX_MODEL_LEN + 1),
           openai.BadRequestError, 400, "cannot be greater than max_model_len")
    _error(lambda: c.completions.create(model="tiny", prompt="one " * MAX_MODEL_LEN),
           openai.BadRequestError, 400, "the model's context is")
    _error(lambda: c.completions.create(model="tiny", prompt=[10**9]),
           openai.BadRequestError, 400, "token ids must be integers")
    _error(lambda: c.completions.create(model="tiny", prompt="x", suffix="y"),
           openai.BadRequestError, 400, "suffix is not supported")
    _error(lambda: c.chat.completions.create(model="tiny", messages=[]),
           openai.BadRequestError, 400, "messages")
    _error(lambda: c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "http://x"}}]}]),
        openai.BadRequestError, 400, "only text parts")
    auth = {"Authorization": f"Bearer {KEY}"}
    r = httpx.post(server.url + "/v1/completions", content=b"{not json", headers={
        **auth, "content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["code"] == 400
    r = httpx.get(server.url + "/v1/nothing-here", headers=auth)
    assert r.status_code == 404 and r.json()["error"]["type"] == "NotFoundError"
    r = httpx.get(server.url + "/v1/completions", headers=auth)
    assert r.status_code == 405 and "error" in r.json()
    assert httpx.get(server.url + "/health").status_code == 200  # still serving


def test_no_chat_template_is_a_clear_400(tiny_model, tmp_path):
    bare = tmp_path / "bare"
    shutil.copytree(tiny_model, bare)
    cfg = json.loads((bare / "tokenizer_config.json").read_text())
    del cfg["chat_template"]
    (bare / "tokenizer_config.json").write_text(json.dumps(cfg))
    s = ServerProcess(bare)
    try:
        c = client(s, key="none")
        _error(lambda: c.chat.completions.create(model=str(bare), messages=[
            {"role": "user", "content": "hi"}]), openai.BadRequestError, 400, "no chat template")
        assert c.completions.create(model=str(bare), prompt="hi", max_tokens=2).choices
    finally:
        s.close()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_stops_the_server_cleanly(tiny_model, sig):
    """uvicorn and the engine client's reader share the main thread's event loop
    (engine.core.async_llm.AsyncLLM.run; the core steps in a process of its
    own), and uvicorn re-raises the signals it caught on its way out, so the
    server's own handlers must take them: a request under way when the signal
    comes still ends, then it exits 0 (the core stopped), no traceback."""
    s = ServerProcess(tiny_model)
    try:
        c = client(s, key="none")
        stream = c.completions.create(model=str(tiny_model), prompt="one two", max_tokens=300,
                                      stream=True, extra_body={"ignore_eos": True})
        next(iter(stream))
        s.proc.send_signal(sig)
        assert sum(1 for _ in stream) > 0
        assert s.proc.wait(timeout=30) == 0, s.output()
        assert "Traceback" not in s.output()
    finally:
        s.close()
