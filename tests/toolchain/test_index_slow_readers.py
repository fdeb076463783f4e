"""`wheel_index serve` against clients that ask for a large file and never
read it: the body goes out from the sender thread (wheel_index/sender.py), so
no worker is held, every other fetch is answered meanwhile, and a client that
takes nothing is dropped after SEND_TIMEOUT. Dot files (the publisher's lock
and journal) are never served."""
from __future__ import annotations

import http.client
import socket
import threading
import time

import pytest

from wheel_index import sender
from wheel_index.server import make_server


@pytest.fixture
def index(tmp_path, monkeypatch):
    monkeypatch.setattr(sender, "SEND_TIMEOUT", 2.0)
    root = tmp_path / "index"
    (root / "files").mkdir(parents=True)
    (root / "files" / "big.whl").write_bytes(b"w" * (50 << 20))
    (root / "index.html").write_text("<html>the index</html>")
    (root / ".lock").write_text("")
    (root / ".publish-journal.json").write_text("{}")
    server = make_server(root, threads=4)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()


def fetch(server, path, timeout=10):
    conn = http.client.HTTPConnection(*server.server_address, timeout=timeout)
    try:
        conn.request("GET", path)
        r = conn.getresponse()
        return r.status, r.read()
    finally:
        conn.close()


def test_readers_that_never_read_hold_no_worker(index):
    stuck = []
    for _ in range(20):  # five times the workers, each asking for 50 MB and reading nothing
        s = socket.create_connection(index.server_address)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.sendall(b"GET /files/big.whl HTTP/1.1\r\nHost: x\r\n\r\n")
        stuck.append(s)
    time.sleep(0.5)
    try:
        for _ in range(3):
            status, body = fetch(index, "/", timeout=3)  # well under SEND_TIMEOUT
            assert status == 200 and b"the index" in body
        status, body = fetch(index, "/files/big.whl", timeout=30)  # a reader that reads
        assert status == 200 and len(body) == 50 << 20
    finally:
        for s in stuck:
            s.close()


def test_a_client_that_takes_nothing_is_dropped(index):
    s = socket.create_connection(index.server_address)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.sendall(b"GET /files/big.whl HTTP/1.1\r\nHost: x\r\n\r\n")
    time.sleep(sender.SEND_TIMEOUT + 1.5)
    s.settimeout(10)
    got = 0
    try:
        while chunk := s.recv(1 << 20):
            got += len(chunk)
    except ConnectionResetError:
        pass
    assert got < 50 << 20  # the connection ended before the body did
    s.close()


def test_a_kept_alive_connection_goes_on_after_a_sent_body(index):
    conn = http.client.HTTPConnection(*index.server_address, timeout=30)
    for path, size in (("/files/big.whl", 50 << 20), ("/", None), ("/files/big.whl", 50 << 20)):
        conn.request("GET", path)
        r = conn.getresponse()
        body = r.read()
        assert r.status == 200 and (size is None or len(body) == size)
    conn.close()


@pytest.mark.parametrize("path", ["/.lock", "/.publish-journal.json", "/files/.tmp-x.whl",
                                  "/%2elock"])
def test_dot_files_are_not_served(index, path):
    status, _ = fetch(index, path)
    assert status == 404
