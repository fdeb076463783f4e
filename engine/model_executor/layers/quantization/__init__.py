"""Quantized checkpoints: which quantization_config (config.json) this engine
loads, and the linear methods that run them. `apply` gives a model's linear
layers their methods before the weights are read, so that the loader finds
int8 parameters (and their scales) where the checkpoint holds them; weight-only
4/8-bit layers (wna16) are read and packed here, and the loader skips their
tensors."""
from __future__ import annotations

import json
from collections.abc import Collection
from pathlib import Path
from typing import TYPE_CHECKING

from engine.model_executor.layers.linear import Linear
from engine.model_executor.layers.quantization import wna16_formats
from engine.model_executor.layers.quantization.compressed_tensors import (
    METHOD,
    SUPPORTED,
    CompressedTensorsConfig,
)
from engine.model_executor.layers.quantization.gptq_awq import AWQConfig, GPTQConfig
from engine.model_executor.layers.quantization.wna16 import WNA16

if TYPE_CHECKING:
    from engine.model_executor.models.weights import CausalLM

__all__ = ["apply", "config_for", "SUPPORTED"]

_CONFIGS: dict[str, type[CompressedTensorsConfig | GPTQConfig | AWQConfig]] = {
    METHOD: CompressedTensorsConfig, "gptq": GPTQConfig, "awq": AWQConfig}


def config_for(path: Path):
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
    method = qc.get("quant_method")
    if method not in _CONFIGS:
        raise ValueError(f"{path}: quantization method {method!r} is not supported; "
                         f"supported: {SUPPORTED}")
    return _CONFIGS[method].parse(qc, str(path))


def checkpoint_names(model: CausalLM, present: Collection[str] = ()
                     ) -> dict[str, tuple[str, ...]]:
    """Each of our linear layers -> the checkpoint layers behind it, in the
    order they are fused ("layers.3.qkv" -> model.layers.3.self_attn.{q,k,v}_proj),
    read from the model's own checkpoint_map (the loader fuses by it too). A
    part the map knows by two names (OPT's first exports lack "model.") takes
    the one among `present` (the checkpoint's layers), else the map's first."""
    parts: dict[str, dict[int, list[str]]] = {}
    for key, (param, part) in model.checkpoint_map().items():
        if key.endswith(".weight") and param.endswith(".weight"):
            parts.setdefault(param[:-len(".weight")], {}).setdefault(part or 0, []).append(
                key[:-len(".weight")])

    def pick(names: list[str]) -> str:
        return next((n for n in names if n in present), names[0])

    return {layer: tuple(pick(ps[p]) for p in sorted(ps)) for layer, ps in parts.items()}


def unquantized_layers(model: CausalLM) -> set[str]:
    """Our linear layers that run float whatever the config says (MoE routers)."""
    return set(getattr(model, "unquantized_layers", lambda: ())())


def apply(model: CausalLM, path: Path) -> set[str]:
    """Give every quantized linear layer of `model` its method (no-op for a
    float checkpoint); read and pack the weight-only ones. Returns the
    checkpoint tensors read here, which the loader leaves alone."""
    config = config_for(path)
    if config is None:
        return set()
    reader = wna16_formats.Reader(path)
    names = checkpoint_names(model, reader.layers())
    skip = unquantized_layers(model) | {"lm_head"}  # upstream quantizes no lm_head
    wna16 = []
    for name, module in model.named_modules():
        if isinstance(module, Linear) and name not in skip and name in names:
            method = config.method_for(names[name])
            if method is None:
                continue
            method.create_weights(module)
            if isinstance(method, WNA16):
                wna16.append((module, names[name], method))
            else:  # the engine's loader reads W8A8 layers: first check they are there
                for n in names[name]:
                    reader.require(f"{n}.weight_scale")
    return _load_wna16(model, reader, config, wna16) if wna16 else set()


def _load_wna16(model: CausalLM, reader, config, layers: list) -> set[str]:
    read = wna16_formats.load(reader, config, layers, model.config)
    # the engine's loader reads the rest: neither these layers' .weight nor their tensors
    return {f"{n}.weight" for _, names, _ in layers for n in names} | set(read)
