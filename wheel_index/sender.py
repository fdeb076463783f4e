"""The index server's file sender: response bodies go out from one selector
thread, never from a worker. A worker that sent a 50 MB wheel itself was
held for as long as its client took to read it: 70 clients that asked for a
wheel and never read held all 64 workers, and every other fetch waited 13-15
s. Here a worker writes the response head and hands the body over; the sender
pushes it with sendfile as the socket takes it, drops a client that takes
nothing for SEND_TIMEOUT, and hands a kept-alive connection back to wait for
its next request."""
from __future__ import annotations

import os
import selectors
import socket
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass

from wheel_index.selector_thread import SelectorThread

#: seconds a client may take no byte of a response before it is dropped
SEND_TIMEOUT = 15.0
CHUNK = 4 << 20  # bytes one sendfile call may move


@dataclass
class Body:
    """The rest of a response: `length` bytes of the open file `fd` from `offset`."""
    sock: socket.socket
    fd: int
    offset: int
    length: int
    done: Callable[[bool], None]  # called once: True when all of it went out
    deadline: float = 0.0


class Sender(SelectorThread):
    def __init__(self, send_timeout: float | None = None):
        super().__init__("index-send")
        self._timeout = SEND_TIMEOUT if send_timeout is None else send_timeout
        self._bodies: dict[int, Body] = {}
        self._start()

    def add(self, body: Body) -> None:
        """Send body (from any thread); the file descriptor is the sender's now."""
        if not self._submit(body):
            os.close(body.fd)
            body.done(False)

    def _stop(self) -> None:
        for fd in list(self._bodies):
            self._finish(fd, False)

    def _take(self, body: Body) -> None:
        body.sock.setblocking(False)
        fd = body.sock.fileno()
        self._bodies[fd] = body
        self._sel.register(fd, selectors.EVENT_WRITE)
        self._progressed(fd, body)
        self._ready(fd)

    def _progressed(self, fd: int, body: Body) -> None:
        body.deadline = time.monotonic() + self._timeout
        self._at(body.deadline, fd)

    def _ready(self, fd: int) -> None:
        body = self._bodies.get(fd)
        if body is None:
            return
        try:
            sent = os.sendfile(fd, body.fd, body.offset, min(body.length, CHUNK))
        except (BlockingIOError, InterruptedError):
            return
        except OSError:  # the client went away
            return self._finish(fd, False)
        if sent == 0:  # the file shrank meanwhile: the response cannot be completed
            return self._finish(fd, False)
        body.offset += sent
        body.length -= sent
        if body.length == 0:
            return self._finish(fd, True)
        self._progressed(fd, body)

    def _expired(self, fd: int, deadline: float) -> None:
        body = self._bodies.get(fd)
        if body is not None and body.deadline == deadline:
            self._finish(fd, False)  # took nothing for SEND_TIMEOUT

    def _finish(self, fd: int, complete: bool) -> None:
        body = self._bodies.pop(fd)
        self._sel.unregister(fd)
        os.close(body.fd)
        if not complete:  # a reset, not a close: the megabytes the kernel holds for it go too
            try:
                body.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            except OSError:
                pass
        body.sock.settimeout(self._timeout)
        body.done(complete)
