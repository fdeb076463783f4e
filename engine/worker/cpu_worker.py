"""This rank's model runner, as upstream's CPU worker loads it: the model for
the checkpoint's architecture, its weights (this rank's shard under tensor
parallelism), its linear layers laid out for this CPU, over a KV cache."""
from __future__ import annotations

import logging

from engine import envs
from engine.core.kv_cache_manager import BlockManager
from engine.distributed.parallel_state import pp_size, tp_size
from engine.engine_args import EngineConfig
from engine.lora.models import LoRAModelManager
from engine.model_executor.gguf_loader import load_gguf
from engine.model_executor.layers import quantization
from engine.model_executor.layers.linear import log_cpu_linear_choice
from engine.model_executor.model_loader import load_weights
from engine.model_executor.models.adapters import as_embedding_model
from engine.model_executor.models.registry import POOLING_ARCHITECTURES, model_class
from engine.platforms import ZenCpuPlatform, cpu_hugepages, cpu_malloc
from engine.platforms import current as current_platform
from engine.platforms.cpu_features import PLAIN
from engine.transformers_utils.gguf_folder import gguf_file
from engine.worker.decode_graphs import DecodeGraphs
from engine.worker.model_runner import ModelRunner
from engine.worker.pooling_model_runner import PoolingModelRunner, make_pooler

logger = logging.getLogger("engine")


def build_runner(config: EngineConfig, blocks: BlockManager) -> ModelRunner:
    """The model (this rank's shard under tensor parallelism) with its weights
    loaded and laid out for this CPU, over a KV cache of `blocks`."""
    model, linear_mode = _load(config)
    runner = ModelRunner(model, blocks, config.dtype, current_platform().device())
    runner.linear_mode = linear_mode
    if config.lora_config is not None:  # after the weights are laid out: it wraps the layers
        runner.lora_manager = LoRAModelManager(model, config.model, config.lora_config,
                                               config.dtype)
    # one process's whole model on the CPU: ranks would replay their collectives apart
    elif (not config.enforce_eager and tp_size() == 1 and pp_size() == 1
          and runner.device.type == "cpu"):
        runner.decode_graphs = DecodeGraphs(model, -(-config.max_model_len // config.block_size))
    return runner


def build_pooling_runner(config: EngineConfig) -> PoolingModelRunner:
    """A pooling model (engine/worker/pooling_model_runner.py): no KV cache."""
    model, linear_mode = _load(config)
    runner = PoolingModelRunner(model, make_pooler(model, config), current_platform().device())
    runner.linear_mode = linear_mode
    return runner


def _load(config: EngineConfig):
    """(the model, loaded and laid out, its linear layers' mode)."""
    platform = current_platform()
    device = platform.device()
    cls = model_class(config.model.architecture)
    if config.pooler is not None and config.model.architecture not in POOLING_ARCHITECTURES:
        cls = as_embedding_model(cls)  # a decoder's hidden states, no LM head
    model = cls(config.model, config.dtype).to(device)
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
    return model, linear_mode
