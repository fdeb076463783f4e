"""A thread that serves sockets from one selector: items are handed to it
from any thread (a socketpair wakes it), and per-socket deadlines wait in a
lazy heap. The index server's gatherer (request heads) and sender (response
bodies) are two of these."""
from __future__ import annotations

import heapq
import itertools
import queue
import selectors
import socket
import threading
import time


class SelectorThread:
    """Subclasses say what an item is (_take), what a ready socket does
    (_ready), what a deadline that came does (_expired) and what is left to
    close when the thread stops (_stop); they call _start() once built."""

    def __init__(self, name: str):
        self._sel = selectors.DefaultSelector()
        self._deadlines: list[tuple[float, int, int]] = []  # (deadline, seq, fd), lazy
        self._seq = itertools.count()
        self._incoming: queue.SimpleQueue = queue.SimpleQueue()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._sel.register(self._wake_r, selectors.EVENT_READ)
        self._stopped = False
        self._thread = threading.Thread(target=self._run, daemon=True, name=name)

    def _start(self) -> None:
        self._thread.start()

    def _submit(self, item) -> bool:
        """Hand item to the thread (from any thread); False once it is stopping."""
        if self._stopped:
            return False
        self._incoming.put(item)
        self._wake()
        return True

    def close(self) -> None:
        self._stopped = True
        self._wake()
        self._thread.join(timeout=5)

    def _wake(self) -> None:
        try:
            self._wake_w.send(b"x")
        except OSError:  # the wake buffer is full: the thread is awake anyway
            pass

    def _at(self, deadline: float, fd: int) -> None:
        """Call _expired(fd, deadline) once `deadline` (time.monotonic) passes."""
        heapq.heappush(self._deadlines, (deadline, next(self._seq), fd))

    def _run(self) -> None:
        while not self._stopped:
            timeout = max(0.0, self._deadlines[0][0] - time.monotonic()) \
                if self._deadlines else None
            for key, _ in self._sel.select(timeout):
                if key.fileobj is self._wake_r:
                    self._take_incoming()
                else:
                    self._ready(key.fd)
            now = time.monotonic()
            while self._deadlines and self._deadlines[0][0] <= now:
                deadline, _, fd = heapq.heappop(self._deadlines)
                self._expired(fd, deadline)
        self._stop()
        self._sel.close()
        self._wake_r.close()
        self._wake_w.close()

    def _take_incoming(self) -> None:
        try:
            while self._wake_r.recv(4096):
                pass
        except (BlockingIOError, InterruptedError):
            pass
        while True:
            try:
                item = self._incoming.get_nowait()
            except queue.Empty:
                return
            self._take(item)

    def _take(self, item) -> None:
        raise NotImplementedError

    def _ready(self, fd: int) -> None:
        raise NotImplementedError

    def _expired(self, fd: int, deadline: float) -> None:
        """A deadline set by _at came; it may be stale (check it is still fd's)."""
        raise NotImplementedError

    def _stop(self) -> None:
        raise NotImplementedError
