"""The offline API of a pooling model, as upstream vLLM's LLM has it:

    llm = LLM(model="path/to/bert", dtype="float32")       # --runner auto: pooling
    llm.embed(["a text", ...])[0].outputs.embedding         # list[float]
    llm.classify(["a text"])[0].outputs.probs               # list[float], one per class
    llm.score("a query", ["doc 1", "doc 2"])[0].outputs.score

score() runs a cross-encoder over each pair (a reranker), or, for an
embedding model, is the cosine similarity of the two texts' embeddings."""
from __future__ import annotations

import itertools
from collections.abc import Sequence as Seq
from dataclasses import dataclass
from typing import Any

import numpy as np

from engine.core.input_processor import InputProcessor
from engine.core.output_processor import OutputProcessor, RequestState
from engine.pooling_params import PoolingParams

_batches = itertools.count()  # request ids unique across every LLM of the process

@dataclass
class EmbeddingOutput:
    embedding: list[float]


@dataclass
class ClassificationOutput:
    probs: list[float]


@dataclass
class ScoringOutput:
    score: float


@dataclass
class PoolingRequestOutput:
    request_id: str
    prompt_token_ids: list[int]
    outputs: EmbeddingOutput | ClassificationOutput | ScoringOutput
    finished: bool = True


def vector(state: RequestState) -> np.ndarray:
    assert state.pooled is not None, "a finished pooling request has its vector"
    return np.frombuffer(state.pooled, dtype="<f4")


class PoolingMixin:
    """LLM's pooling methods (engine.entrypoints.llm)."""

    core: Any  # the LLM's engine core (engine.executor.data_parallel.engine_core)
    processor: InputProcessor

    def _tasks(self) -> tuple[str, ...]:
        pooler = self.core.engine_config.pooler
        return () if pooler is None else pooler.tasks

    def _check(self, task: str) -> None:
        if task not in self._tasks():
            has = ", ".join(self._tasks()) or "text generation only"
            raise ValueError(f"{task}: this model serves {has} (--runner pooling, --convert)")

    def _pool(self, prompts, params: PoolingParams, pairs=None) -> list[RequestState]:
        core = self.core
        config = core.engine_config.model
        pooler = core.engine_config.pooler
        params.check(config.hidden_size, list(pooler.matryoshka or ()) if pooler else None)
        types = config.hf.get("type_vocab_size", 0) > 1
        batch = next(_batches)
        states = [self.processor.pooling_request(
            f"pool-{batch}-{i}", p, params, i, pairs[i] if pairs else None, types)
            for i, p in enumerate(prompts)]
        output = OutputProcessor()
        for state in states:
            output.add(state)
            core.add_request(state.core_request())
        try:
            while core.has_unfinished():
                outs = core.step()
                if outs.failed_request_ids:
                    raise RuntimeError(f"input(s) {', '.join(outs.failed_request_ids)} "
                                       f"failed: {outs.failure}")
                output.process_outputs(outs.outputs)
        except BaseException:
            core.abort_requests([s.request_id for s in states])
            raise
        return states

    def embed(self, prompts, pooling_params: PoolingParams | None = None
              ) -> list[PoolingRequestOutput]:
        """One embedding per prompt (a string or token ids), in order."""
        self._check("embed")
        params = pooling_params or PoolingParams()
        params.task = "embed"
        return [PoolingRequestOutput(s.request_id, s.token_ids, EmbeddingOutput(
            vector(s).tolist())) for s in self._pool(_listed(prompts), params)]

    def classify(self, prompts, pooling_params: PoolingParams | None = None
                 ) -> list[PoolingRequestOutput]:
        """Class probabilities (softmax; sigmoid for one label) per prompt."""
        self._check("classify")
        params = pooling_params or PoolingParams()
        params.task = "classify"
        return [PoolingRequestOutput(s.request_id, s.token_ids, ClassificationOutput(
            vector(s).tolist())) for s in self._pool(_listed(prompts), params)]

    def score(self, data_1: str | Seq[str], data_2: str | Seq[str]
              ) -> list[PoolingRequestOutput]:
        """Relevance of each pair: one data_1 text against every data_2 text,
        or the two lists pairwise."""
        self._check("score")
        firsts, seconds = score_pairs(data_1, data_2)
        head = self.core.engine_config.pooler.head
        if head == "classify":  # a cross-encoder reads each pair whole
            states = self._pool(firsts, PoolingParams(task="score"), seconds)
            return [PoolingRequestOutput(s.request_id, s.token_ids, ScoringOutput(
                float(vector(s)[0]))) for s in states]
        states = self._pool(firsts + seconds, PoolingParams(task="embed", normalize=True))
        n = len(firsts)
        return [PoolingRequestOutput(a.request_id, a.token_ids + b.token_ids, ScoringOutput(
            float(np.dot(vector(a), vector(b))))) for a, b in zip(states[:n], states[n:])]


def score_pairs(data_1: str | Seq[str], data_2: str | Seq[str]) -> tuple[list[str], list[str]]:
    """(firsts, seconds): one text against many, or two lists of one length."""
    a = [data_1] if isinstance(data_1, str) else list(data_1)
    b = [data_2] if isinstance(data_2, str) else list(data_2)
    if not a or not b:
        raise ValueError("score needs at least one text on each side")
    if len(a) == 1:
        a = a * len(b)
    if len(a) != len(b):
        raise ValueError(f"score pairs one text with many, or two lists of one length; got "
                         f"{len(a)} and {len(b)}")
    return a, b


def _listed(prompts) -> list:
    if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
        return [prompts]
    return list(prompts)

