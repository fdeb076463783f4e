"""The engine core: model, tokenizer, KV cache and scheduler, advanced one step
at a time. Requests may be added or aborted between any two steps: a new one
joins the running batch at the next step, a finished one leaves, an aborted one
gives its KV blocks back at once. The offline `LLM` drives it in a loop; the
server's `AsyncLLM` steps it inside the event loop that serves the requests."""
from __future__ import annotations

import logging
import os

import torch

from engine import cpu_binding, envs, preload
from engine.block_manager import BlockManager
from engine.config import ModelConfig
from engine.cpu_features import PLAIN
from engine.layers.linear import log_cpu_linear_choice
from engine.loader import load_weights
from engine.model_runner import ModelRunner, kv_cache_bytes_per_block
from engine.model_source import resolve_model
from engine.models.llama import LlamaForCausalLM
from engine.platforms import ZenCpuPlatform
from engine.platforms import current as current_platform
from engine.sampling_params import SamplingParams
from engine.scheduler import Scheduler
from engine.sequence import Sequence

logger = logging.getLogger("engine")

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
DEFAULT_MAX_NUM_BATCHED_TOKENS = 8192


def available_memory_bytes() -> int | None:
    try:
        for line in open("/proc/meminfo"):
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def batch_bounds(max_model_len: int, max_num_seqs: int,
                 max_num_batched_tokens: int | None) -> int:
    """The token budget of one step, checked against the other bounds.

    Prefill is not chunked: a prompt is run whole in one step, so the budget
    must hold the longest sequence (max_model_len) and one decode token for
    every running sequence (max_num_seqs). A budget the user chose is never
    raised behind their back; an unset one is the larger of 8192 and both."""
    if max_num_seqs < 1:
        raise ValueError(f"max_num_seqs must be >= 1, got {max_num_seqs}")
    if max_num_batched_tokens is None:
        return max(DEFAULT_MAX_NUM_BATCHED_TOKENS, max_model_len, max_num_seqs)
    if max_num_batched_tokens < max_model_len:
        raise ValueError(
            f"max_num_batched_tokens ({max_num_batched_tokens}) is smaller than max_model_len "
            f"({max_model_len}): a prompt is prefilled in one step (no chunked prefill), so "
            "raise max_num_batched_tokens or lower max_model_len")
    if max_num_batched_tokens < max_num_seqs:
        raise ValueError(
            f"max_num_batched_tokens ({max_num_batched_tokens}) must be >= max_num_seqs "
            f"({max_num_seqs}): each running sequence decodes one token per step")
    return max_num_batched_tokens


class EngineCore:
    def __init__(self, model: str | os.PathLike, dtype: str = "auto", *, block_size: int = 128,
                 max_num_seqs: int = 256, max_num_batched_tokens: int | None = None,
                 max_model_len: int | None = None, num_kv_blocks: int | None = None,
                 bind_threads: bool = True):
        self.path = resolve_model(model)
        self.config = ModelConfig.from_dir(self.path)
        platform = current_platform()
        self.dtype = platform.resolve_dtype(self._dtype(dtype))
        if block_size <= 0 or block_size % 32:
            raise ValueError(f"block_size must be a positive multiple of 32, got {block_size}")
        if max_model_len is not None and max_model_len < 2:
            raise ValueError(f"max_model_len must be >= 2, got {max_model_len}")
        self.max_model_len = min(max_model_len or self.config.max_position,
                                 self.config.max_position)
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = batch_bounds(self.max_model_len, max_num_seqs,
                                                   max_num_batched_tokens)
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
        self.linear_mode = PLAIN
        if platform.device_type == "cpu":
            if isinstance(platform, ZenCpuPlatform) and not envs.zentorch_weight_prepack():
                logger.info("linear layers: plain (VLLM_ZENTORCH_WEIGHT_PREPACK=0)")
            else:
                self.linear_mode = log_cpu_linear_choice(self.dtype).mode
            self.model.prepare_linear(self.linear_mode)
        self.blocks = BlockManager(num_blocks, block_size)
        self.scheduler = Scheduler(self.blocks, max_num_seqs, self.max_num_batched_tokens)
        self.runner = ModelRunner(self.model, self.blocks, self.dtype, device)
        self.requests: dict[str, Sequence] = {}

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

    # ---- requests ------------------------------------------------------------

    def make_sequence(self, request_id: str, prompt, params: SamplingParams,
                      index: int = 0) -> Sequence:
        """A checked, not yet scheduled request: a prompt string (tokenized with
        the model's special tokens) or a list of token ids."""
        if isinstance(prompt, str):
            ids, text = self.tokenizer.encode(prompt).ids, prompt
        else:
            ids, text = list(prompt), None
            vocab = self.config.vocab_size
            if any(not isinstance(t, int) or not 0 <= t < vocab for t in ids):
                raise ValueError(f"prompt {index}: token ids must be integers in [0, {vocab})")
        if not ids:
            raise ValueError(f"prompt {index} is empty")
        if len(ids) + 1 > self.max_model_len:
            raise ValueError(f"prompt {index} has {len(ids)} tokens; the model's context is "
                             f"{self.max_model_len}")
        return Sequence(ids, params, text, index, request_id)

    def add(self, seq: Sequence) -> None:
        if seq.request_id in self.requests:
            raise ValueError(f"request id {seq.request_id!r} is already running")
        self.requests[seq.request_id] = seq
        self.scheduler.add(seq)

    def abort(self, request_id: str) -> bool:
        """Drop a request, waiting or running; its KV blocks are free on return."""
        seq = self.requests.pop(request_id, None)
        if seq is None:
            return False
        self.scheduler.abort(seq)
        return True

    def has_unfinished(self) -> bool:
        return self.scheduler.has_work()

    def step(self) -> list[Sequence]:
        """Run one batch; returns the sequences that got a token (the newest is
        token_ids[-1]); finished ones have finish_reason set and are gone."""
        seqs, is_prefill = self.scheduler.schedule()
        if not seqs:
            raise RuntimeError("no sequence could be scheduled: the KV cache is too small")
        for seq, token in zip(seqs, self.runner.run(seqs, is_prefill)):
            seq.token_ids.append(token)
            reason = self._finished(seq, token)
            if reason:
                self.scheduler.finish(seq, reason)
                self.requests.pop(seq.request_id, None)
        return seqs

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

    def output_text(self, seq: Sequence) -> str:
        """The output's text: cut at the stop string when one matched."""
        return seq.text if seq.params.stop else self.tokenizer.decode(seq.output_token_ids)
