"""The index server's connection model: slow clients cannot take the workers.

One thread (the gatherer) holds every connection that is between requests or
still sending its request head, in a selector, and hands a connection to the
pool of workers only once its whole head (request line and headers) has
arrived. A head must arrive within a deadline for the whole head, not per
read, so a client that dribbles one header line every few seconds is answered
408 and closed without ever holding a worker; a fresh client is served at once
however many dribblers there are. The connections held are capped (the oldest
waiting one is dropped first), so a crowd cannot exhaust file descriptors.
"""
from __future__ import annotations

import http.server
import os
import queue
import selectors
import socket
import threading
import time
from dataclasses import dataclass, field

from wheel_index import sender
from wheel_index.selector_thread import SelectorThread
from wheel_index.sender import Body, Sender

DEFAULT_THREADS = 64
#: seconds a client has for its whole request head (line and headers)
HEADER_TIMEOUT = 10.0
#: seconds an idle keep-alive connection is kept between requests
IDLE_TIMEOUT = 15.0
#: bytes a request head may take; a longer one is answered 431
MAX_HEAD = 64 << 10
#: connections held waiting for a head at once; past it the oldest is dropped
MAX_WAITING = 4096

_TIMEOUT_408 = (b"HTTP/1.1 408 Request Timeout\r\nContent-Type: text/plain; charset=utf-8\r\n"
                b"Content-Length: 41\r\nConnection: close\r\n\r\n"
                b"408 the request head did not come in time\n")
_TOO_LARGE_431 = (b"HTTP/1.1 431 Request Header Fields Too Large\r\nContent-Type: text/plain; "
                  b"charset=utf-8\r\nContent-Length: 32\r\nConnection: close\r\n\r\n"
                  b"431 the request head is too big\n")


@dataclass
class Request:
    """A connection whose request head has arrived: what a worker serves."""
    sock: socket.socket
    head: bytes
    rest: bytes = b""  # bytes after the head (a pipelined next request)


@dataclass
class _Waiting:
    sock: socket.socket
    address: tuple
    deadline: float
    started: bool  # a byte of the head has come (the head's deadline runs)
    buf: bytearray = field(default_factory=bytearray)


def head_end(buf: bytes | bytearray) -> int:
    """Where the request head ends in buf (past its blank line), or -1; a bare
    LF is accepted as a line end, as http.server accepts it."""
    ends = [i + len(sep) for sep in (b"\r\n\r\n", b"\n\n") if (i := buf.find(sep)) >= 0]
    return min(ends) if ends else -1


class Gatherer(SelectorThread):
    """The selector thread that collects request heads (see the module's doc)."""

    def __init__(self, dispatch, header_timeout: float, idle_timeout: float,
                 max_waiting: int = MAX_WAITING):
        super().__init__("index-gather")
        self._dispatch = dispatch
        self._header_timeout, self._idle_timeout = header_timeout, idle_timeout
        self._max_waiting = max_waiting
        self._waiting: dict[int, _Waiting] = {}
        self._start()

    def add(self, sock: socket.socket, address, rest: bytes = b"", idle: bool = False) -> None:
        """Wait for the next request head on sock (from any thread)."""
        if not self._submit((sock, address, rest, idle)):
            sock.close()

    def _stop(self) -> None:
        for w in list(self._waiting.values()):
            self._drop(w)

    def _take(self, item) -> None:
        sock, address, rest, idle = item
        now = time.monotonic()
        w = _Waiting(sock, address, now + (self._idle_timeout if idle and not rest
                                           else self._header_timeout),
                     started=bool(rest) or not idle, buf=bytearray(rest))
        if self._complete(w):
            return
        if len(self._waiting) >= self._max_waiting:
            self._drop_oldest()
        fd = sock.fileno()
        self._waiting[fd] = w
        self._sel.register(fd, selectors.EVENT_READ)
        self._at(w.deadline, fd)

    def _ready(self, fd: int) -> None:
        w = self._waiting.get(fd)
        if w is None:
            return
        try:
            data = w.sock.recv(MAX_HEAD)
        except (TimeoutError, BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:  # the client closed
            return self._unwatch(fd, close=True)
        if not w.started:  # a keep-alive connection starts its next head: its clock starts
            w.started = True
            w.deadline = time.monotonic() + self._header_timeout
            self._at(w.deadline, fd)
        w.buf += data
        if head_end(w.buf) < 0 and len(w.buf) > MAX_HEAD:
            _send_quietly(w.sock, _TOO_LARGE_431)
            return self._unwatch(fd, close=True)
        if head_end(w.buf) >= 0:
            self._unwatch(fd, close=False)
            self._complete(w)

    def _complete(self, w: _Waiting) -> bool:
        """Hand w to the workers when its head is all there."""
        end = head_end(w.buf)
        if end < 0:
            return False
        self._dispatch(Request(w.sock, bytes(w.buf[:end]), bytes(w.buf[end:])), w.address)
        return True

    def _expired(self, fd: int, deadline: float) -> None:
        w = self._waiting.get(fd)
        if w is None or w.deadline != deadline:
            return  # served meanwhile, or its clock was restarted
        if w.started:
            _send_quietly(w.sock, _TIMEOUT_408)
        self._unwatch(fd, close=True)

    def _drop_oldest(self) -> None:
        fd = min(self._waiting, key=lambda f: self._waiting[f].deadline)
        self._unwatch(fd, close=True)

    def _unwatch(self, fd: int, close: bool) -> None:
        w = self._waiting.pop(fd)
        self._sel.unregister(fd)
        if close:
            self._drop(w)

    @staticmethod
    def _drop(w: _Waiting) -> None:
        try:
            w.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        w.sock.close()


def _send_quietly(sock: socket.socket, data: bytes) -> None:
    """A last word to a client that may not read it: never block on it."""
    try:
        os.write(sock.fileno(), data)
    except OSError:
        pass


class GatheringServer(http.server.HTTPServer):
    """A TCP server whose connections wait in a Gatherer for their request
    heads and are served, one request at a time, by a fixed pool of threads:
    a crowd of clients queues instead of growing threads and memory without
    bound, and slow ones never hold a thread. Closing it cuts the open
    connections, so Ctrl-C stops at once."""

    #: the kernel's queue of connections not yet accepted (socketserver's 5 makes a
    #: crowd of connects wait out SYN retransmits of whole seconds)
    request_queue_size = 1024

    def __init__(self, address, handler, threads: int = DEFAULT_THREADS,
                 header_timeout: float = HEADER_TIMEOUT, idle_timeout: float = IDLE_TIMEOUT):
        # everything server_close() touches exists before the bind, which may fail
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._workers: list[threading.Thread] = []
        self._gatherer: Gatherer | None = None
        self._sender: Sender | None = None
        super().__init__(address, handler)
        self._sender = Sender()
        self._gatherer = Gatherer(lambda req, addr: self._queue.put((req, addr)),
                                  header_timeout, idle_timeout)
        self._workers = [threading.Thread(target=self._work, daemon=True,
                                          name=f"index-serve-{i}") for i in range(threads)]
        for t in self._workers:
            t.start()

    def process_request(self, request, client_address):
        request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        request.settimeout(sender.SEND_TIMEOUT)
        self._gatherer.add(request, client_address)

    def _work(self):
        while (item := self._queue.get()) is not None:
            request, address = item
            with self._lock:
                self._open.add(request.sock)
            keep, body = False, None
            try:
                handler = self.RequestHandlerClass(request, address, self)
                keep, body = not handler.close_connection, getattr(handler, "body", None)
            except (TimeoutError, ConnectionError):
                pass  # the client went away
            except Exception:
                self.handle_error(request.sock, address)
            if body is not None:  # the sender finishes the answer, then hands it on
                fd, offset, length = body
                self._sender.add(Body(request.sock, fd, offset, length, lambda ok, r=request,
                                      a=address, k=keep: self._answered(r, a, k and ok)))
            else:
                self._answered(request, address, keep)

    def _answered(self, request, address, keep: bool) -> None:
        with self._lock:
            self._open.discard(request.sock)
        if keep and self._gatherer is not None:
            self._gatherer.add(request.sock, address, request.rest, idle=True)
        else:
            self.shutdown_request(request.sock)

    def server_close(self):
        super().server_close()
        if self._gatherer is not None:
            self._gatherer.close()
        if self._sender is not None:
            self._sender.close()
        for _ in self._workers:
            self._queue.put(None)
        with self._lock:
            for s in list(self._open):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
