"""engine serve's connection limits (engine/entrypoints/openai/connection_limits.py):
connections that send nothing, or a head or a body too slowly, are closed;
one over the cap gets a 503; the others are served meanwhile. A real server
on 127.0.0.1 with the limits shortened."""
from __future__ import annotations

import socket
import time

import pytest

httpx = pytest.importorskip("httpx")
fastapi = pytest.importorskip("fastapi")
from fastapi import FastAPI, Request  # noqa: E402 - module level: the route's annotations resolve here


@pytest.fixture
def served(monkeypatch, tmp_path):
    """(port, uvicorn server) with the guarded protocol over a small app, in a thread."""
    import threading

    import uvicorn

    from engine.entrypoints.openai import connection_limits as cl

    monkeypatch.setattr(cl, "HEADER_TIMEOUT_S", 0.5)
    monkeypatch.setattr(cl, "BODY_IDLE_TIMEOUT_S", 0.5)
    app = FastAPI()

    @app.get("/health")
    async def health():
        return {}

    @app.post("/echo")
    async def echo(request: Request):
        return {"n": len(await request.body())}

    sock = socket.create_server(("127.0.0.1", 0))
    config = uvicorn.Config(app, log_level="warning", http=cl.guarded_protocol(8))
    srv = uvicorn.Server(config)
    t = threading.Thread(target=srv.run, kwargs={"sockets": [sock]}, daemon=True)
    t.start()
    while not srv.started:
        time.sleep(0.01)
    yield sock.getsockname()[1], srv
    srv.should_exit = True
    t.join(10)


@pytest.fixture
def server(served):
    return served[0]


def closed_within(s: socket.socket, seconds: float) -> bool:
    s.settimeout(seconds)
    try:
        return s.recv(1024) == b""
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True


def test_a_silent_connection_is_closed(server):
    s = socket.create_connection(("127.0.0.1", server))
    assert closed_within(s, 5)
    assert httpx.get(f"http://127.0.0.1:{server}/health").status_code == 200


def test_a_head_sent_slowly_is_closed(server):
    s = socket.create_connection(("127.0.0.1", server))
    t0 = time.monotonic()
    for ch in b"GET /health HTTP/1.1\r\nHost: x\r\n":  # a byte every 0.1 s: never finishes
        try:
            s.send(bytes([ch]))
        except OSError:
            break
        if closed_within(s, 0.1):
            break
    assert time.monotonic() - t0 < 3


def test_a_body_that_stops_coming_is_closed_and_a_whole_one_answered(server):
    s = socket.create_connection(("127.0.0.1", server))
    s.sendall(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nabc")
    assert closed_within(s, 5)
    r = httpx.post(f"http://127.0.0.1:{server}/echo", content=b"x" * 100)
    assert r.json() == {"n": 100}


def test_a_keep_alive_connection_serves_many_requests(server):
    with httpx.Client(base_url=f"http://127.0.0.1:{server}") as c:
        for _ in range(3):
            assert c.get("/health").status_code == 200
            time.sleep(0.3)  # under the header timeout each time, 0.9 s in all


def test_connections_over_the_cap_get_a_503(server):
    held = [socket.create_connection(("127.0.0.1", server)) for _ in range(8)]
    time.sleep(0.1)
    extra = socket.create_connection(("127.0.0.1", server))
    extra.settimeout(5)
    assert extra.recv(1024).startswith(b"HTTP/1.1 503")
    for s in held:
        s.close()
    time.sleep(0.2)
    assert httpx.get(f"http://127.0.0.1:{server}/health").status_code == 200


def test_the_fd_limit_is_raised_and_the_cap_sits_under_it(monkeypatch):
    import resource

    from engine.entrypoints.openai import connection_limits as cl

    calls = []
    monkeypatch.setattr(resource, "getrlimit", lambda _: (1024, 4096))
    monkeypatch.setattr(resource, "setrlimit", lambda _, v: calls.append(v))
    assert cl.raise_fd_limit(wanted=65536) == 4096 and calls == [(4096, 4096)]
    assert cl.max_connections(1024) == 1024 - cl.RESERVED_FDS


def test_accept_errors_are_one_line_a_second():
    import logging

    from engine.entrypoints.openai.connection_limits import AcceptErrorsOncePerSecond

    f = AcceptErrorsOncePerSecond()
    rec = lambda: logging.LogRecord("asyncio", logging.ERROR, __file__, 1,  # noqa: E731
                                    "socket.accept() out of system resource", (), None)
    kept = [f.filter(rec()) for _ in range(100)]
    assert kept.count(True) == 1
    other = logging.LogRecord("asyncio", logging.ERROR, __file__, 1, "other", (), None)
    assert f.filter(other)


def test_accepted_connections_send_without_waiting_for_acks(served):
    """A listener from socket.create_server has proto 0, and asyncio sets
    TCP_NODELAY only on IPPROTO_TCP sockets: a response's body, written after
    its head, waited for the client's delayed ACK (40 ms a keep-alive request)."""
    port, srv = served
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    assert s.recv(1024).startswith(b"HTTP/1.1 200")
    (conn,) = srv.server_state.connections
    sock = conn.transport.get_extra_info("socket")
    assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
