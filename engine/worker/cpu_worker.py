"""This rank's model runner, as upstream's CPU worker loads it: the model for
the checkpoint's architecture, its weights (this rank's shard under tensor
parallelism), its linear layers laid out for this CPU, over a KV cache."""
from __future__ import annotations

import logging

from engine import envs
from engine.core.kv_cache_manager import BlockManager
from engine.engine_args import EngineConfig
from engine.model_executor.layers import quantization
from engine.model_executor.layers.linear import log_cpu_linear_choice
from engine.model_executor.gguf_loader import load_gguf
from engine.model_executor.model_loader import load_weights
from engine.model_executor.models.registry import model_class
from engine.platforms import ZenCpuPlatform
from engine.platforms import current as current_platform
from engine.platforms import cpu_hugepages, cpu_malloc
from engine.platforms.cpu_features import PLAIN
from engine.transformers_utils.gguf_folder import gguf_file
from engine.worker.model_runner import ModelRunner

logger = logging.getLogger("engine")


def build_runner(config: EngineConfig, blocks: BlockManager) -> ModelRunner:
    """The model (this rank's shard under tensor parallelism) with its weights
    loaded and laid out for this CPU, over a KV cache of `blocks`."""
    platform = current_platform()
    device = platform.device()
    model = model_class(config.model.architecture)(config.model, config.dtype).to(device)
    gguf = gguf_file(config.path)
    if gguf is not None:  # the folder stands for a GGUF file, which holds the weights
        load_gguf(model, gguf)
    else:
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
