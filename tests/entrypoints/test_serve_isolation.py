"""The engine core in a process of its own: no request, template or step
holds the server's event loop, and a core that dies, or a signal, ends the
server promptly with one line. Real server processes on 127.0.0.1."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from helpers import REPO, free_port, wait_for_health

httpx = pytest.importorskip("httpx")

pytestmark = pytest.mark.slow

LOOPING_TEMPLATE = ("{% for i in range(100000) %}{% for j in range(100000) %}"
                    "{% endfor %}{% endfor %}{{ messages[0]['content'] }}")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    from engine.tiny_model import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("m") / "tiny")


class Server:
    def __init__(self, model: Path, *extra: str, wait: bool = True):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "0.05", "PYTHONPATH": str(REPO),
               "VLLM_CPU_OMP_THREADS_BIND": "nobind", "OMP_NUM_THREADS": "1"}
        self.log_path = model.parent / f"server-{self.port}.log"
        self.log = open(self.log_path, "w+")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "engine.cli", "serve", str(model), "--port", str(self.port),
             "--dtype", "float32", "--block-size", "32", "--max-model-len", "1024", *extra],
            env=env, stdout=self.log, stderr=subprocess.STDOUT)
        if wait:
            self.wait_healthy()

    def wait_healthy(self) -> None:
        wait_for_health(self.proc, self.url, self.output)

    def core_pid(self) -> int:
        """The engine core process: the server's child that is not
        multiprocessing's resource tracker."""
        deadline = time.monotonic() + 60  # the server imports torch first: seconds on busy cores
        while time.monotonic() < deadline:
            children = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children").read_text()
            for pid in children.split():
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
                if b"spawn_main" in cmd:
                    return int(pid)
            time.sleep(0.05)
        raise AssertionError("the server has no engine core process")

    def output(self) -> str:
        self.log.flush()
        return self.log_path.read_text()[-5000:]

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.log.close()


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"  # a zombie is gone too


def rss(pid: int) -> int:
    """The process's resident memory, bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for {pid}")


def completion(url: str, **body) -> httpx.Response:
    return httpx.post(url + "/v1/completions", json={"prompt": "hi", "max_tokens": 4,
                                                     "temperature": 0, **body}, timeout=60)


def while_in_flight(slow, probe) -> tuple[list, object]:
    """Run slow() in a thread; probe() from here until it is done. (the
    probes' results made while slow() was still running, slow()'s result)."""
    result: dict = {}
    t = threading.Thread(target=lambda: result.setdefault("r", slow()))
    t.start()
    time.sleep(0.2)
    seen = []
    deadline = time.monotonic() + 120
    while t.is_alive() and time.monotonic() < deadline:
        seen.append(probe())
        time.sleep(0.05)
    t.join(1)
    assert not t.is_alive()
    return seen, result["r"]


def test_a_killed_engine_core_ends_streams_and_the_server(tiny):
    s = Server(tiny)
    try:
        core = s.core_pid()
        events: list[str] = []
        with httpx.stream("POST", s.url + "/v1/completions", timeout=60, json={
                "prompt": "hi", "max_tokens": 1000, "ignore_eos": True, "stream": True}) as r:
            for line in r.iter_lines():
                events.append(line)
                if len(events) == 3:
                    os.kill(core, signal.SIGKILL)
        data = [json.loads(e[6:]) for e in events if e.startswith("data: {")]
        assert "error" in data[-1] and "SIGKILL" in data[-1]["error"]["message"], data[-1]
        assert [e for e in events if e][-1] == "data: [DONE]"  # the stream ended, not hung
        statuses = []
        while s.proc.poll() is None:
            try:
                statuses.append(httpx.get(s.url + "/health", timeout=2).status_code)
            except httpx.HTTPError:
                break
            time.sleep(0.1)
        assert 503 in statuses and 200 not in statuses
        assert s.proc.wait(30) == 1
        assert "the engine core process died (signal SIGKILL)" in s.output()
        assert "Traceback" not in s.output()
    finally:
        s.close()


def test_a_looping_chat_template_holds_up_no_one(tiny, tmp_path):
    template = tmp_path / "loop.jinja"
    template.write_text(LOOPING_TEMPLATE)
    s = Server(tiny, "--chat-template", str(template))
    try:
        chat = lambda: httpx.post(s.url + "/v1/chat/completions", timeout=120, json={  # noqa: E731
            "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
        probes, answer = while_in_flight(
            chat, lambda: (httpx.get(s.url + "/health", timeout=30).status_code,
                           completion(s.url).status_code))
        assert probes and all(p == (200, 200) for p in probes), probes
        assert answer.status_code == 400
        assert "chat template" in answer.json()["error"]["message"]
        assert completion(s.url).status_code == 200  # and the server goes on
    finally:
        s.close()


def test_large_bodies_are_refused_or_tokenized_off_the_event_loop(tiny):
    s = Server(tiny, "--max-request-body-bytes", str(40 << 20))
    try:
        big = "hello world, this is a test. " * 360_000  # ~10 MB
        tokenize = lambda: httpx.post(s.url + "/tokenize", json={"prompt": big},  # noqa: E731
                                      timeout=120)
        idle = rss(s.proc.pid)
        probes, answer = while_in_flight(
            tokenize, lambda: (httpx.get(s.url + "/health", timeout=30).status_code,
                               rss(s.proc.pid)))
        assert probes and {p[0] for p in probes} == {200}, probes
        assert answer.status_code == 200, answer.text[:300]
        assert answer.json()["count"] > 1_000_000
        # the API server's memory (its tokenizer's working set included) while it held
        # the body, its 2.5 million ids and the answer, against its own idle size
        assert max(p[1] for p in probes + [(0, rss(s.proc.pid))]) < 2 * idle, (idle, probes)
    finally:
        s.close()
    s = Server(tiny)  # the default limit, sized for a 1024-token context
    try:
        r = httpx.post(s.url + "/tokenize", json={"prompt": big}, timeout=60)
        assert r.status_code == 413, r.text[:300]
        assert "--max-request-body-bytes" in r.json()["error"]["message"]
        r = completion(s.url, prompt=["hi"] * 100_000)
        assert r.status_code == 400 and "100000 sequences" in r.json()["error"]["message"]
        assert httpx.get(s.url + "/health", timeout=10).status_code == 200
    finally:
        s.close()


def test_sigterm_while_loading_stops_the_core_too(tiny):
    s = Server(tiny, wait=False)
    try:
        core = s.core_pid()
        s.proc.send_signal(signal.SIGTERM)
        assert s.proc.wait(30) == 1
        assert "stopped while the engine core was loading the model" in s.output()
        deadline = time.monotonic() + 10
        while not gone(core):
            assert time.monotonic() < deadline, "the engine core outlived its server"
            time.sleep(0.1)
    finally:
        s.close()


def test_sigterm_under_load_exits_and_stops_the_core(tiny):
    s = Server(tiny)
    try:
        core = s.core_pid()
        lines: list[str] = []

        def stream():
            try:
                with httpx.stream("POST", s.url + "/v1/completions", timeout=60, json={
                        "prompt": "hi", "max_tokens": 1000, "ignore_eos": True,
                        "stream": True}) as r:
                    for line in r.iter_lines():
                        lines.append(line)
            except httpx.HTTPError:
                pass

        t = threading.Thread(target=stream)
        t.start()
        while len(lines) < 3:
            time.sleep(0.05)
        s.proc.send_signal(signal.SIGTERM)
        assert s.proc.wait(30) == 0, s.output()
        t.join(30)
        assert not t.is_alive()
        assert gone(core)
        assert "requests were still running" in s.output()
    finally:
        s.close()
