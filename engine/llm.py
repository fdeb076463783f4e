"""The offline API, shaped like upstream vLLM's:

    from engine import LLM, SamplingParams
    llm = LLM(model="path/to/checkpoint", dtype="float32")
    outs = llm.generate(["Hello"], SamplingParams(temperature=0, max_tokens=32))
    outs[0].outputs[0].text, outs[0].outputs[0].token_ids
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence as Seq

import torch

from engine import cpu_binding, envs, preload
from engine.block_manager import BlockManager
from engine.config import ModelConfig
from engine.layers.linear import log_cpu_linear_choice
from engine.cpu_features import PREPACKED
from engine.loader import load_weights
from engine.model_runner import ModelRunner, kv_cache_bytes_per_block
from engine.models.llama import LlamaForCausalLM
from engine.platforms import current as current_platform
from engine.sampling_params import SamplingParams
from engine.scheduler import Scheduler
from engine.sequence import Sequence

logger = logging.getLogger("engine")

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


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


def available_memory_bytes() -> int | None:
    try:
        for line in open("/proc/meminfo"):
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


class LLM:
    def __init__(self, model: str | os.PathLike, dtype: str = "auto", *, block_size: int = 128,
                 max_num_seqs: int = 256, max_num_batched_tokens: int | None = None,
                 max_model_len: int | None = None, num_kv_blocks: int | None = None,
                 bind_threads: bool = True, prepack_weights: bool | None = None):
        self.path = Path(model)
        self.config = ModelConfig.from_dir(self.path)
        platform = current_platform()
        self.dtype = platform.resolve_dtype(self._dtype(dtype))
        if block_size <= 0 or block_size % 32:
            raise ValueError(f"block_size must be a positive multiple of 32, got {block_size}")
        self.max_model_len = min(max_model_len or self.config.max_position,
                                 self.config.max_position)
        if platform.device_type == "cpu":
            preload.warn_if_not_preloaded()
            if bind_threads:
                cpu_binding.apply(cpu_binding.plan())
        num_blocks = num_kv_blocks or self._blocks_from_env(block_size)
        if num_blocks * block_size < self.max_model_len:
            raise ValueError(
                f"the KV cache ({num_blocks} blocks of {block_size} tokens) cannot hold one "
                f"sequence of the model's context ({self.max_model_len} tokens); raise "
                "VLLM_CPU_KVCACHE_SPACE or lower max_model_len")
        self.tokenizer = self._tokenizer()
        device = platform.device()
        self.model = LlamaForCausalLM(self.config, self.dtype).to(device)
        load_weights(self.model, self.path)
        self.model.eval()
        if prepack_weights is None:
            prepack_weights = (platform.device_type == "cpu"
                               and log_cpu_linear_choice(self.dtype).mode == PREPACKED)
        if prepack_weights:
            self.model.prepack()
        self.blocks = BlockManager(num_blocks, block_size)
        self.scheduler = Scheduler(self.blocks, max_num_seqs,
                                   max(max_num_batched_tokens or 8192, self.max_model_len))
        self.runner = ModelRunner(self.model, self.blocks, self.dtype, device)

    def _dtype(self, dtype: str) -> torch.dtype:
        if dtype == "auto":
            dtype = {"bfloat16": "bfloat16", "float16": "float16"}.get(
                self.config.torch_dtype or "", "float32")
        if dtype not in DTYPES:
            raise ValueError(f"dtype {dtype!r} is not supported; use auto, float32 or bfloat16")
        return DTYPES[dtype]

    def _blocks_from_env(self, block_size: int) -> int:
        space = envs.kvcache_space_bytes()
        free = available_memory_bytes()
        if free is not None and space > free:
            raise ValueError(f"VLLM_CPU_KVCACHE_SPACE asks for {space / 2**30:.2f} GiB of KV cache "
                             f"but only {free / 2**30:.2f} GiB of memory is available; lower "
                             "VLLM_CPU_KVCACHE_SPACE (GiB)")
        return max(space // kv_cache_bytes_per_block(self.config, block_size, self.dtype), 0)

    def _tokenizer(self):
        from tokenizers import Tokenizer

        file = self.path / "tokenizer.json"
        if not file.is_file():
            raise ValueError(f"{self.path} has no tokenizer.json")
        return Tokenizer.from_file(str(file))

    # ---- generation ----------------------------------------------------------

    def generate(self, prompts=None, sampling_params: SamplingParams | Seq[SamplingParams] | None = None,
                 *, prompt_token_ids: list[list[int]] | None = None) -> list[RequestOutput]:
        """One RequestOutput per prompt, in prompt order. Prompts are strings,
        or token id lists (or given as prompt_token_ids=)."""
        if prompt_token_ids is not None:
            prompts = prompt_token_ids
        if not prompts:
            raise ValueError("generate() needs prompts (strings or token id lists)")
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        params = sampling_params or SamplingParams()
        params = list(params) if isinstance(params, (list, tuple)) else [params] * len(prompts)
        if len(params) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(params)} SamplingParams")
        seqs = [self._add(p, sp, i) for i, (p, sp) in enumerate(zip(prompts, params))]
        while self.scheduler.has_work():
            self.step()
        return [self._output(s) for s in sorted(seqs, key=lambda s: s.index)]

    def _add(self, prompt, params: SamplingParams, index: int) -> Sequence:
        if isinstance(prompt, str):
            ids, text = self.tokenizer.encode(prompt).ids, prompt
        else:
            ids, text = list(prompt), None
        if not ids:
            raise ValueError(f"prompt {index} is empty")
        if len(ids) + 1 > self.max_model_len:
            raise ValueError(f"prompt {index} has {len(ids)} tokens; the model's context is "
                             f"{self.max_model_len}")
        seq = Sequence(ids, params, text, index)
        self.scheduler.add(seq)
        return seq

    def step(self) -> None:
        seqs, is_prefill = self.scheduler.schedule()
        if not seqs:
            raise RuntimeError("no sequence could be scheduled: the KV cache is too small")
        for seq, token in zip(seqs, self.runner.run(seqs, is_prefill)):
            seq.token_ids.append(token)
            reason = self._finished(seq, token)
            if reason:
                self.scheduler.finish(seq, reason)

    def _finished(self, seq: Sequence, token: int) -> str | None:
        p = seq.params
        if not p.ignore_eos and token in self.config.eos_token_ids:
            return "stop"
        if token in p.stop_token_ids:
            return "stop"
        if p.stop:
            seq.text = self.tokenizer.decode(seq.output_token_ids)
            for s in p.stop:
                at = seq.text.find(s)
                if at >= 0:
                    seq.text = seq.text[:at]
                    return "stop"
        if seq.num_output_tokens >= p.max_tokens:
            return "length"
        if len(seq) >= self.max_model_len:
            return "length"
        return None

    def _output(self, seq: Sequence) -> RequestOutput:
        ids = seq.output_token_ids
        text = seq.text if seq.params.stop else self.tokenizer.decode(ids)
        return RequestOutput(seq.index, seq.prompt, seq.token_ids[:seq.num_prompt_tokens],
                             [CompletionOutput(0, text, ids, seq.finish_reason)])
