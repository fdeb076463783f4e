"""Quantized checkpoints: which quantization_config (config.json) this engine
loads, and the linear methods that run them. `apply` gives a model's linear
layers their methods before the weights are read, so that the loader finds
int8 parameters (and their scales) where the checkpoint holds them."""
from __future__ import annotations

import json
from pathlib import Path

from torch import nn

from engine.model_executor.layers.linear import Linear
from engine.model_executor.layers.quantization.compressed_tensors import (
    CompressedTensorsConfig, SUPPORTED)

__all__ = ["apply", "config_for", "SUPPORTED"]

# our fused linear layer -> the checkpoint's layers it holds, in order
# (engine.model_executor.model_loader fuses their weights the same way)
_SHARDS = {"qkv": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
           "o_proj": ("self_attn.o_proj",),
           "gate_up": ("mlp.gate_proj", "mlp.up_proj"), "down": ("mlp.down_proj",)}


def config_for(path: Path) -> CompressedTensorsConfig | None:
    """The checkpoint's quantization config, None for a float checkpoint;
    ValueError (one line) for a method or scheme this engine does not run."""
    try:
        cfg = json.loads((Path(path) / "config.json").read_text())
    except (OSError, ValueError):
        return None  # engine.config reports a missing or broken config.json
    qc = cfg.get("quantization_config")
    if qc is None:
        return None
    if not isinstance(qc, dict):
        raise ValueError(f"{path}: config.json's quantization_config must be an object")
    return CompressedTensorsConfig.parse(qc, str(path))


def checkpoint_names(module_name: str) -> tuple[str, ...]:
    """The checkpoint layers behind one of our linear layers ("layers.3.qkv" ->
    model.layers.3.self_attn.{q,k,v}_proj; "lm_head" -> lm_head)."""
    if not module_name.startswith("layers."):
        return (module_name,)
    _, idx, ours = module_name.split(".", 2)
    return tuple(f"model.layers.{idx}.{s}" for s in _SHARDS[ours])


def apply(model: nn.Module, path: Path) -> None:
    """Give every quantized linear layer of `model` its method (no-op for a
    float checkpoint)."""
    config = config_for(path)
    if config is None:
        return
    for name, module in model.named_modules():
        # upstream quantizes no lm_head (an embedding there, not a linear layer)
        if isinstance(module, Linear) and name != "lm_head":
            method = config.method_for(checkpoint_names(name))
            if method is not None:
                method.create_weights(module)
