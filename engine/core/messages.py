"""What the API server and the engine core process say to each other (upstream
V1's EngineCoreRequest / EngineCoreOutputs): msgspec structs, msgpack on a ZMQ
socket. The front end tokenizes, checks and detokenizes; the core only ever
sees token ids and sends token ids back."""
from __future__ import annotations

import enum

import msgspec

from engine.lora.request import LoRARequest
from engine.pooling_params import PoolingParams
from engine.sampling_params import SamplingParams
from engine.spec_decode.metrics import SpecDecodingStats


class RequestType(bytes, enum.Enum):
    """The first frame of a message to the core."""

    ADD = b"\x00"
    ABORT = b"\x01"
    SHUTDOWN = b"\x02"


class EngineCoreRequest(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams | None  # None for a pooling request
    arrival_time: float = 0.0
    client_index: int = 0  # which API server process hears its outputs
    pooling_params: PoolingParams | None = None  # a pooling engine's request (upstream's)
    token_type_ids: list[int] | None = None  # BERT's token types (a pair's second text: 1)
    lora_request: LoRARequest | None = None  # its adapter (--enable-lora); None: the base


class EngineCoreOutput(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    """What one step did to one request."""

    request_id: str
    new_token_ids: list[int]
    # per new token (logprob, [(id, logprob) of the top k]) when the request asks
    new_logprobs: list | None = None
    # per prompt token after the first (logprob, rank, top k), once, with the first token
    prompt_logprobs: list | None = None
    finish_reason: str | None = None  # "stop" | "length"; set on its last output
    stop_reason: int | None = None  # the stop token id that ended it
    num_cached_tokens: int = 0  # prompt tokens the prefix cache had (first output only)
    # /metrics: when the request first ran (time.monotonic, machine-wide; first output
    # only) and how often it was preempted (last output only)
    scheduled_time: float = 0.0
    num_preemptions: int = 0
    # a pooling request's vector: float32 little-endian bytes (what base64 sends as is)
    pooled: bytes | None = None
    engine_index: int = 0  # -dp N: the replica that runs it


class SchedulerStats(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    """The scheduler and KV cache after a step: what /metrics shows."""

    num_running_reqs: int = 0
    num_waiting_reqs: int = 0
    kv_cache_usage: float = 0.0
    prefix_cache_queries: int = 0  # totals since start (prompt tokens looked up)
    prefix_cache_hits: int = 0
    num_preemptions: int = 0
    spec_decoding: SpecDecodingStats | None = None  # with --speculative-config: totals
    num_scheduled_tokens: int = 0  # the step's tokens (vllm:iteration_tokens_total)
    engine_index: int = 0  # the data-parallel replica these are of (/metrics' `engine`)
    # -dp N: the sum above, and each replica's own (its steps since the last
    # outputs, then its latest), which /metrics labels by engine_index
    replicas: list[SchedulerStats] = []


class EngineCoreOutputs(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    outputs: list[EngineCoreOutput] = []
    scheduler_stats: SchedulerStats | None = None
    timestamp: float = 0.0
    # a step that raised: its requests end with this line, the engine goes on
    failed_request_ids: list[str] = []
    failure: str | None = None
    # the core is going down (a rank died): every request ends, the server exits
    engine_dead: str | None = None


class EngineCoreReady(msgspec.Struct, array_like=True, tag=True, gc=False):
    """The core's first message, once the model is loaded and warm."""

    max_model_len: int
    num_blocks: int
    block_size: int
    dtype: str
    max_num_batched_tokens: int
    warm_up_s: float
    # a pooling engine's tasks (engine.pooler_config.PoolerConfig.tasks); () : it generates
    pooling_tasks: list[str] = []


class EngineCoreFailed(msgspec.Struct, array_like=True, tag=True, gc=False):
    """The core could not start: one line saying why."""

    error: str


Handshake = EngineCoreReady | EngineCoreFailed
