"""The API server's engine client (upstream V1's AsyncLLM): it tokenizes
and checks prompts, sends them to the engine core process, and turns the
core's outputs into each request's updates, text included, for the request
handlers that await them. The core steps in its own process, so nothing here
waits for a step: the event loop only ever waits for its sockets.

A caller that stops reading (a client that went away) aborts its request,
which frees its KV blocks in the core at once."""
from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import AsyncIterator

from engine.core.core_client import AsyncMPClient, CoreProcess
from engine.core.input_processor import OFFLOAD_CHARS, InputProcessor
from engine.core.messages import EngineCoreOutputs, EngineCoreReady, SchedulerStats
from engine.core.output_processor import (
    EngineDeadError,
    OutputProcessor,
    RequestFailedError,
    RequestState,
    RequestUpdate,
    merged,
)
from engine.pooling_params import PoolingParams
from engine.sampling_params import MAX_LOGPROBS, SamplingParams

logger = logging.getLogger("engine")

__all__ = ["AsyncLLM", "EngineDeadError", "QueueFullError", "RequestFailedError",
           "RequestUpdate"]


class QueueFullError(RuntimeError):
    """The waiting queue is at its bound (max_waiting): try again later."""


class AsyncLLM:
    """An EngineClient (engine/core/engine_client.py) over one engine core."""

    def __init__(self, client: AsyncMPClient, ready: EngineCoreReady, model_config, tokenizer,
                 stats=None, max_waiting: int | None = None, stream_interval: int | None = 1,
                 max_logprobs: int = MAX_LOGPROBS):
        """stats: the server's metrics (on_output per request output,
        on_stats per step); max_waiting: the most requests that may wait
        for their first step (None: no bound)."""
        self.client, self.ready = client, ready
        self.model_config, self.tokenizer = model_config, tokenizer
        self.max_model_len = ready.max_model_len
        self.pooling_tasks = tuple(ready.pooling_tasks)  # () : the engine generates
        # BERT reads token types: a pair's second text is sent as type 1
        self.token_types = model_config.hf.get("type_vocab_size", 0) > 1
        self.max_waiting = max_waiting
        self.stats = stats
        self.processor = InputProcessor(tokenizer, model_config.vocab_size, ready.max_model_len,
                                        max_logprobs)
        self.output = OutputProcessor(stats.on_output if stats is not None else None,
                                      stream_interval or 1)
        self.scheduler_stats = SchedulerStats()
        self.dead: str | None = None
        self._unread: set[str] = set()  # added, and generate() not yet reading
        self._ids = itertools.count()
        self._prefix = f"req-{client.client_index}-"
        self._reader: asyncio.Task | None = None
        self._sentinel: int | None = None
        self._on_dead = None
        self._aborts: list[str] = []
        self._abort_task: asyncio.Task | None = None

    # ---- life ------------------------------------------------------------------

    def start(self, on_dead=None) -> None:
        """Read the core's outputs in this event loop; on_dead(line) once the
        core is gone (it died, or said it is dying)."""
        self._on_dead = on_dead
        self._reader = asyncio.ensure_future(self._read_outputs())
        self._sentinel = self.client.core.sentinel()
        if self._sentinel is not None:  # the kernel says the moment it exits, kill -9 included
            asyncio.get_running_loop().add_reader(self._sentinel, self._core_exited)

    async def run(self, on_dead=None) -> None:
        """start(), then wait until shutdown() (a task beside the server)."""
        self.start(on_dead)
        assert self._reader is not None
        try:
            await self._reader
        except asyncio.CancelledError:
            pass

    def shutdown(self) -> None:
        if self._sentinel is not None:
            try:
                asyncio.get_running_loop().remove_reader(self._sentinel)
            except RuntimeError:
                pass
        if self._reader is not None:
            self._reader.cancel()
        self.client.shutdown()

    def _core_exited(self) -> None:
        assert self._sentinel is not None
        asyncio.get_running_loop().remove_reader(self._sentinel)
        self._sentinel = None
        self._die(self.client.core.how_it_ended())

    @property
    def stopped_cleanly(self) -> bool:
        """The core exited 0 (it was told to stop), rather than died."""
        return self.client.core.stopped_cleanly()

    def _die(self, line: str) -> None:
        if self.dead is not None:
            return
        self.dead = line
        logger.error("%s", line)
        self.output.fail(list(self.output.requests), EngineDeadError(line))
        if self._on_dead is not None:
            self._on_dead(line)

    async def _read_outputs(self) -> None:
        try:
            await self.client.on_outputs(self._apply)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - a bad message is the end of the link
            logger.exception("reading the engine core's outputs failed")
            self._die(f"the engine core's outputs could not be read: {exc}")

    def _apply(self, outs: EngineCoreOutputs) -> None:
        stopped = self.output.process_outputs(outs.outputs)
        if stopped:
            self._abort_in_core(stopped)
        if outs.failed_request_ids:
            self.output.fail(outs.failed_request_ids,
                             RequestFailedError(f"the request failed in the engine: "
                                                f"{outs.failure}"))
        if outs.scheduler_stats is not None:
            self.scheduler_stats = outs.scheduler_stats
            if self.stats is not None:
                self.stats.on_stats(outs.scheduler_stats)
        if outs.engine_dead is not None:
            self._die(outs.engine_dead)

    # ---- callers ---------------------------------------------------------------

    async def make_request(self, prompt, params: SamplingParams, index: int = 0,
                           add_special_tokens: bool = True,
                           request_id: str | None = None) -> RequestState:
        """Tokenize (off the event loop when long) and check a prompt: a
        string or token ids (ValueError when it cannot run). request_id: the
        caller's (X-Request-Id), made unique here (clients may repeat one)."""
        request_id = f"{request_id or self._prefix}{next(self._ids)}"
        if isinstance(prompt, str):
            ids = await self.processor.tokenize_async(prompt, add_special_tokens)
            return self.processor.from_token_ids(request_id, ids, params, index, prompt)
        return self.processor.from_token_ids(request_id, list(prompt), params, index)

    async def make_pooling_request(self, prompt, params: PoolingParams, index: int = 0,
                                   pair: str | None = None, add_special_tokens: bool = True
                                   ) -> RequestState:
        """A checked pooling request (ValueError naming input {index}): a
        text, a (text, pair) of a cross-encoder, or token ids."""
        request_id = f"{self._prefix}{next(self._ids)}"
        if isinstance(prompt, str) and pair is None and len(prompt) > OFFLOAD_CHARS:
            # off the event loop
            prompt = await self.processor.tokenize_async(prompt, add_special_tokens)
        return self.processor.pooling_request(request_id, prompt, params, index, pair,
                                              self.token_types, add_special_tokens)

    def num_waiting(self) -> int:
        """Requests that have not had their first token yet."""
        return sum(1 for s in self.output.requests.values() if s.first_token_time is None)

    def add(self, states: list[RequestState]) -> None:
        """Send the requests of one call to the core, all or none:
        QueueFullError when they would take the waiting ones past
        max_waiting. Read each with generate(); abort() those that will
        never be read."""
        if self.dead is not None:
            raise EngineDeadError(f"the engine core stopped: {self.dead}")
        if self.max_waiting is not None and self.num_waiting() + len(states) > self.max_waiting:
            raise QueueFullError(f"{self.num_waiting()} sequences are waiting to run, the "
                                 f"server's bound is {self.max_waiting}; retry later")
        for state in states:
            state.queue = asyncio.Queue()
            self.output.add(state)
            self._unread.add(state.request_id)
            self.client.send_request(state.core_request(self.client.client_index))

    async def generate(self, state: RequestState) -> AsyncIterator[RequestUpdate]:
        """Run a request made by make_request (added now unless add() did);
        yields its updates, the last with finish_reason set. Closing the
        iterator early aborts the request."""
        if state.request_id not in self._unread:
            self.add([state])
        self._unread.discard(state.request_id)
        queue = state.queue
        assert queue is not None  # add() gave it one
        finished = False
        try:
            while True:
                update = await queue.get()
                while not queue.empty() and isinstance(update, RequestUpdate):
                    # outputs that came together, or a reader that fell behind: one update
                    more = queue.get_nowait()
                    update = more if isinstance(more, BaseException) else merged(update, more)
                if isinstance(update, BaseException):
                    finished = True  # the core dropped it already
                    raise update
                finished = update.finish_reason is not None
                yield update
                if finished:
                    return
        finally:
            if not finished:
                self.abort(state.request_id)

    def num_requests(self) -> int:
        """Requests added and not yet finished (upstream's server load)."""
        return len(self.output.requests)

    def abort(self, request_id: str) -> None:
        self._unread.discard(request_id)
        if self.output.abort(request_id) is not None:
            self._abort_in_core([request_id])

    def _abort_in_core(self, request_ids: list[str]) -> None:
        if self.dead is None:
            self._aborts += request_ids
            if self._abort_task is None or self._abort_task.done():
                self._abort_task = asyncio.ensure_future(self._send_aborts())

    async def _send_aborts(self) -> None:
        while self._aborts:
            ids, self._aborts = self._aborts, []
            await self.client.abort_requests(ids)

    async def tokenize(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return await self.processor.tokenize_async(text, add_special_tokens)

    def detokenize(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids)


def start_engine(core: CoreProcess, interrupted=lambda: False
                 ) -> tuple[AsyncMPClient, EngineCoreReady]:
    """Start the engine core process, as this process's one client of it, and
    wait until it is ready (minutes, for a large model): EngineCoreStartError
    with the core's one line when it cannot load the model, Interrupted when
    interrupted() turns true; the core is stopped either way."""
    client = None
    try:
        client = AsyncMPClient(core)
        core.start()
        return client, client.wait_ready(interrupted)
    except BaseException:
        from engine.core.core_client import LOADING_STOP_GRACE_S

        if client is not None:
            client.shutdown(LOADING_STOP_GRACE_S)
        else:
            core.stop(LOADING_STOP_GRACE_S)
        raise
