"""The offline API, shaped like upstream vLLM's:

    from engine import LLM, SamplingParams
    llm = LLM(model="path/to/checkpoint", dtype="float32")
    outs = llm.generate(["Hello"], SamplingParams(temperature=0, max_tokens=32))
    outs[0].outputs[0].text, outs[0].outputs[0].token_ids
"""
from __future__ import annotations

import itertools
import os
from dataclasses import dataclass, field
from typing import Sequence as Seq

from engine.core.sequence import Sequence
from engine.executor.data_parallel import engine_core
from engine.sampling_params import SamplingParams, with_model_defaults


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None


@dataclass
class RequestOutput:
    request_id: int
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput] = field(default_factory=list)
    finished: bool = True


class LLM:
    """Runs prompts to completion on an EngineCore (the same core the server
    drives; with data_parallel_size > 1 the front of that many); keyword
    arguments are EngineCore's."""

    _batches = itertools.count()

    def __init__(self, model: str | os.PathLike, dtype: str = "auto", **kwargs):
        self.core = engine_core(model, dtype, **kwargs)

    def get_default_sampling_params(self) -> SamplingParams:
        """As upstream: the checkpoint's generation_config.json sampling fields
        where it has them, else SamplingParams' defaults."""
        return SamplingParams(**with_model_defaults({}, self.core.config.generation_defaults))

    def get_tokenizer(self):
        return self.core.tokenizer

    # ---- generation ----------------------------------------------------------

    def generate(self, prompts=None, sampling_params: SamplingParams | Seq[SamplingParams] | None = None,
                 *, prompt_token_ids: list[list[int]] | None = None) -> list[RequestOutput]:
        """One RequestOutput per prompt, in prompt order. Prompts are strings,
        token id lists (or given as prompt_token_ids=), or upstream's prompt
        dicts: {"prompt": text} and {"prompt_token_ids": ids}."""
        if prompt_token_ids is not None:
            prompts = prompt_token_ids
        if not prompts:
            raise ValueError("generate() needs prompts (strings or token id lists)")
        if isinstance(prompts, (str, dict)) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        prompts = [_prompt(p, i) if isinstance(p, dict) else p for i, p in enumerate(prompts)]
        params = sampling_params or self.get_default_sampling_params()
        params = list(params) if isinstance(params, (list, tuple)) else [params] * len(prompts)
        if len(params) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(params)} SamplingParams")
        batch = next(self._batches)
        seqs = [self.core.make_sequence(f"offline-{batch}-{i}", p, sp, i)
                for i, (p, sp) in enumerate(zip(prompts, params))]
        for seq in seqs:
            self.core.add(seq)
        while self.core.has_unfinished():
            self.core.step()
        return [self._output(s) for s in seqs]

    def _output(self, seq: Sequence) -> RequestOutput:
        ids = seq.output_token_ids
        return RequestOutput(seq.index, seq.prompt, seq.token_ids[:seq.num_prompt_tokens],
                             [CompletionOutput(0, self.core.output_text(seq), ids,
                                               seq.finish_reason)])


def _prompt(d: dict, index: int):
    """Upstream's TextPrompt / TokensPrompt, as a string or an id list."""
    keys = set(d)
    if keys == {"prompt"} and isinstance(d["prompt"], str):
        return d["prompt"]
    if keys == {"prompt_token_ids"} and isinstance(d["prompt_token_ids"], (list, tuple)):
        return list(d["prompt_token_ids"])
    raise ValueError(f"prompt {index}: a prompt dict holds one key, 'prompt' (a string) or "
                     f"'prompt_token_ids' (a list of ids); got {sorted(keys)}")
