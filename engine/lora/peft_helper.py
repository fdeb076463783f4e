"""Reads an adapter in PEFT's format (upstream's vllm/lora/peft_helper.py and
lora_model.py): adapter_config.json and adapter_model.safetensors, checked
against the base model at load; each problem is one line naming the fix."""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

import torch

from engine.config import ModelConfig

#: PEFT's module names -> (our fused layer, the slice of it the module is)
TARGET_MODULES = {
    "q_proj": ("qkv", 0), "k_proj": ("qkv", 1), "v_proj": ("qkv", 2),
    "o_proj": ("o_proj", 0), "gate_proj": ("gate_up", 0), "up_proj": ("gate_up", 1),
    "down_proj": ("down", 0),
}
_KEY = re.compile(r"layers\.(\d+)\.(?:self_attn|mlp)\.(\w+)\.lora_([AB])(?:\.weight)?$")
CONFIG_FILE, WEIGHTS_FILE = "adapter_config.json", "adapter_model.safetensors"


def layer_slices(c: ModelConfig) -> dict[str, tuple[int, tuple[int, ...]]]:
    """Each fused layer's (input size, output sizes of its slices)."""
    q, kv = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
    inter = c.intermediate_size
    return {"qkv": (c.hidden_size, (q, kv, kv)), "o_proj": (q, (c.hidden_size,)),
            "gate_up": (c.hidden_size, (inter, inter)), "down": (inter, (c.hidden_size,))}


@dataclass
class LoRAWeights:
    """One adapter, in memory: per (layer, fused layer, slice) its A [r, in]
    and its B [out, r] with the adapter's scaling folded in."""

    name: str
    rank: int
    weights: dict[tuple[int, str, int], tuple[torch.Tensor, torch.Tensor]]

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes + b.nbytes for a, b in self.weights.values())


def _config(path: Path, max_rank: int) -> tuple[int, float]:
    """(rank, scaling) of the adapter's config, checked."""
    try:
        cfg = json.loads((path / CONFIG_FILE).read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"LoRA adapter {path}: no readable {CONFIG_FILE} "
                         f"({type(exc).__name__}); give a folder PEFT saved") from None
    if cfg.get("peft_type", "LORA") != "LORA":
        raise ValueError(f"LoRA adapter {path}: peft_type {cfg.get('peft_type')!r}; only LORA "
                         "adapters are served")
    for key in ("use_dora", "rank_pattern", "alpha_pattern", "modules_to_save"):
        if cfg.get(key):
            raise ValueError(f"LoRA adapter {path}: {key} is not supported; save the adapter "
                             f"without it")
    if cfg.get("bias", "none") != "none":
        raise ValueError(f"LoRA adapter {path}: bias {cfg['bias']!r} is not supported; "
                         "train with bias='none'")
    targets = cfg.get("target_modules") or []
    if isinstance(targets, list):
        unknown = [t for t in targets if t.rsplit(".", 1)[-1] not in TARGET_MODULES]
        if unknown:
            raise ValueError(f"LoRA adapter {path}: unknown target module {unknown[0]!r}; "
                             f"served: {', '.join(TARGET_MODULES)}")
    rank = cfg.get("r")
    if not isinstance(rank, int) or rank < 1:
        raise ValueError(f"LoRA adapter {path}: r must be a whole number >= 1, got {rank!r}")
    if rank > max_rank:
        raise ValueError(f"LoRA adapter {path}: rank {rank} is larger than --max-lora-rank "
                         f"{max_rank}; raise --max-lora-rank")
    alpha = cfg.get("lora_alpha", rank)
    scaling = alpha / (math.sqrt(rank) if cfg.get("use_rslora") else rank)
    return rank, scaling


def load_adapter(name: str, path: str | Path, model: ModelConfig, max_rank: int,
                 dtype: torch.dtype = torch.float32) -> LoRAWeights:
    """The adapter at `path`, checked against `model`; ValueError in one line."""
    from safetensors import safe_open

    path = Path(path)
    if not path.is_dir():
        raise ValueError(f"LoRA adapter {name!r}: {path} is not a folder; give the folder "
                         "PEFT saved (adapter_config.json, adapter_model.safetensors)")
    rank, scaling = _config(path, max_rank)
    if not (path / WEIGHTS_FILE).is_file():
        raise ValueError(f"LoRA adapter {path}: no {WEIGHTS_FILE}; save it with PEFT's "
                         "save_pretrained (safetensors)")
    sizes = layer_slices(model)
    parts: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
    with safe_open(str(path / WEIGHTS_FILE), framework="pt") as f:
        for key in f.keys():  # noqa: SIM118 (safe_open is not a mapping)
            m = _KEY.search(key)
            if m is None or m.group(2) not in TARGET_MODULES:
                raise ValueError(f"LoRA adapter {path}: unknown target module in {key!r}; "
                                 f"served: {', '.join(TARGET_MODULES)}")
            layer = int(m.group(1))
            if layer >= model.num_layers:
                raise ValueError(f"LoRA adapter {path}: {key} is for layer {layer}; the model "
                                 f"has {model.num_layers}")
            parts.setdefault((layer, m.group(2)), {})[m.group(3)] = f.get_tensor(key)
    weights = {}
    for (layer, module), ab in parts.items():
        fused, j = TARGET_MODULES[module]
        fan_in, outs = sizes[fused]
        a, b = ab.get("A"), ab.get("B")
        if a is None or b is None:
            raise ValueError(f"LoRA adapter {path}: layer {layer} {module} lacks lora_"
                             f"{'A' if a is None else 'B'}; the file is incomplete")
        if tuple(a.shape) != (rank, fan_in) or tuple(b.shape) != (outs[j], rank):
            raise ValueError(f"LoRA adapter {path}: layer {layer} {module} has A "
                             f"{list(a.shape)} and B {list(b.shape)}, the base model needs "
                             f"[{rank}, {fan_in}] and [{outs[j]}, {rank}]: shape mismatch "
                             "(an adapter of another model?)")
        weights[(layer, fused, j)] = (a.to(dtype).contiguous(),
                                      (b.float() * scaling).to(dtype).contiguous())
    if not weights:
        raise ValueError(f"LoRA adapter {path}: {WEIGHTS_FILE} holds no LoRA weights")
    return LoRAWeights(name, rank, weights)
