"""What the API server may ask of the engine (upstream's EngineClient): the
only door from engine/entrypoints/ into the engine, enforced by the
import-linter contracts in pyproject.toml. AsyncLLM is the one
implementation; a test can stand in another."""
from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from tokenizers import Tokenizer

    from engine.config import ModelConfig
    from engine.core.messages import SchedulerStats
    from engine.core.output_processor import RequestState, RequestUpdate
    from engine.pooling_params import PoolingParams
    from engine.sampling_params import SamplingParams


class EngineClient(Protocol):
    model_config: ModelConfig
    tokenizer: Tokenizer
    max_model_len: int
    max_waiting: int | None  # requests that may wait for their first step (None: no bound)
    dead: str | None  # why the engine core stopped, once it has
    scheduler_stats: SchedulerStats  # as of the core's last step
    pooling_tasks: tuple[str, ...]  # a pooling engine's tasks; () : it generates

    async def make_request(self, prompt, params: SamplingParams, index: int = 0,
                           add_special_tokens: bool = True,
                           request_id: str | None = None) -> RequestState: ...

    async def make_pooling_request(self, prompt, params: PoolingParams, index: int = 0,
                                   pair: str | None = None, add_special_tokens: bool = True
                                   ) -> RequestState: ...

    def add(self, states: list[RequestState]) -> None: ...

    def generate(self, state: RequestState) -> AsyncIterator[RequestUpdate]: ...

    def abort(self, request_id: str) -> None: ...

    def num_requests(self) -> int: ...

    async def tokenize(self, text: str, add_special_tokens: bool = True) -> list[int]: ...

    def detokenize(self, ids: list[int]) -> str: ...
