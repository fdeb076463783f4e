"""Replays what a hostile or careless client sends against a live `engine
serve` on a tiny model, and counts what must never happen: a 5xx, an answer
slower than --hang-s (a hang), the server dying. With --check, exit 1 unless
all three are 0.

    python benchmarks/hostile.py [--check] [--url URL]

The cases (about 400): every route's fields given every wrong type and
out-of-range value; malformed, empty, non-object, deep and huge JSON; lone
surrogates and NULs; enormous counts (n, max_tokens, logprobs, stop lists,
logit_bias, 100,000 prompts or messages); odd methods, paths and headers;
then the connection level: sockets that send nothing, heads sent a byte at a
time, bodies that stop, clients that leave mid-stream. Without --url it
starts `engine serve` on a fresh tiny model itself and watches it."""
from __future__ import annotations

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [os.path.dirname(_HERE)] + [p for p in sys.path if os.path.abspath(p or ".") != _HERE]

import argparse
import json
import socket
import tempfile
import time
from pathlib import Path

BAD_VALUES = [None, True, -1, 0, 2**63, -2**63, 1e308, "x", "", [], [1, "a"], {}, {"a": 1}]
ROUTES = {
    "/v1/completions": {"prompt": "hi", "max_tokens": 4},
    "/v1/chat/completions": {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
    "/v1/responses": {"input": "hi", "max_output_tokens": 4},
    "/tokenize": {"prompt": "hi"},
    "/detokenize": {"tokens": [1, 2]},
}
FIELDS = {
    "/v1/completions": ["prompt", "max_tokens", "n", "temperature", "top_p", "top_k", "seed",
                        "stop", "logprobs", "echo", "stream", "logit_bias", "presence_penalty",
                        "frequency_penalty", "repetition_penalty", "min_tokens", "ignore_eos",
                        "stream_options", "user", "suffix", "best_of", "stop_token_ids",
                        "prompt_logprobs", "model"],
    "/v1/chat/completions": ["messages", "max_tokens", "max_completion_tokens", "n",
                             "temperature", "logprobs", "top_logprobs", "stream", "stop",
                             "response_format", "tools", "tool_choice", "chat_template_kwargs",
                             "add_generation_prompt", "model", "seed"],
    "/v1/responses": ["input", "instructions", "max_output_tokens", "temperature", "text",
                      "tools", "stream", "previous_response_id", "reasoning", "metadata"],
    "/tokenize": ["prompt", "add_special_tokens", "model"],
    "/detokenize": ["tokens", "model"],
}


def json_cases() -> list[tuple[str, str, bytes, dict]]:
    """(name, path, body, headers) of every request-level case."""
    js = {"content-type": "application/json"}
    out = []
    for path, fields in FIELDS.items():
        base = ROUTES[path]
        for field in fields:
            for value in BAD_VALUES:
                out.append((f"{path} {field}={json.dumps(value)[:20]}", path,
                            json.dumps({**base, field: value}).encode(), js))
    chat, comp = "/v1/chat/completions", "/v1/completions"
    odd = [
        (comp, b"", js), (comp, b"{", js), (comp, b"[]", js), (comp, b"null", js),
        (comp, b'"x"', js), (comp, b"1e999", js), (comp, b"[" * 100_000 + b"]" * 100_000, js),
        (comp, b'{"prompt": "hi", "prompt": 5}', js), (comp, b'{"prompt": "\\u0000\\u0000"}', js),
        (comp, b'{"prompt": "\\ud800"}', js), (comp, b'{"prompt": "\xff\xfe"}', js),
        (comp, json.dumps({"prompt": ["hi"] * 100_000}).encode(), js),
        (comp, json.dumps({"prompt": [[1, 2]] * 10_000, "max_tokens": 1}).encode(), js),
        (comp, json.dumps({"prompt": "hi", "n": 10**6}).encode(), js),
        (comp, json.dumps({"prompt": "hi", "max_tokens": 10**12}).encode(), js),
        (comp, json.dumps({"prompt": "hi", "logprobs": 10**6}).encode(), js),
        (comp, json.dumps({"prompt": "hi", "stop": ["x"] * 100_000}).encode(), js),
        (comp, json.dumps({"prompt": "hi", "stop": "y" * 1_000_000}).encode(), js),
        (comp, json.dumps({"prompt": "hi", "logit_bias": {str(i): 1 for i in range(100_000)}})
         .encode(), js),
        (comp, json.dumps({"prompt": [10**9]}).encode(), js),
        (comp, json.dumps({"prompt": [-1]}).encode(), js),
        (comp, json.dumps({"prompt": "hi"}).encode(), {"content-type": "text/plain"}),
        (comp, json.dumps({"prompt": "hi"}).encode(), {}),
        (chat, json.dumps({"messages": []}).encode(), js),
        (chat, json.dumps({"messages": [{"role": "user"}]}).encode(), js),
        (chat, json.dumps({"messages": [{"role": "user", "content": None}]}).encode(), js),
        (chat, json.dumps({"messages": [{"role": "wizard", "content": "hi"}]}).encode(), js),
        (chat, json.dumps({"messages": [{"content": "hi"}]}).encode(), js),
        (chat, json.dumps({"messages": [{"role": "user", "content": "\ud800"}]},
                          ensure_ascii=True).encode(), js),
        (chat, json.dumps({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]})
         .encode(), js),
        (chat, json.dumps({"messages": [{"role": "user", "content": "hi"}] * 100_000}).encode(),
         js),
        (chat, json.dumps({"messages": [{"role": "assistant", "tool_calls": "junk"},
                                        {"role": "user", "content": "hi"}]}).encode(), js),
        ("/v1/responses", json.dumps({"input": "hi", "text": "abc"}).encode(), js),
        ("/v1/responses", json.dumps({"input": "hi", "text": {"format": [1]}}).encode(), js),
        ("/v1/responses", json.dumps({"input": [{"type": "function_call"}]}).encode(), js),
        ("/tokenize", json.dumps({"prompt": "\ud83d"}, ensure_ascii=True).encode(), js),
        ("/v1/embeddings", json.dumps({"input": "hi"}).encode(), js),
    ]
    out += [(f"{p} {body[:30]!r}", p, body, h) for p, body, h in odd]
    return out


def raw_cases() -> list[tuple[str, bytes]]:
    """(name, raw HTTP bytes): methods, paths and headers."""
    head = lambda line, extra=b"": line + b"\r\nHost: x\r\n" + extra + b"\r\n"  # noqa: E731
    return [
        ("TRACE /", head(b"TRACE / HTTP/1.1")),
        ("DELETE /v1/completions", head(b"DELETE /v1/completions HTTP/1.1")),
        ("GET /../../etc/passwd", head(b"GET /../../etc/passwd HTTP/1.1")),
        ("GET /%2e%2e/%2e%2e/etc/passwd", head(b"GET /%2e%2e/%2e%2e/etc/passwd HTTP/1.1")),
        ("GET /v1/models?x=" + "a" * 20, head(b"GET /v1/models?" + b"x=" + b"a" * 60_000
                                               + b" HTTP/1.1")),
        ("a 100 KB header", head(b"GET /health HTTP/1.1", b"X-Big: " + b"a" * 100_000 + b"\r\n")),
        ("1000 headers", head(b"GET /health HTTP/1.1",
                              b"".join(b"X-%d: 1\r\n" % i for i in range(1000)))),
        ("bad auth", head(b"GET /v1/models HTTP/1.1", b"Authorization: Bearer \xff\xfe\r\n")),
        ("HTTP/0.9", b"GET /health\r\n\r\n"),
        ("garbage", b"\x00\x01\x02 not http at all\r\n\r\n"),
        ("content-length lies", head(b"POST /v1/completions HTTP/1.1",
                                     b"Content-Type: application/json\r\nContent-Length: 5\r\n")
         + b'{"prompt": "hi"}'),
        ("negative content-length", head(b"POST /v1/completions HTTP/1.1",
                                         b"Content-Length: -1\r\n")),
        ("chunked junk", head(b"POST /v1/completions HTTP/1.1",
                              b"Transfer-Encoding: chunked\r\n") + b"zz\r\nabc\r\n0\r\n\r\n"),
        ("GET /metrics", head(b"GET /metrics HTTP/1.1")),
        ("GET /health", head(b"GET /health HTTP/1.1")),
    ]


class Tally:
    def __init__(self, hang_s: float):
        self.hang_s, self.statuses, self.five, self.hangs = hang_s, {}, [], []

    def add(self, name: str, status: int | None, took: float) -> None:
        self.statuses[status] = self.statuses.get(status, 0) + 1
        if status is None or took > self.hang_s:
            self.hangs.append(f"{name} ({took:.1f} s)")
        elif status >= 500:
            self.five.append(f"{name}: {status}")


def send_raw(host: str, port: int, data: bytes, timeout: float) -> int | None:
    """The status of the answer to raw request bytes; 0 when the server closed
    without one (a refusal, not a hang); None when nothing came in time."""
    with socket.create_connection((host, port), timeout=timeout) as s:
        try:
            s.sendall(data)
            got = s.recv(64)
        except (TimeoutError, socket.timeout):
            return None
        except OSError:
            return 0
    if not got:
        return 0
    parts = got.split(b" ", 2)
    return int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0


def connection_cases(host: str, port: int, tally: Tally) -> None:
    """Idle sockets, a head a byte at a time, a body that stops, a client that
    leaves mid-stream: /health must answer meanwhile."""
    import httpx

    url = f"http://{host}:{port}"
    idle = [socket.create_connection((host, port)) for _ in range(200)]
    slow = socket.create_connection((host, port))
    slow.sendall(b"GET /health HTTP/1.1\r\nHo")
    stalled = socket.create_connection((host, port))
    stalled.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                    b"application/json\r\nContent-Length: 1000\r\n\r\n{\"prompt\"")
    for i in range(5):  # clients that leave mid-stream
        with httpx.stream("POST", url + "/v1/completions", timeout=30, json={
                "prompt": "hi", "max_tokens": 500, "ignore_eos": True, "stream": True}) as r:
            for _ in zip(range(3), r.iter_lines()):
                pass
    t0 = time.perf_counter()
    try:
        status = httpx.get(url + "/health", timeout=tally.hang_s).status_code
    except httpx.HTTPError:
        status = None
    tally.add("/health beside 200 idle sockets, a slow head, a stalled body, 5 left streams",
              status, time.perf_counter() - t0)
    for s in idle + [slow, stalled]:
        s.close()


def run(url: str, hang_s: float, alive) -> Tally:
    import httpx

    host, port = url.removeprefix("http://").split(":")
    tally = Tally(hang_s)
    with httpx.Client(base_url=url, timeout=hang_s + 5) as c:
        for name, path, body, headers in json_cases():
            t0 = time.perf_counter()
            try:
                status: int | None = c.post(path, content=body, headers=headers).status_code
            except httpx.TimeoutException:
                status = None
            except httpx.HTTPError:
                status = 0  # closed without an answer
            tally.add(name, status, time.perf_counter() - t0)
            if not alive():
                return tally
    for name, data in raw_cases():
        t0 = time.perf_counter()
        tally.add(name, send_raw(host, int(port), data, hang_s + 5), time.perf_counter() - t0)
    connection_cases(host, int(port), tally)
    return tally


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", help="a running server (default: start engine serve on a tiny model)")
    p.add_argument("--hang-s", type=float, default=30.0, help="an answer slower than this hangs")
    p.add_argument("--check", action="store_true", help="exit 1 on any 5xx, hang or death")
    a = p.parse_args(argv)
    server = None
    with tempfile.TemporaryDirectory() as tmp:
        url = a.url
        if url is None:
            from benchmarks.serve import Served, free_port
            from engine.tiny_model import make_tiny_model

            model = make_tiny_model(Path(tmp) / "tiny")
            port = free_port()
            server = Served([sys.executable, "-m", "engine.cli", "serve", str(model), "--port",
                             str(port), "--max-model-len", "512", "--uvicorn-log-level",
                             "warning"], {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "0.1"}, port,
                            Path(tmp) / "serve.log")
            url = server.url
        alive = (lambda: server.proc.poll() is None) if server else (lambda: True)
        try:
            tally = run(url, a.hang_s, alive)
            died = 0 if alive() else 1
        finally:
            if server is not None:
                server.close()
    cases = sum(tally.statuses.values())
    print(f"{cases} hostile requests: statuses {dict(sorted(tally.statuses.items(), key=str))}")
    print(f"5xx: {len(tally.five)}, hangs (> {a.hang_s:.0f} s): {len(tally.hangs)}, "
          f"deaths: {died}")
    for line in (tally.five + tally.hangs)[:20]:
        print(f"  {line}")
    return 1 if a.check and (tally.five or tally.hangs or died) else 0


if __name__ == "__main__":
    sys.exit(main())
