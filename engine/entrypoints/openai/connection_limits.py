"""What a connection may hold of the server, as production HTTP servers
bound it (nginx's client_header_timeout / client_body_timeout,
worker_connections). uvicorn closes an idle keep-alive connection, but a
connection that never sends a request, or sends it a byte at a time, it
keeps forever: 1100 such sockets at the usual 1024-descriptor limit made a
fresh /health time out and the accept errors filled the log.

- a request's head must arrive within HEADER_TIMEOUT_S of the connection (or
  of the previous response), its body without a pause of BODY_IDLE_TIMEOUT_S
  while the server is reading it; else the connection is closed;
- at most max_connections are open: the next gets a 503 and is closed;
- the soft open-files limit is raised to the hard one at start (as upstream's
  set_ulimit), and max_connections sized below it;
- accept errors (out of descriptors) are logged once a second, one line.
"""
from __future__ import annotations

import asyncio
import logging
import resource
import socket
import time

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

HEADER_TIMEOUT_S = 30.0
BODY_IDLE_TIMEOUT_S = 30.0
# descriptors kept for everything else (the core's sockets, model files, logs)
RESERVED_FDS = 128
WANTED_FDS = 65_536
logger = logging.getLogger("engine.serve")

_BUSY_BODY = (b'{"error":{"message":"too many open connections",'
              b'"type":"ServiceUnavailable","code":503}}')
_BUSY = (b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
         b"connection: close\r\ncontent-length: %d\r\n\r\n%s" % (len(_BUSY_BODY), _BUSY_BODY))


def raise_fd_limit(wanted: int = WANTED_FDS) -> int:
    """Raise the soft open-files limit toward `wanted` (never above the hard
    limit); the soft limit now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = min(wanted, hard) if hard != resource.RLIM_INFINITY else wanted
    if target > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    return soft


def max_connections(fd_limit: int) -> int:
    """Connections a server process may hold under its open-files limit."""
    return max(16, fd_limit - RESERVED_FDS)


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with the read timeouts and the connection cap."""

    max_connections = 1024  # set per server by guarded_protocol()
    _deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        sock = transport.get_extra_info("socket")
        # asyncio sets TCP_NODELAY only on sockets whose proto is IPPROTO_TCP;
        # a listener from socket.create_server (proto 0) hands out sockets
        # without it, and a response's body, written after its head, waited
        # for the client's delayed ACK: 40 ms on every keep-alive response
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if len(self.connections) > self.max_connections:
            transport.write(_BUSY)
            transport.close()
            return
        self._arm(HEADER_TIMEOUT_S)

    def _arm(self, seconds: float) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(seconds, self._too_slow)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _too_slow(self) -> None:
        self._deadline = None
        if self.transport.is_closing():
            return
        if self.flow.read_paused:  # the app has not taken what came: not the client's pause
            self._arm(BODY_IDLE_TIMEOUT_S)
            return
        self.transport.close()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.transport.is_closing():
            return
        state = self.conn.their_state
        if state is h11.SEND_BODY:
            self._arm(BODY_IDLE_TIMEOUT_S)  # a body on its way: each chunk restarts the wait
        elif state is h11.IDLE:
            if self._deadline is None:
                self._arm(HEADER_TIMEOUT_S)  # a head begun and not finished: its own clock
        else:
            self._disarm()  # the request is in: the app's time now

    def on_response_complete(self) -> None:
        super().on_response_complete()
        # uvicorn's keep-alive timeout closes an idle connection; a head begun
        # after it (its timer cancelled by the first byte) gets the header clock
        self._disarm()

    def connection_lost(self, exc) -> None:
        self._disarm()
        super().connection_lost(exc)


def guarded_protocol(limit: int) -> type[GuardedH11Protocol]:
    return type("GuardedH11Protocol", (GuardedH11Protocol,), {"max_connections": limit})


class AcceptErrorsOncePerSecond(logging.Filter):
    """asyncio's 'socket.accept() out of system resource', with its traceback,
    at most once a second, as one line."""

    def __init__(self):
        super().__init__()
        self.last = 0.0

    def filter(self, record: logging.LogRecord) -> bool:
        if "socket.accept() out of system resource" not in record.getMessage():
            return True
        now = time.monotonic()
        if now - self.last < 1.0:
            return False
        self.last = now
        record.exc_info, record.exc_text = None, None
        allowed = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        record.msg, record.args = (f"cannot accept a connection: out of open files ({allowed} "
                                   "allowed); raise `ulimit -n`"), ()
        return True
