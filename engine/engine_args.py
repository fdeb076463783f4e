"""The engine's arguments, checked once and resolved into an EngineConfig
(upstream's EngineArgs -> VllmConfig): the checkpoint, the dtype, the token
budget of a step and the size of the KV cache. Nothing here loads a model."""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from engine import envs
from engine.config import ModelConfig
from engine.lora.config import LoRAConfig, lora_config
from engine.model_executor.layers.parallel import TP_ARCHITECTURES, check_shardable, check_stages
from engine.model_source import resolve_model, tokenizer_folder
from engine.platforms import current as current_platform
from engine.pooler_config import PoolerConfig, resolve_runner
from engine.spec_decode.config import SpeculativeConfig

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
DEFAULT_MAX_NUM_BATCHED_TOKENS = 8192
#: the budget of a step with chunked prefill: small enough that a long prompt,
#: prefilled in chunks, leaves the running streams a step every chunk
DEFAULT_CHUNKED_MAX_NUM_BATCHED_TOKENS = 2048
#: the share of a GPU's memory the engine may take, weights and KV cache together
#: (upstream's --gpu-memory-utilization and its default)
DEFAULT_GPU_MEMORY_UTILIZATION = 0.9


@dataclass(frozen=True)
class EngineConfig:
    path: Path
    model: ModelConfig
    dtype: torch.dtype
    block_size: int
    num_blocks: int
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    bind_threads: bool
    tensor_parallel_size: int = 1
    distributed_executor_backend: str | None = None  # None: one process (uniproc)
    pipeline_parallel_size: int = 1  # stages, each a range of layers
    data_parallel_size: int = 1  # engine replicas (engine.executor.data_parallel)
    data_parallel_rank: int = 0  # this replica's (its ranks' CPUs come after the ones before)
    enable_chunked_prefill: bool = False
    enable_prefix_caching: bool = False
    seed: int | None = None  # the global sampler seed of requests without their own
    speculative_config: SpeculativeConfig | None = None  # None: no speculative decoding
    # --runner pooling (engine.pooler_config): how it pools; None: it generates
    pooler: PoolerConfig | None = None
    # --structured-outputs-config, as given (engine.structured_output checks it)
    structured_outputs_config: str | None = None
    lora_config: LoRAConfig | None = None  # --enable-lora (engine/lora); None: no adapters
    # the folder of the tokenizer the front end uses (--tokenizer DIR; None: path's)
    tokenizer: Path | None = None
    # decode steps run eagerly, not replayed (engine/worker/decode_graphs.py)
    enforce_eager: bool = False

    @property
    def tokenizer_path(self) -> Path:
        return self.tokenizer or self.path

    @property
    def runner(self) -> str:
        return "generate" if self.pooler is None else "pooling"

    @property
    def world_size(self) -> int:
        """The ranks of one replica: tp ranks in each of pp stages."""
        return self.tensor_parallel_size * self.pipeline_parallel_size


def available_memory_bytes() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def batch_bounds(max_model_len: int, max_num_seqs: int,
                 max_num_batched_tokens: int | None, chunked_prefill: bool = False) -> int:
    """The token budget of one step, checked against the other bounds.

    It must hold one decode token for every running sequence (max_num_seqs).
    Without chunked prefill a prompt is run whole in one step, so it must hold
    the longest sequence (max_model_len) too. A budget the user chose is never
    raised behind their back; an unset one is the larger of the default and
    those bounds."""
    if max_num_seqs < 1:
        raise ValueError(f"max_num_seqs must be >= 1, got {max_num_seqs}")
    if max_num_batched_tokens is None:
        if chunked_prefill:
            return max(DEFAULT_CHUNKED_MAX_NUM_BATCHED_TOKENS, max_num_seqs)
        return max(DEFAULT_MAX_NUM_BATCHED_TOKENS, max_model_len, max_num_seqs)
    if not chunked_prefill and max_num_batched_tokens < max_model_len:
        raise ValueError(
            f"max_num_batched_tokens ({max_num_batched_tokens}) is smaller than max_model_len "
            f"({max_model_len}): without chunked prefill a prompt is prefilled in one step, so "
            "raise max_num_batched_tokens, lower max_model_len or enable chunked prefill")
    if max_num_batched_tokens < max_num_seqs:
        raise ValueError(
            f"max_num_batched_tokens ({max_num_batched_tokens}) must be >= max_num_seqs "
            f"({max_num_seqs}): each running sequence decodes one token per step")
    return max_num_batched_tokens


def prefix_reading(mc: ModelConfig, chunked: bool | None, prefix: bool | None
                   ) -> tuple[bool, bool]:
    """(enable_chunked_prefill, enable_prefix_caching): on unless turned off, as
    upstream V1. Both need prefill attention that reads earlier tokens from the
    paged cache; VLLM_PREFILL_ATTENTION=sdpa and logit soft-capping (Gemma 2)
    attend over the prompt's own keys only, so there both default to off."""
    why = None
    if envs.prefill_attention() == "sdpa":
        why = "VLLM_PREFILL_ATTENTION=sdpa attends over whole prompts only"
    elif mc.hf.get("attn_logit_softcapping") is not None:
        why = "attention logit soft-capping is computed over whole prompts only"
    for name, value in (("enable_chunked_prefill", chunked), ("enable_prefix_caching", prefix)):
        if value is not None and not isinstance(value, bool):
            raise ValueError(f"{name} must be true or false, got {value!r}")
        if value and why:
            raise ValueError(f"{name}: {why}; turn {name} off")
    if why:
        return False, False
    return chunked is not False, prefix is not False


def kv_cache_bytes_per_block(c: ModelConfig, block_size: int, dtype: torch.dtype) -> int:
    return 2 * c.num_layers * c.num_kv_heads * block_size * c.head_dim * dtype.itemsize


def resolve_dtype(dtype: str, model: ModelConfig) -> torch.dtype:
    if dtype == "auto":
        dtype = {"bfloat16": "bfloat16", "float16": "float16"}.get(model.torch_dtype or "",
                                                                     "float32")
    if dtype not in DTYPES:
        raise ValueError(f"dtype {dtype!r} is not supported; use auto, {', '.join(DTYPES)}")
    return current_platform().resolve_dtype(DTYPES[dtype])


def blocks_from_env(model: ModelConfig, block_size: int, dtype: torch.dtype) -> int:
    space = envs.kvcache_space_bytes()
    free = available_memory_bytes()
    if free is not None and space > free:
        raise ValueError(f"VLLM_CPU_KVCACHE_SPACE asks for {space / 2**30:.2f} GiB of KV cache "
                         f"but only {free / 2**30:.2f} GiB of memory is available; lower "
                         "VLLM_CPU_KVCACHE_SPACE (GiB)")
    return max(space // kv_cache_bytes_per_block(model, block_size, dtype), 0)


def gpu_kv_cache_bytes(free: int, total: int, utilization: float, weights: int) -> int:
    """The KV cache a GPU can hold, as upstream sizes it: the engine may take
    `utilization` of the device's memory, less what others hold now (total -
    free) and the weights it is about to load."""
    if not 0 < utilization <= 1:
        raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {utilization}")
    space = int(total * utilization) - (total - free) - weights
    if space <= 0:
        raise ValueError(
            f"no GPU memory is left for the KV cache: {utilization:.2f} of {total / 2**30:.1f} "
            f"GiB, less {(total - free) / 2**30:.1f} GiB in use and {weights / 2**30:.1f} GiB of "
            "weights; raise gpu_memory_utilization, free the GPU or use a smaller model")
    return space


def checkpoint_bytes(path: Path, model: ModelConfig, dtype: torch.dtype) -> int:
    """The weights' size once loaded in dtype, from the checkpoint files (stored
    in the config's torch_dtype, float32 when it names none)."""
    stored = DTYPES.get(model.torch_dtype or "", torch.float32).itemsize
    size = sum(f.stat().st_size for f in Path(path).glob("*.safetensors"))
    return size * dtype.itemsize // stored


def blocks_from_gpu(path: Path, model: ModelConfig, block_size: int, dtype: torch.dtype,
                    utilization: float, device: torch.device) -> int:
    free, total = torch.cuda.mem_get_info(device)
    space = gpu_kv_cache_bytes(free, total, utilization, checkpoint_bytes(path, model, dtype))
    return space // kv_cache_bytes_per_block(model, block_size, dtype)


def create_engine_config(model: str | os.PathLike, dtype: str = "auto", *, block_size: int = 128,
                         max_num_seqs: int = 256, max_num_batched_tokens: int | None = None,
                         max_model_len: int | None = None, num_kv_blocks: int | None = None,
                         bind_threads: bool = True, tensor_parallel_size: int = 1,
                         distributed_executor_backend: str | None = None,
                         gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION,
                         enable_chunked_prefill: bool | None = None,
                         enable_prefix_caching: bool | None = None,
                         data_parallel_size: int = 1, data_parallel_rank: int = 0,
                         pipeline_parallel_size: int = 1, runner: str = "auto",
                         convert: str = "auto",
                         speculative_config: str | dict | SpeculativeConfig | None = None,
                         structured_outputs_config: str | None = None,
                         tokenizer: str | None = None, hf_config_path: str | None = None,
                         seed: int | None = None, enable_lora: bool = False,
                         max_loras: int | None = None, max_lora_rank: int | None = None,
                         max_cpu_loras: int | None = None, enforce_eager: bool = False,
                         ) -> EngineConfig:
    spec = SpeculativeConfig.parse(speculative_config)  # before the model: fails fast
    path = resolve_model(model, tokenizer, hf_config_path)
    mc = ModelConfig.from_dir(path)
    pooler = resolve_runner(mc, path, runner, convert)
    lora = lora_config(enable_lora, max_loras, max_lora_rank, max_cpu_loras,
                       tensor_parallel_size * pipeline_parallel_size,
                       "generate" if pooler is None else "pooling")
    torch_dtype = resolve_dtype(dtype, mc)
    if pooler is not None:
        if spec is not None:
            raise ValueError("--speculative-config drafts generated tokens; a pooling model "
                             "(--runner pooling) generates none: leave it out")
        return _pooling_config(path, mc, pooler, torch_dtype, max_model_len, max_num_seqs,
                               max_num_batched_tokens, block_size, bind_threads,
                               tensor_parallel_size * pipeline_parallel_size * data_parallel_size)
    if block_size <= 0 or block_size % 32:
        raise ValueError(f"block_size must be a positive multiple of 32, got {block_size}")
    if max_model_len is not None and max_model_len < 2:
        raise ValueError(f"max_model_len must be >= 2, got {max_model_len}")
    max_len = min(max_model_len or mc.max_position, mc.max_position)
    chunked, prefix = prefix_reading(mc, enable_chunked_prefill, enable_prefix_caching)
    budget = batch_bounds(max_len, max_num_seqs, max_num_batched_tokens, chunked)
    device = current_platform().device()
    if num_kv_blocks:
        num_blocks = num_kv_blocks
    elif device.type == "cuda":  # the GPU's own memory, not the host's
        num_blocks = blocks_from_gpu(path, mc, block_size, torch_dtype, gpu_memory_utilization,
                                     device)
    else:
        num_blocks = blocks_from_env(mc, block_size, torch_dtype)
    if num_blocks * block_size < max_len:
        fix = "gpu_memory_utilization" if device.type == "cuda" else "VLLM_CPU_KVCACHE_SPACE"
        raise ValueError(
            f"the KV cache ({num_blocks} blocks of {block_size} tokens) cannot hold one "
            f"sequence of the model's context ({max_len} tokens); raise "
            f"{fix} or lower max_model_len")
    mc = dataclasses.replace(mc, max_model_len=max_len)  # longrope's table depends on it
    backend = parallel_backend(mc, tensor_parallel_size, distributed_executor_backend,
                               pipeline_parallel_size)
    check_data_parallel(data_parallel_size, data_parallel_rank, distributed_executor_backend)
    from engine.structured_output import StructuredOutputsConfig

    StructuredOutputsConfig.parse(structured_outputs_config)  # refused before the model loads
    return EngineConfig(path, mc, torch_dtype, block_size, num_blocks, max_len, max_num_seqs,
                        budget, bind_threads, tensor_parallel_size, backend,
                        pipeline_parallel_size, data_parallel_size, data_parallel_rank, chunked,
                        prefix, seed, spec, structured_outputs_config=structured_outputs_config,
                        tokenizer=tokenizer_folder(path, tokenizer),
                        lora_config=lora, enforce_eager=enforce_eager)


def _pooling_config(path: Path, mc: ModelConfig, pooler: PoolerConfig, dtype: torch.dtype,
                    max_model_len: int | None, max_num_seqs: int, budget: int | None,
                    block_size: int, bind_threads: bool, ranks: int) -> EngineConfig:
    """A pooling engine: whole prompts, one forward each, no KV cache (so no
    chunking, no prefix caching, no blocks), on one rank."""
    if ranks != 1:
        raise ValueError("--runner pooling runs on one rank; use -tp 1 -pp 1 -dp 1")
    if max_model_len is not None and max_model_len < 1:
        raise ValueError(f"max_model_len must be >= 1, got {max_model_len}")
    longest = mc.max_position
    if mc.model_type in ("roberta", "xlm-roberta"):  # positions start past the padding id
        from engine.model_executor.models.roberta import position_offset

        longest -= position_offset(mc)
    max_len = min(max_model_len or longest, longest)
    tokens = batch_bounds(max_len, max_num_seqs, budget, False)
    mc = dataclasses.replace(mc, max_model_len=max_len)
    return EngineConfig(path, mc, dtype, block_size, 0, max_len, max_num_seqs, tokens,
                        bind_threads, pooler=pooler)


def check_data_parallel(dp: int, rank: int, backend: str | None) -> None:
    """data_parallel_size replicas run as processes on this machine."""
    if not isinstance(dp, int) or isinstance(dp, bool) or dp < 1:
        raise ValueError(f"data_parallel_size must be a whole number >= 1, got {dp!r}")
    if not 0 <= rank < dp:
        raise ValueError(f"data_parallel_rank {rank} is outside 0..{dp - 1}")
    if dp > 1 and backend == "ray":
        raise ValueError("data_parallel_size > 1 runs its replicas as processes on this machine; "
                         "with distributed_executor_backend 'ray' use data_parallel_size 1")


def parallel_backend(mc: ModelConfig, tp: int, backend: str | None, pp: int = 1) -> str | None:
    """The executor backend for tp x pp ranks (as upstream: `mp` on one machine
    unless `ray` is asked for), after checking the model splits over them."""
    if not isinstance(tp, int) or isinstance(tp, bool):
        raise ValueError(f"tensor_parallel_size must be a whole number, got {tp!r}")
    check_shardable(mc, tp)
    check_stages(mc, pp)
    if backend not in (None, "mp", "ray", "uni"):
        raise ValueError(f"distributed_executor_backend {backend!r} is not supported; use mp "
                         "(processes on this machine) or ray (a Ray cluster)")
    for size, name, what in ((tp, "tensor_parallel_size", "tensor"),
                             (pp, "pipeline_parallel_size", "pipeline")):
        if size > 1 and mc.architecture not in TP_ARCHITECTURES:
            raise ValueError(f"{name} {size}: {what} parallel runs "
                             f"{', '.join(sorted(TP_ARCHITECTURES))} so far, not "
                             f"{mc.architecture}; use {name} 1")
    if tp > 1 and pp > 1:
        raise ValueError(f"tensor_parallel_size {tp} with pipeline_parallel_size {pp}: the two "
                         "are not combined yet; use one of them")
    if tp == 1 and pp == 1:
        return None
    if backend == "ray":
        import importlib.util

        if importlib.util.find_spec("ray") is None:
            raise ValueError("distributed_executor_backend 'ray' needs the ray package: "
                             "pip install -r requirements/ray.txt")
    if backend == "uni":
        raise ValueError(f"distributed_executor_backend 'uni' runs one rank; {tp * pp} ranks "
                         "need mp or ray")
    return backend or "mp"


# the engine arguments `engine generate/bench/serve` take from their flags alike
_CLI_ENGINE_ARGS = ("block_size", "max_num_seqs", "max_num_batched_tokens", "max_model_len",
                    "tensor_parallel_size", "data_parallel_size", "pipeline_parallel_size",
                    "distributed_executor_backend", "enable_chunked_prefill",
                    "enable_prefix_caching", "runner", "convert", "speculative_config",
                    "structured_outputs_config", "tokenizer", "hf_config_path", "seed",
                    "enable_lora", "max_loras", "max_lora_rank", "max_cpu_loras",
                    "enforce_eager")


def cli_engine_args(args) -> dict:
    """The engine arguments of a command line's flags (those the command has)."""
    out = {name: getattr(args, name) for name in _CLI_ENGINE_ARGS if hasattr(args, name)}
    if getattr(args, "num_gpu_blocks_override", None):  # vLLM's name for num_kv_blocks
        out["num_kv_blocks"] = args.num_gpu_blocks_override
    return out | gpu_memory(args)


def gpu_memory(args) -> dict:
    """The command line's --gpu-memory-utilization as an engine argument, only
    when given (the default is DEFAULT_GPU_MEMORY_UTILIZATION's)."""
    if getattr(args, "gpu_memory_utilization", None) is None:
        return {}
    return {"gpu_memory_utilization": args.gpu_memory_utilization}
