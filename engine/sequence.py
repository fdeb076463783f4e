from __future__ import annotations

import enum
import itertools

import torch

from engine.sampling_params import SamplingParams

_ids = itertools.count()


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class Sequence:
    """One request: its tokens (prompt then output), its KV blocks, its state."""

    def __init__(self, prompt_token_ids: list[int], params: SamplingParams, prompt: str | None,
                 index: int):
        self.seq_id = next(_ids)
        self.index = index  # position in the caller's prompt list
        self.prompt = prompt
        self.token_ids = list(prompt_token_ids)
        self.num_prompt_tokens = len(prompt_token_ids)
        self.params = params
        self.status = Status.WAITING
        self.block_table: list[int] = []
        self.num_cached_tokens = 0  # tokens whose K/V are in the cache
        self.finish_reason: str | None = None
        self.text = ""
        self.generator = None
        if params.seed is not None:
            self.generator = torch.Generator().manual_seed(params.seed)
        self.preemptions = 0

    def __len__(self) -> int:
        return len(self.token_ids)

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens:]

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens
