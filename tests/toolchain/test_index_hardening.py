"""`wheel_index serve` against a stranger: files linked out of the root (at any
depth, a level's own index.html among them), traversal spelled every way,
clients that dribble their request heads, and a port already taken."""
from __future__ import annotations

import http.client
import os
import select
import socket
import subprocess
import sys
import threading
import time

import pytest

from helpers import REPO, make_wheel
from wheel_index.publish import publish
from wheel_index.server import make_server
from wheel_index.storage import LocalStorage

A = "a" * 40
SECRET = b"root:x:0:0:secret"


@pytest.fixture
def index(tmp_path):
    idx = tmp_path / "index"
    w = make_wheel(tmp_path / "w", "0.1.dev3+g1234567.cpu", commit=A)
    publish(LocalStorage(idx), A, [w], nightly=True, commit_time="100", log=lambda m: None)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "passwd").write_bytes(SECRET)
    (outside / "index.html").write_bytes(SECRET)
    (outside / "index.json").write_bytes(SECRET)
    return idx, outside


def serve(idx, **kw):
    server = make_server(idx, **kw)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def get(server, path, headers=None, timeout=10):
    conn = http.client.HTTPConnection(*server.server_address, timeout=timeout)
    try:
        conn.request("GET", path, headers=headers or {})
        r = conn.getresponse()
        return r, r.read()
    finally:
        conn.close()


def test_links_out_of_the_root_are_not_found_at_any_depth(index):
    idx, outside = index
    level = idx / "nightly" / "cpu"
    (level / "vllm-engine" / "index.html").unlink()
    os.symlink(outside / "passwd", level / "vllm-engine" / "index.html")  # a level's own page
    (idx / "linked").mkdir()
    os.symlink(outside / "passwd", idx / "linked" / "index.json")  # the JSON page only
    (idx / "linked" / "index.html").write_text("fine")
    os.symlink(outside, idx / "nightly" / "away")  # a folder out, with pages inside
    (idx / "deep" / "er").mkdir(parents=True)
    os.symlink(outside / "passwd", idx / "deep" / "er" / "file.txt")  # a nested file
    os.symlink(idx / "deep" / "er" / "file.txt", idx / "hop.txt")  # a link to that link
    os.symlink("../../outside", idx / "deep" / "rel")  # relative, folder
    server = serve(idx, threads=2)
    try:
        json_accept = {"Accept": "application/vnd.pypi.simple.v1+json"}
        for path, headers in [("/nightly/cpu/vllm-engine/", None),
                              ("/nightly/cpu/vllm-engine/index.html", None),
                              ("/linked/", json_accept), ("/linked/index.json", None),
                              ("/nightly/away/", None), ("/nightly/away/", json_accept),
                              ("/nightly/away/passwd", None), ("/deep/er/file.txt", None),
                              ("/hop.txt", None), ("/deep/rel/passwd", None),
                              ("/deep/rel/", None)]:
            r, body = get(server, path, headers)
            assert r.status == 404 and SECRET not in body, (path, r.status)
        # links that stay inside the root are served
        os.symlink(idx / "linked" / "index.html", idx / "inside.html")
        r, body = get(server, "/inside.html")
        assert r.status == 200 and body == b"fine"
        assert get(server, "/linked/")[1] == b"fine"  # HTML asked: its own, real page
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("path", [
    "/../outside/passwd", "/nightly/../../outside/passwd", "/%2e%2e/outside/passwd",
    "/nightly/%2E%2E/%2e%2e/outside/passwd", "/nightly/..%2f..%2foutside%2fpasswd",
    "/nightly/cpu/%2e%2e%2f%2e%2e%2f%2e%2e%2foutside/passwd", "/..%5c..%5coutside%5cpasswd",
    "/nightly/%00/passwd", "//../outside/passwd", "/./nightly/cpu/"])
def test_traversal_in_any_spelling_is_refused(index, path):
    idx, _ = index
    server = serve(idx, threads=2)
    try:
        # sent as raw bytes: http.client would not normalise them, but be sure
        with socket.create_connection(server.server_address, timeout=10) as s:
            s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
            answer = b""
            while chunk := s.recv(65536):
                answer += chunk
        assert answer.startswith(b"HTTP/1.1 400") and SECRET not in answer, answer[:80]
    finally:
        server.shutdown()
        server.server_close()


def _dribbler(address) -> socket.socket:
    s = socket.create_connection(address, timeout=10)
    s.sendall(b"GET /nightly/cpu/ HTTP/1.1\r\nHost: x\r\n")  # the head never ends
    return s


def test_dribbling_clients_do_not_delay_a_fresh_one(index):
    """120 connections that each send a header line now and then, against 4
    workers: a fresh client is still answered at once (its client timeout is
    well under the server's head deadline, so a fresh client that had to wait
    for a dribbler to be cut off would fail)."""
    idx, _ = index
    server = serve(idx, threads=4, header_timeout=30)
    slow = []
    try:
        slow = [_dribbler(server.server_address) for _ in range(120)]
        for round_ in range(2):
            time.sleep(0.5)
            for s in slow:
                s.sendall(f"X-Dribble-{round_}: 1\r\n".encode())
            r, body = get(server, "/nightly/cpu/", timeout=5)
            assert r.status == 200 and b"vllm-engine" in body
    finally:
        for s in slow:
            s.close()
        server.shutdown()
        server.server_close()


def test_a_head_that_does_not_finish_in_time_is_408(index):
    """The deadline is for the whole head, not per read: a line every 0.2 s
    keeps every read short, and the connection is still cut at 1 s."""
    idx, _ = index
    server = serve(idx, threads=2, header_timeout=1)
    try:
        s = _dribbler(server.server_address)
        answer = b""
        with s:
            for i in range(50):  # 10 s of dribbling at most
                if select.select([s], [], [], 0.2)[0]:  # the answer: stop sending, read it
                    while chunk := s.recv(4096):
                        answer += chunk
                    break
                s.sendall(f"X-Line-{i}: 1\r\n".encode())
        assert answer.startswith(b"HTTP/1.1 408"), answer
        assert get(server, "/nightly/cpu/")[0].status == 200
    finally:
        server.shutdown()
        server.server_close()


def test_keep_alive_and_pipelined_requests_still_work(index):
    idx, _ = index
    server = serve(idx, threads=1)
    try:
        conn = http.client.HTTPConnection(*server.server_address, timeout=10)
        for _ in range(3):  # one connection, one worker, three requests
            conn.request("GET", "/nightly/cpu/")
            r = conn.getresponse()
            assert r.status == 200 and b"vllm-engine" in r.read()
        conn.close()
        with socket.create_connection(server.server_address, timeout=10) as s:
            s.sendall(b"GET /nightly/cpu/ HTTP/1.1\r\nHost: x\r\n\r\n"
                      b"GET /nightly/cpu/ HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            answer = b""
            while chunk := s.recv(65536):
                answer += chunk
        assert answer.count(b"HTTP/1.1 200 OK") == 2
    finally:
        server.shutdown()
        server.server_close()


def test_a_busy_port_is_one_line_naming_it_and_the_fix(index):
    idx, _ = index
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = subprocess.run([sys.executable, "-m", "wheel_index", "serve", "--index", str(idx),
                               "--port", str(port)], cwd=REPO, capture_output=True, text=True,
                              timeout=60)
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1, proc.stderr
    assert f":{port}" in proc.stderr and "--port" in proc.stderr, proc.stderr
