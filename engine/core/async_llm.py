"""The server's front to the engine core, like upstream's AsyncLLM: asyncio
callers add requests at any time and read each request's tokens as they come.
A caller that stops reading (a client that went away) aborts its request,
which frees its KV blocks at once.

The core steps inside the event loop that serves the requests (`run()`), not
in a thread of its own: see run() for why."""
from __future__ import annotations

import asyncio
import itertools
import logging
import time
from dataclasses import dataclass
from typing import AsyncIterator

from engine.core.chunk_sizer import PromptChunkSizer
from engine.core.engine_core import EngineCore
from engine.core.sequence import Sequence
from engine.distributed.parallel_state import RankDiedError
from engine.entrypoints.openai.stream_pacer import StreamPacer
from engine.sampling_params import SamplingParams

logger = logging.getLogger("engine")


@dataclass
class RequestUpdate:
    """Tokens a request gained since its previous update."""

    new_token_ids: list[int]
    finish_reason: str | None = None  # set on the last update
    text: str | None = None  # the whole output's text, on the last update
    logprobs: list | None = None  # the new tokens' (logprob, top) when the request asks
    stop_reason: str | int | None = None  # the stop string or token id that ended it


@dataclass
class _Stream:
    queue: asyncio.Queue
    seq: Sequence
    arrival: float
    first_token: float | None = None
    last_token: float | None = None


HEALTH_POLL_S = 1.0  # how often an idle engine checks its ranks
# After a step this long (a prompt's chunk), the loop gets a few turns before the
# next one: a new HTTP request takes several (accept, read, the server's and the
# app's tasks, write), and one turn a step would make a /health probe wait
# several steps (long-prompt workload, worst /health during a 3000-token
# prefill: 0.30x of it with 4 turns, 0.19x with 12; a turn costs ~15 us).
LONG_STEP_S = 0.02
HTTP_TURNS = 12


class EngineDeadError(RuntimeError):
    pass


class RequestFailedError(RuntimeError):
    """A step that ran this request raised: the request ends, the engine goes on."""


class QueueFullError(RuntimeError):
    """The waiting queue is at its bound (max_waiting): try again later."""


class AsyncLLM:
    def __init__(self, core: EngineCore, stats=None, stream_interval: int | None = 1,
                 max_waiting: int | None = None):
        """stats: on_step(core) after each step and on_token(stream, now,
        finish_reason) per token (the server's Prometheus metrics); optional.
        stream_interval: hand tokens over every that many steps, None for
        auto (engine/entrypoints/openai/stream_pacer.py). max_waiting: the
        most sequences that may wait to run (None: no bound); add() past
        it raises QueueFullError."""
        self.core = core
        self.max_waiting = max_waiting
        self.stats = stats
        self.pacer = StreamPacer(stream_interval)
        self._adds: list[Sequence] = []
        self._aborts: list[str] = []
        self._streams: dict[str, _Stream] = {}
        self._unread: dict[str, _Stream] = {}  # added, and generate() not yet reading
        self._stopped = False
        self._idle: asyncio.Future | None = None  # run() waits on it when there is no work
        self.dead: BaseException | None = None
        self._ids = itertools.count()
        self.chunks = None  # prompt chunks sized to a step time (engine/core/chunk_sizer.py)
        # (replicas of -dp step in processes of their own: their scheduler view has no chunks)
        if getattr(core.scheduler, "enable_chunked_prefill", False):
            self.chunks = PromptChunkSizer(core.scheduler.max_num_batched_tokens)
            core.scheduler.prompt_tokens_cap = self.chunks.cap()

    async def run(self) -> None:
        """Step the core in this event loop until shutdown(); run it as a task
        beside the server, in the thread that loaded the model.

        Why in the loop. The kernels' OpenMP team belongs to the thread that
        opened its first parallel region (libgomp keeps one per thread); a
        second stepping thread makes a second team, libgomp then counts more
        threads than CPUs, stops spinning between regions, and every op pays a
        futex wake-up (on 2 cores a 512-wide linear 28 -> 122 us). And the
        tokens handed over are sent before the next step starts: HTTP work during a
        step would take a core from one of its OpenMP threads, and the whole
        team waits for the preempted one at the next barrier. Stepping here
        does both with no thread hop, no GIL hand-over and no wake-up per step
        (0.1-0.2 ms a step on 2 cores, a few percent of a 1-client decode).
        The price: the loop reads new requests between hand-offs, not during
        steps; the pacer says how many steps a hand-off waits."""
        loop = asyncio.get_running_loop()
        core, pacer = self.core, self.pacer
        clock = time.perf_counter
        try:
            while not self._stopped:
                if not (self._adds or self._aborts or core.has_unfinished()):
                    self._idle = loop.create_future()
                    await asyncio.wait([self._idle], timeout=HEALTH_POLL_S)
                    core.check_health()  # a rank that died while idle is heard of here
                    continue
                adds, self._adds = self._adds, []
                aborts, self._aborts = self._aborts, []
                for request_id in aborts:
                    core.abort(request_id)
                for seq in adds:
                    if seq.request_id in self._streams:  # not aborted before it started
                        core.add(seq)
                urgent = True
                if core.has_unfinished():
                    t0 = clock()
                    core.last_scheduled = []
                    try:
                        stepped = core.step()
                    except Exception as exc:  # noqa: BLE001 - fail its requests, not the engine
                        logger.exception("a step failed; its requests fail, the engine goes on")
                        self._fail(core.last_scheduled or list(core.requests.values()), exc)
                        stepped = []
                    urgent = self._publish(stepped)
                    took = clock() - t0
                    pacer.stepped(took)
                    if took >= LONG_STEP_S:
                        for _ in range(HTTP_TURNS):
                            await asyncio.sleep(0)
                    if self.chunks is not None:
                        self.chunks.stepped(sum(s.num_scheduled_tokens for s in core.last_scheduled
                                                if s.num_scheduled_tokens > 1), took)
                        core.scheduler.prompt_tokens_cap = self.chunks.cap()
                if self.stats is not None:
                    self.stats.on_step(core)
                if pacer.due(urgent or not core.has_unfinished()):
                    t0 = clock()
                    await _readers_ran(loop)
                    pacer.handed_over(clock() - t0)
        except Exception as exc:  # noqa: BLE001 - every waiting caller must hear of it
            if isinstance(exc, RankDiedError):  # one line: the rank and how it ended
                logger.error("engine loop stopped: %s", exc)
            else:
                logger.exception("engine loop failed")
            self.dead = exc
            streams, self._streams = list(self._streams.values()), {}
            for s in streams:
                s.queue.put_nowait(exc)

    def shutdown(self) -> None:
        """Make run() return after the step under way (call it in run()'s loop)."""
        self._stopped = True
        self._wake()

    # ---- callers ---------------------------------------------------------------

    def make_sequence(self, prompt, params: SamplingParams, index: int = 0) -> Sequence:
        """Tokenize and check a prompt (ValueError when it cannot run)."""
        return self.core.make_sequence(f"req-{next(self._ids)}", prompt, params, index)

    def num_waiting(self) -> int:
        """Sequences waiting to run: added, or back in the queue (preempted)."""
        added = sum(1 for s in self._adds if s.request_id in self._streams)  # not aborted
        return added + len(self.core.scheduler.waiting)

    def add(self, seqs: list[Sequence]) -> None:
        """Queue the sequences of one request, all or none: QueueFullError
        when they would take the waiting sequences past max_waiting. Read
        each with generate(); abort() those that will never be read."""
        if self.dead is not None:
            raise EngineDeadError(f"the engine loop stopped: {self.dead}")
        if self.max_waiting is not None and self.num_waiting() + len(seqs) > self.max_waiting:
            raise QueueFullError(f"{self.num_waiting()} sequences are waiting to run, the "
                                 f"server's bound is {self.max_waiting}; retry later")
        now = time.monotonic()
        for seq in seqs:
            stream = _Stream(asyncio.Queue(), seq, now)
            self._streams[seq.request_id] = self._unread[seq.request_id] = stream
            self._adds.append(seq)
        self._wake()

    async def generate(self, seq: Sequence) -> AsyncIterator[RequestUpdate]:
        """Run a sequence made by make_sequence (added now unless add() did);
        yields its updates, the last with finish_reason set. Closing the
        iterator early aborts the request."""
        if seq.request_id not in self._unread:
            self.add([seq])
        stream = self._unread.pop(seq.request_id)
        finished = False
        try:
            while True:
                update = await stream.queue.get()
                while not stream.queue.empty() and isinstance(update, RequestUpdate):
                    # steps handed over together, or a reader that fell behind: one update
                    more = stream.queue.get_nowait()
                    update = more if isinstance(more, BaseException) else _merged(update, more)
                if isinstance(update, RequestFailedError):
                    finished = True  # the engine dropped it already
                    raise update
                if isinstance(update, BaseException):
                    raise EngineDeadError(f"the engine loop stopped: {update}")
                finished = update.finish_reason is not None
                yield update
                if finished:
                    return
        finally:
            if not finished:
                self.abort(seq.request_id)

    def num_requests(self) -> int:
        """Requests added and not yet finished (upstream's server load)."""
        return len(self._streams)

    def abort(self, request_id: str) -> None:
        self._unread.pop(request_id, None)
        if self._streams.pop(request_id, None) is not None:
            self._aborts.append(request_id)
            self._wake()

    def _wake(self) -> None:
        if self._idle is not None and not self._idle.done():
            self._idle.set_result(None)

    def _fail(self, seqs: list[Sequence], exc: Exception) -> None:
        error = RequestFailedError(f"the request failed in the engine: "
                                   f"{type(exc).__name__}: {exc}")
        for seq in seqs:
            self.core.abort(seq.request_id)
            stream = self._streams.pop(seq.request_id, None)
            if stream is not None:
                stream.queue.put_nowait(error)

    def _publish(self, seqs: list[Sequence]) -> bool:
        """Queue each sequence's new token for its reader; True when one of
        them is a first token or a request's end (worth handing over now)."""
        now = time.monotonic()
        urgent = False
        for seq in seqs:
            stream = self._streams.get(seq.request_id)
            if stream is None:  # aborted
                continue
            reason = seq.finish_reason
            if reason is not None:
                del self._streams[seq.request_id]
                urgent = True
            elif seq.num_output_tokens == 1:
                urgent = True
            text = self.core.output_text(seq) if reason else None
            logprobs = seq.logprobs[-1:] if seq.params.logprobs is not None else None
            update = RequestUpdate([seq.token_ids[-1]], reason, text, logprobs,
                                   seq.stop_string if reason else None)
            if self.stats is not None:
                self.stats.on_token(stream, now, reason)
            stream.queue.put_nowait(update)
        return urgent


def _merged(a: RequestUpdate, b: RequestUpdate) -> RequestUpdate:
    logprobs = None if a.logprobs is None else a.logprobs + b.logprobs
    return RequestUpdate(a.new_token_ids + b.new_token_ids, b.finish_reason, b.text, logprobs,
                         b.stop_reason)


async def _readers_ran(loop: asyncio.AbstractEventLoop) -> None:
    """Return once the callbacks ready now have run: the readers woken by this
    step's tokens, which send them (and the loop polls its sockets once)."""
    done = loop.create_future()
    loop.call_soon(done.set_result, None)
    await done
