"""Runs the model in this process, as upstream's UniProcExecutor: builds the
model for the checkpoint's architecture, loads its weights, lays its linear
layers out for this CPU, pins the threads, and runs scheduled batches."""
from __future__ import annotations

import logging

from engine import envs
from engine.core.kv_cache_manager import BlockManager
from engine.core.sequence import Sequence
from engine.distributed.parallel_state import replica_bindings
from engine.engine_args import EngineConfig
from engine.model_executor.layers import quantization
from engine.model_executor.layers.linear import log_cpu_linear_choice
from engine.model_executor.model_loader import load_weights
from engine.model_executor.models.registry import model_class
from engine.platforms import ZenCpuPlatform
from engine.platforms import current as current_platform
from engine.platforms import cpu_binding, cpu_hugepages, cpu_malloc, cpu_preload
from engine.platforms.cpu_features import PLAIN
from engine.worker.model_runner import ModelRunner

logger = logging.getLogger("engine")


class UniProcExecutor:
    def __init__(self, config: EngineConfig, blocks: BlockManager):
        if current_platform().device_type == "cpu":
            cpu_preload.warn_if_not_preloaded()
            if config.bind_threads:
                cpu_binding.apply(replica_bindings(1, config.data_parallel_size,
                                                   config.data_parallel_rank)[0])
        self.runner = build_runner(config, blocks)
        self.model, self.linear_mode = self.runner.model, self.runner.linear_mode

    def execute_model(self, seqs: list[Sequence], is_prefill: bool) -> list[int]:
        """One token per sequence, sampled from the batch's logits."""
        return self.runner.run(seqs, is_prefill)

    def check_health(self) -> None:
        """Raises when a part of the executor has died (never, in one process)."""


def build_runner(config: EngineConfig, blocks: BlockManager) -> ModelRunner:
    """The model (this rank's shard under tensor parallelism) with its weights
    loaded and laid out for this CPU, over a KV cache of `blocks`."""
    platform = current_platform()
    device = platform.device()
    model = model_class(config.model.architecture)(config.model, config.dtype).to(device)
    load_weights(model, config.path, already_read=quantization.apply(model, config.path))
    model.eval()
    linear_mode = PLAIN
    if platform.device_type == "cpu":
        if isinstance(platform, ZenCpuPlatform) and not envs.zentorch_weight_prepack():
            logger.info("linear layers: plain (VLLM_ZENTORCH_WEIGHT_PREPACK=0)")
        else:
            linear_mode = log_cpu_linear_choice(config.dtype).mode
        model.prepare_linear(linear_mode)
        cpu_hugepages.trim_heap()  # what loading and packing freed goes back first
        if envs.cpu_keep_freed_memory():
            cpu_malloc.keep_freed_memory()  # then a step's freed activations stay
    runner = ModelRunner(model, blocks, config.dtype, device)
    runner.linear_mode = linear_mode
    return runner
