"""The offline API, shaped like upstream vLLM's:

    from engine import LLM, SamplingParams
    llm = LLM(model="path/to/checkpoint", dtype="float32")
    outs = llm.generate(["Hello"], SamplingParams(temperature=0, max_tokens=32))
    outs[0].outputs[0].text, outs[0].outputs[0].token_ids
"""
from __future__ import annotations

import itertools
import os
from collections.abc import Sequence as Seq
from dataclasses import dataclass, field

from engine.core.input_processor import InputProcessor, load_tokenizer
from engine.core.output_processor import OutputProcessor, RequestState
from engine.entrypoints.llm_pooling import PoolingMixin
from engine.executor.data_parallel import engine_core
from engine.lora.request import LoRARequest
from engine.model_source import tokenizer_folder
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


class LLM(PoolingMixin):
    """Runs prompts to completion on an EngineCore in this process (the same
    core the server runs in a process of its own; with data_parallel_size > 1
    the front of that many), with the server's input and output processing
    around it; keyword arguments are EngineCore's."""

    _batches = itertools.count()

    def __init__(self, model: str | os.PathLike, dtype: str = "auto", **kwargs):
        self.core = engine_core(model, dtype, **kwargs)
        # tokenizer=DIR (upstream's): that folder's, as the core's grammar compiler reads
        self.tokenizer = load_tokenizer(tokenizer_folder(self.core.path, kwargs.get("tokenizer")))
        self.processor = InputProcessor(self.tokenizer, self.core.config.vocab_size,
                                        self.core.max_model_len)

    def get_default_sampling_params(self) -> SamplingParams:
        """As upstream: the checkpoint's generation_config.json sampling fields
        where it has them, else SamplingParams' defaults."""
        return SamplingParams(**with_model_defaults({}, self.core.config.generation_defaults))

    def get_tokenizer(self):
        return self.tokenizer

    # ---- generation ----------------------------------------------------------

    def generate(self, prompts=None,
                 sampling_params: SamplingParams | Seq[SamplingParams] | None = None, *,
                 prompt_token_ids: list[list[int]] | None = None,
                 lora_request: LoRARequest | Seq[LoRARequest | None] | None = None
                 ) -> list[RequestOutput]:
        """One RequestOutput per prompt, in prompt order. Prompts are strings,
        token id lists (or given as prompt_token_ids=), or upstream's prompt
        dicts: {"prompt": text} and {"prompt_token_ids": ids}. lora_request:
        the adapter of every prompt, or one per prompt (None: the base model;
        the engine needs enable_lora=True)."""
        tasks = self._tasks()
        if tasks:
            raise ValueError(f"generate: this is a pooling model; it serves {', '.join(tasks)} "
                             "(LLM.embed, LLM.classify, LLM.score)")
        if prompt_token_ids is not None:
            prompts = prompt_token_ids
        if not prompts:
            raise ValueError("generate() needs prompts (strings or token id lists)")
        if isinstance(prompts, (str, dict)) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        prompts = [_prompt(p, i) if isinstance(p, dict) else p for i, p in enumerate(prompts)]
        params = sampling_params or self.get_default_sampling_params()
        params = list(params) if not isinstance(params, SamplingParams) else \
            [params] * len(prompts)
        if len(params) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(params)} SamplingParams")
        loras: list[LoRARequest | None] = [lora_request] * len(prompts) \
            if lora_request is None or isinstance(lora_request, LoRARequest) else list(lora_request)
        if len(loras) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(loras)} LoRA requests")
        batch = next(self._batches)
        states = [self.processor.make_request(f"offline-{batch}-{i}", p, sp, i)
                  for i, (p, sp) in enumerate(zip(prompts, params))]
        for state, lora in zip(states, loras):
            state.lora_request = lora
        output = OutputProcessor()
        for state in states:
            output.add(state)
            self.core.add_request(state.core_request())
        try:
            while self.core.has_unfinished():
                outs = self.core.step()
                if outs.failed_request_ids:  # offline, one failed prompt fails the call
                    raise RuntimeError(f"prompt(s) {', '.join(outs.failed_request_ids)} "
                                       f"failed: {outs.failure}")
                stopped = output.process_outputs(outs.outputs)
                self.core.abort_requests(stopped)  # ended by a stop string
        except BaseException:
            self.core.abort_requests([s.request_id for s in states])  # a later call starts clean
            raise
        return [self._output(s) for s in states]

    def _output(self, state: RequestState) -> RequestOutput:
        return RequestOutput(state.index, state.prompt, state.token_ids[:state.num_prompt_tokens],
                             [CompletionOutput(0, state.text or "", state.output_token_ids,
                                               state.finish_reason)])


def _prompt(d: dict, index: int):
    """Upstream's TextPrompt / TokensPrompt, as a string or an id list."""
    keys = set(d)
    if keys == {"prompt"} and isinstance(d["prompt"], str):
        return d["prompt"]
    if keys == {"prompt_token_ids"} and isinstance(d["prompt_token_ids"], (list, tuple)):
        return list(d["prompt_token_ids"])
    raise ValueError(f"prompt {index}: a prompt dict holds one key, 'prompt' (a string) or "
                     f"'prompt_token_ids' (a list of ids); got {sorted(keys)}")
