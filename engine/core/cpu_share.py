"""The API server's CPU-heavy jobs, told to the engine core, so that its
OpenMP team steps on the CPUs those jobs leave.

The core's team takes every CPU it is given. A 10 MB /tokenize or a slow
chat template in the API server then takes one of them too: the team's
barriers wait for a thread the kernel has descheduled, and every step
crawls (2 cores: a one-token completion beside such a job took 0.7-1.7 s
instead of ~60 ms). So the API server marks each job it hands to a worker
thread in a small shared file of start times (one row of slots per API
server), and the core, before each step, runs its team on one thread fewer
for each job that has run longer than HEAVY_AFTER_S, never fewer than one.
Jobs shorter than that (a chat template's usual milliseconds) never change
the team."""
from __future__ import annotations

import asyncio
import mmap
import struct
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import TypeVar

SLOTS = 16  # jobs marked at once per API server; more run unmarked
HEAVY_AFTER_S = 0.02
_SLOT = struct.Struct("d")
T = TypeVar("T")


def create(path: str, servers: int) -> str:
    """The shared file, all slots free (0.0), for `servers` API servers."""
    with open(path, "wb") as f:
        f.write(bytes(_SLOT.size * SLOTS * servers))
    return path


class Marks:
    """An API server's row: a slot holds a running job's start time."""

    def __init__(self, path: str, server: int):
        with open(path, "r+b") as f:
            self._map = mmap.mmap(f.fileno(), 0)
        first = server * SLOTS
        self._free = list(range(first, first + SLOTS))
        self._lock = threading.Lock()

    @contextmanager
    def running(self, known_long: bool = False):
        """known_long: the job is long from its start (a large body), so the
        core need not wait HEAVY_AFTER_S to count it."""
        with self._lock:
            slot = self._free.pop() if self._free else None
        if slot is None:
            yield
            return
        start = time.monotonic() - (HEAVY_AFTER_S * 2 if known_long else 0.0)
        _SLOT.pack_into(self._map, slot * _SLOT.size, start)
        try:
            yield
        finally:
            _SLOT.pack_into(self._map, slot * _SLOT.size, 0.0)
            with self._lock:
                self._free.append(slot)


class TeamSize:
    """The core's side: the OpenMP team for the next step."""

    def __init__(self, path: str, threads: int, set_threads: Callable[[int], None]):
        with open(path, "rb") as f:
            self._map = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
        self._starts = struct.Struct(f"{len(self._map) // _SLOT.size}d")
        self.threads = self.now = threads
        self._set = set_threads

    def busy(self, now: float) -> int:
        return sum(1 for t in self._starts.unpack_from(self._map) if t and now - t > HEAVY_AFTER_S)

    def adjust(self) -> int:
        """Resize the team for what the API servers run now; its size."""
        want = max(1, self.threads - self.busy(time.monotonic()))
        if want != self.now:
            self._set(want)
            self.now = want
        return want


_marks: Marks | None = None  # this API server's row, once attach() ran


def attach(path: str, server: int) -> None:
    global _marks
    _marks = Marks(path, server) if path else None


@contextmanager
def heavy(known_long: bool = False):
    """Mark what runs inside (on any thread, the event loop's included) as one
    job; known_long: counted by the core at once (Marks.running)."""
    if _marks is None:
        yield
    else:
        with _marks.running(known_long):
            yield


# Worker threads started with the server. The executor starts one on a job's
# submit, and the event loop waits for it to run: 36 ms beside an engine core
# that keeps both CPUs busy, a freeze at the start of every heavy request.
WORKERS = 2
IDLE_WAIT_S = 1.0


async def start_workers(n: int = WORKERS) -> None:
    """n of the event loop's worker threads started now, all at once (a
    barrier keeps each busy until the last has started), and idle on return."""
    loop = asyncio.get_running_loop()
    executor = ThreadPoolExecutor(thread_name_prefix="asyncio")  # asyncio's own default
    loop.set_default_executor(executor)
    barrier = threading.Barrier(n)
    await asyncio.gather(*(loop.run_in_executor(None, barrier.wait, 5.0) for _ in range(n)))
    # A worker counts itself idle only after its job's result is out, and a
    # submit that finds none idle starts another thread: the first jobs after
    # this sometimes did (a full test run on two busy cores). CPython keeps
    # that count in the executor's _idle_semaphore; wait for all n in it.
    idle = getattr(executor, "_idle_semaphore", None)
    deadline = time.monotonic() + IDLE_WAIT_S
    while idle is not None and time.monotonic() < deadline:
        marks = sum(idle.acquire(timeout=0) for _ in range(n))
        for _ in range(marks):
            idle.release()
        if marks == n:
            return
        await asyncio.sleep(0.001)


async def in_thread(fn: Callable[..., T], *args) -> T:
    """fn(*args) in the event loop's worker threads, marked for the core meanwhile."""
    with heavy():
        return await asyncio.get_running_loop().run_in_executor(None, fn, *args)
