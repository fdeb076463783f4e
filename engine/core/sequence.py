"""A request as the engine core holds it (upstream V1's Request): its tokens,
KV blocks and status. Text never reaches the core: the front end detokenizes."""
from __future__ import annotations

import enum
import itertools

import torch

from engine.lora.request import LoRARequest
from engine.pooling_params import PoolingParams
from engine.sampling_params import SamplingParams

_ids = itertools.count()


class RequestStatus(enum.IntEnum):
    WAITING = enum.auto()
    RUNNING = enum.auto()
    PREEMPTED = enum.auto()  # waiting again, its blocks freed; recomputed when admitted
    FINISHED_STOPPED = enum.auto()
    FINISHED_LENGTH_CAPPED = enum.auto()
    FINISHED_ABORTED = enum.auto()

    @property
    def finished(self) -> bool:
        return self >= RequestStatus.FINISHED_STOPPED

    @property
    def finish_reason(self) -> str | None:
        return _REASONS.get(self)


_REASONS = {RequestStatus.FINISHED_STOPPED: "stop",
            RequestStatus.FINISHED_LENGTH_CAPPED: "length",
            RequestStatus.FINISHED_ABORTED: "abort"}


class PromptAndOutput:
    """token_ids: the prompt's num_prompt_tokens, then the output's (a
    request in the core, and its state in the front end)."""

    token_ids: list[int]
    num_prompt_tokens: int

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens:]

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens


class Sequence(PromptAndOutput):
    """One request: its tokens (prompt then output), its KV blocks, its state."""

    def __init__(self, prompt_token_ids: list[int], params: SamplingParams,
                 request_id: str | None = None, client_index: int = 0):
        self.seq_id = next(_ids)
        self.request_id = request_id if request_id is not None else str(self.seq_id)
        self.client_index = client_index  # the API server process that hears its outputs
        self.status = RequestStatus.WAITING
        self.token_ids = list(prompt_token_ids)
        self.num_prompt_tokens = len(prompt_token_ids)
        self.params = params
        self.block_table: list[int] = []
        self.num_computed_tokens = 0  # tokens whose K/V are in the cache
        self.num_scheduled_tokens = 0  # tokens the current step computes
        self.block_hashes: list[bytes] = []  # prefix caching: the chain over its full blocks
        self.num_cached_blocks = 0  # of its blocks, those named in the prefix cache
        self.num_named_tokens = 0  # its tokens whose parts of blocks are named (PARTIAL_TOKENS)
        # (source block, its block, tokens): K/V rows of a partial prefix hit that the
        # step admitting it copies (engine/core/kv_cache_manager.py); None after it
        self.kv_copy: tuple[int, int, int] | None = None
        self.stop_reason: int | None = None  # the stop token that ended it
        self.num_cached_tokens = -1  # prompt tokens found cached when first admitted
        self.prompt_logprobs_sent = False
        # /metrics: when it first ran (monotonic; sent once), how often it was preempted
        self.first_scheduled: float | None = None
        self.scheduled_sent = False
        self.num_preemptions = 0
        self.logprobs: list = []  # per output token, when params.logprobs is set (sampler)
        # per prompt token after the first, when params.prompt_logprobs is set (model runner):
        # (logprob, rank, [(id, logprob) of the top k])
        self.prompt_logprobs: list = []
        self._generator: torch.Generator | None = None
        # structured outputs (engine/structured_output): the compile under way, then
        # the matcher; reasoning_ended: the constraint applies from here on
        self.grammar_pending = None
        self.grammar = None
        self.reasoning_ended = True
        # a pooling request's (engine/core/pooling_scheduler.py): what it asks, and
        # its tokens' types (a cross-encoder's pair), None for all of type 0
        self.pooling_params: PoolingParams | None = None
        self.token_type_ids: list[int] | None = None
        # speculative decoding (engine/spec_decode): the drafts of its next tokens
        # that the step verifies after its last token, and how many it accepted
        self.spec_token_ids: list[int] = []
        self.num_accepted_drafts = 0
        self.lora_request: LoRARequest | None = None  # its adapter (engine/lora); None: the base

    @property
    def finish_reason(self) -> str | None:
        return self.status.finish_reason

    def __len__(self) -> int:
        return len(self.token_ids)

    def generator(self, device: torch.device) -> torch.Generator | None:
        """The request's seeded generator, made on the device that samples (a
        CPU generator cannot drive sampling on another device); None: unseeded."""
        if self.params.seed is None:
            return None
        if self._generator is None:
            self._generator = torch.Generator(device=device).manual_seed(self.params.seed)
        return self._generator

    @property
    def samples(self) -> bool:
        """Whether the current step reaches the sequence's last token (and so
        samples the next one); a partial prefill chunk does not."""
        return (self.num_computed_tokens + self.num_scheduled_tokens
                == len(self.token_ids) + len(self.spec_token_ids))

    @property
    def prompt_logprob_positions(self) -> range:
        """The positions of this step whose logits give a prompt token's
        logprob (position p scores token p + 1), each scored once: a
        recomputed (preempted) sequence does not score its prompt again."""
        if self.params.prompt_logprobs is None:
            return range(0)
        start = max(self.num_computed_tokens, len(self.prompt_logprobs))
        return range(start, min(self.num_computed_tokens + self.num_scheduled_tokens,
                                self.num_prompt_tokens - 1))
