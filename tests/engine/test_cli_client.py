"""`engine complete` / `engine chat` against a stand-in OpenAI server on 127.0.0.1:
the key comes from --api-key, VLLM_API_KEY (as `engine serve` reads it) or
OPENAI_API_KEY, and a 401 is one line naming all three."""
from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from engine import cli, envs

KEY = "sekrit"


class _Handler(BaseHTTPRequestHandler):
    seen: list[str | None] = []

    def log_message(self, *a):
        pass

    def _authorised(self) -> bool:
        auth = self.headers.get("Authorization")
        self.seen.append(auth)
        if auth == f"Bearer {KEY}":
            return True
        body = json.dumps({"error": {"message": "Unauthorized", "type": "invalid_request_error",
                                     "param": None, "code": 401}}).encode()
        self.send_response(401)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        return False

    def do_GET(self):
        if not self._authorised():
            return
        body = json.dumps({"object": "list", "data": [
            {"id": "m", "object": "model", "created": 0, "owned_by": "x"}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if not self._authorised():
            return
        chunk = {"id": "c", "object": "text_completion", "created": 0, "model": "m",
                 "choices": [{"index": 0, "text": "hello", "finish_reason": "stop",
                              "logprobs": None}]}
        body = f"data: {json.dumps(chunk)}\n\ndata: [DONE]\n\n".encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture(scope="module")
def url():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}/v1"
    srv.shutdown()
    srv.server_close()


@pytest.fixture(autouse=True)
def no_keys(monkeypatch):
    for name in envs.CLIENT_KEY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    _Handler.seen.clear()


def test_client_key_order():
    assert envs.client_api_key({}) is None
    assert envs.client_api_key({"OPENAI_API_KEY": "o"}) == "o"
    assert envs.client_api_key({"OPENAI_API_KEY": "o", "VLLM_API_KEY": "v"}) == "v"
    assert envs.client_api_key({"VLLM_API_KEY": " ", "OPENAI_API_KEY": "o"}) == "o"


@pytest.mark.parametrize("variable", envs.CLIENT_KEY_VARIABLES)
def test_key_from_the_environment(url, monkeypatch, capsys, variable):
    monkeypatch.setenv(variable, KEY)
    assert cli.main(["complete", "--url", url, "-q", "x"]) == 0
    assert capsys.readouterr().out == "hello\n"
    assert set(_Handler.seen) == {f"Bearer {KEY}"}


def test_the_flag_wins_over_the_environment(url, monkeypatch, capsys):
    monkeypatch.setenv("VLLM_API_KEY", "stale")
    assert cli.main(["complete", "--url", url, "--api-key", KEY, "-q", "x"]) == 0
    assert capsys.readouterr().out == "hello\n"


@pytest.mark.parametrize("command", ["complete", "chat"])
@pytest.mark.parametrize("key,needle", [(None, "the server wants an API key"),
                                        ("wrong", "the API key sent was refused")])
def test_401_is_one_line_naming_the_fix(url, capsys, command, key, needle):
    args = [command, "--url", url, "-q", "x"] + (["--api-key", key] if key else [])
    assert cli.main(args) == 2
    captured = capsys.readouterr()
    err = captured.err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith(f"error: {url}: 401 {needle}; ")
    for name in ("--api-key", "VLLM_API_KEY", "OPENAI_API_KEY"):
        assert name in err
