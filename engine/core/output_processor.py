"""The front end's side of every request (upstream V1's OutputProcessor): the
engine core sends token ids; here they become each request's tokens,
logprobs and text, through the request's one detokenizer, which also finds
its stop strings. A request a stop string ended is named back so that the
caller aborts it in the core. The server's requests each get a queue their
reader awaits; the offline LLM reads the states when the core is done."""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from engine.core.detokenizer import IncrementalDetokenizer
from engine.core.messages import EngineCoreOutput, EngineCoreRequest
from engine.core.sequence import PromptAndOutput
from engine.lora.request import LoRARequest
from engine.pooling_params import PoolingParams
from engine.sampling_params import SamplingParams


@dataclass
class RequestUpdate:
    """What a request gained since its previous update."""

    new_token_ids: list[int]
    finish_reason: str | None = None  # set on the last update
    text: str = ""  # the new text (streamed: stable text only; the rest on the last update)
    logprobs: list | None = None  # the new tokens' (logprob, top) when the request asks
    stop_reason: str | int | None = None  # the stop string or token id that ended it
    pooled: bytes | None = None  # a pooling request's vector (float32, little-endian)


class RequestFailedError(RuntimeError):
    """A step that ran this request raised: the request ends, the engine goes on."""


class EngineDeadError(RuntimeError):
    """The engine core stopped: every request ends."""


class RequestState(PromptAndOutput):
    """One request as the front end sees it: its prompt, its output so far,
    and when its tokens came (the server's latency metrics)."""

    def __init__(self, request_id: str, prompt: str | None, prompt_token_ids: list[int],
                 params: SamplingParams, index: int, tokenizer):
        self.request_id, self.prompt, self.params, self.index = request_id, prompt, params, index
        self.token_ids = list(prompt_token_ids)
        self.num_prompt_tokens = len(prompt_token_ids)
        self.logprobs: list = []
        self.prompt_logprobs: list = []
        self.finish_reason: str | None = None
        self.stop_reason: str | int | None = None
        self.text: str | None = None  # the output's text, once finished
        self.num_cached_tokens = 0
        self.tokenizer = tokenizer
        self._detokenizer: IncrementalDetokenizer | None = None
        self.queue: asyncio.Queue | None = None  # the server's reader, when one reads
        self.pending: RequestUpdate | None = None  # held back by the stream interval
        self.arrival_time = time.monotonic()
        self.scheduled_time: float | None = None  # first run in the core (monotonic)
        self.num_preemptions = 0
        self.engine_index = 0  # the data-parallel replica that runs it (/metrics' engine)
        self.request_n = 0  # /metrics: its request's n, on the first sequence of each prompt
        self.prompt_counted = False  # /metrics: its prompt's tokens counted
        self.first_token_time: float | None = None
        self.last_token_time: float | None = None
        # a pooling request's (params is then NO_SAMPLING): what it asks, its token
        # types, and its vector once done
        self.pooling_params: PoolingParams | None = None
        self.token_type_ids: list[int] | None = None
        self.pooled: bytes | None = None
        self.lora_request: LoRARequest | None = None  # its adapter (engine/lora)

    def core_request(self, client_index: int = 0) -> EngineCoreRequest:
        prompt = self.token_ids[:self.num_prompt_tokens]
        if self.pooling_params is not None:
            return EngineCoreRequest(self.request_id, prompt, None, time.time(), client_index,
                                     self.pooling_params, self.token_type_ids)
        return EngineCoreRequest(self.request_id, prompt, self.params, time.time(),
                                 client_index, lora_request=self.lora_request)

    @property
    def detokenizer(self) -> IncrementalDetokenizer:
        """Made at the first output: the params are final by then."""
        if self._detokenizer is None:
            p = self.params
            self._detokenizer = IncrementalDetokenizer(
                self.tokenizer, self.token_ids[:self.num_prompt_tokens], list(p.stop or ()),
                p.include_stop_str_in_output, p.min_tokens, p.skip_special_tokens)
        return self._detokenizer

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


class OutputProcessor:
    def __init__(self, on_output=None, stream_interval: int = 1):
        """on_output(state, num_tokens, now): before a request takes an
        output's tokens (the server's metrics read its times and reason)."""
        self.requests: dict[str, RequestState] = {}
        self.on_output = on_output
        # a reader hears of every stream_interval tokens (its first and last at once)
        self.stream_interval = stream_interval

    def add(self, state: RequestState) -> None:
        if state.request_id in self.requests:
            raise ValueError(f"request id {state.request_id!r} is already running")
        self.requests[state.request_id] = state

    def abort(self, request_id: str) -> RequestState | None:
        return self.requests.pop(request_id, None)

    def has_unfinished(self) -> bool:
        return bool(self.requests)

    def process_outputs(self, outputs: list[EngineCoreOutput]) -> list[str]:
        """Apply one step's outputs; the ids of requests a stop string ended
        (abort them in the core)."""
        now = time.monotonic()
        stopped = []
        for o in outputs:
            state = self.requests.get(o.request_id)
            if state is None:  # aborted, or ended by a stop string, while the core stepped
                continue
            update = self._apply(state, o, now)
            if state.finished:
                del self.requests[o.request_id]
                if o.finish_reason is None:
                    stopped.append(o.request_id)
            if state.queue is not None:
                self._hand_over(state, update)
        return stopped

    def _hand_over(self, state: RequestState, update: RequestUpdate) -> None:
        if state.pending is not None:
            update = merged(state.pending, update)
            state.pending = None
        first = len(update.new_token_ids) == state.num_output_tokens
        if (self.stream_interval > 1 and not first and update.finish_reason is None
                and len(update.new_token_ids) < self.stream_interval):
            state.pending = update
        else:
            assert state.queue is not None
            state.queue.put_nowait(update)

    def _apply(self, state: RequestState, o: EngineCoreOutput, now: float) -> RequestUpdate:
        state.engine_index = o.engine_index
        if o.pooled is not None:  # a pooling request: done, no text
            state.pooled, state.finish_reason = o.pooled, o.finish_reason or "stop"
            if self.on_output is not None:
                self.on_output(state, 0, now)
            state.first_token_time = state.last_token_time = now
            return RequestUpdate([], state.finish_reason, pooled=o.pooled)
        ids = o.new_token_ids
        detok = state.detokenizer
        kept = detok.add(ids)
        reason = o.finish_reason
        stop_reason: str | int | None = o.stop_reason
        if kept is not None:  # a stop string: the tokens after it never happened
            ids, reason, stop_reason = ids[:kept], "stop", detok.stop_string
        state.token_ids += ids
        logprobs = None
        if o.new_logprobs is not None:
            logprobs = o.new_logprobs[:len(ids)]
            state.logprobs += logprobs
        if o.prompt_logprobs is not None:
            state.prompt_logprobs = o.prompt_logprobs
        if state.first_token_time is None:
            state.num_cached_tokens = o.num_cached_tokens
        if o.scheduled_time:
            state.scheduled_time = o.scheduled_time
        state.num_preemptions = max(state.num_preemptions, o.num_preemptions)
        state.finish_reason, state.stop_reason = reason, stop_reason
        if self.on_output is not None:
            self.on_output(state, len(ids), now)
        state.first_token_time = state.first_token_time or now
        state.last_token_time = now
        if reason is None:
            return RequestUpdate(ids, None, detok.delta(), logprobs)
        shown = state.output_token_ids
        if reason == "stop" and kept is None and not state.params.include_stop_str_in_output:
            shown = shown[:-1]  # the stop token (eos, stop_token_ids): its text left out
        elif reason == "stop" and kept is None and stop_reason is None:
            shown = shown[:-1]  # eos is never shown, as upstream
        state.text = detok.final_text(shown)
        return RequestUpdate(ids, reason, detok.delta(state.text), logprobs, stop_reason)

    def fail(self, request_ids, error: BaseException) -> None:
        """End these requests with `error` (their step raised, or the core died)."""
        for request_id in request_ids:
            state = self.requests.pop(request_id, None)
            if state is not None and state.queue is not None:
                state.queue.put_nowait(error)


def merged(a: RequestUpdate, b: RequestUpdate) -> RequestUpdate:
    """Two updates of one request as one (b came after a)."""
    logprobs = None if a.logprobs is None else a.logprobs + (b.logprobs or [])
    return RequestUpdate(a.new_token_ids + b.new_token_ids, b.finish_reason, a.text + b.text,
                         logprobs, b.stop_reason, b.pooled or a.pooled)
