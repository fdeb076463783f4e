"""Load a Hugging Face checkpoint's safetensors into LlamaForCausalLM, fusing
q/k/v and gate/up projections as the model expects.

Tensors are read with plain reads straight into the model's parameters, not
through a memory map: mapped checkpoint pages would count in the process's
memory next to the parameters (and the packed copies made at load), doubling
the peak for a large model."""
from __future__ import annotations

import json
import struct
from pathlib import Path

import torch

from engine.model_executor.models.llama import LlamaForCausalLM

# checkpoint name suffix -> (our parameter, shard index in a fused parameter)
_FUSED = {
    "self_attn.q_proj.weight": ("qkv.weight", 0), "self_attn.k_proj.weight": ("qkv.weight", 1),
    "self_attn.v_proj.weight": ("qkv.weight", 2), "self_attn.q_proj.bias": ("qkv.bias", 0),
    "self_attn.k_proj.bias": ("qkv.bias", 1), "self_attn.v_proj.bias": ("qkv.bias", 2),
    "mlp.gate_proj.weight": ("gate_up.weight", 0), "mlp.up_proj.weight": ("gate_up.weight", 1),
}
_PLAIN = {
    "self_attn.o_proj.weight": "o_proj.weight", "mlp.down_proj.weight": "down.weight",
    "input_layernorm.weight": "input_layernorm.weight",
    "post_attention_layernorm.weight": "post_attention_layernorm.weight",
    "self_attn.q_norm.weight": "q_norm.weight", "self_attn.k_norm.weight": "k_norm.weight",
}


def _shard_offsets(layer, name: str) -> list[int]:
    c = layer.c
    if name.startswith("qkv"):
        sizes = [layer.q_size, layer.kv_size, layer.kv_size]
    else:
        sizes = [c.intermediate_size, c.intermediate_size]
    return [sum(sizes[:i]) for i in range(len(sizes) + 1)]


_DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16,
           "F64": torch.float64}


def _header(f, name: str, size: int) -> dict:
    """The safetensors header: {tensor: {dtype, shape, data_offsets}}, checked
    against the file's size so that no read runs past it."""
    raw = f.read(8)
    if len(raw) < 8:
        raise ValueError(f"{name}: not a safetensors file (shorter than its header)")
    (n,) = struct.unpack("<Q", raw)
    if n > size - 8:
        raise ValueError(f"{name}: not a safetensors file (header of {n} bytes)")
    try:
        header = json.loads(f.read(n))
    except ValueError:
        raise ValueError(f"{name}: not a safetensors file (unreadable header)") from None
    base = 8 + n
    for key, info in header.items():
        if key == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        if not 0 <= begin <= end <= size - base:
            raise ValueError(f"{name}: {key} lies outside the file")
        info["data_offsets"] = (base + begin, base + end)
    header.pop("__metadata__", None)
    return header


def _read_into(f, name: str, key: str, info: dict, dest: torch.Tensor) -> None:
    dtype = _DTYPES.get(info["dtype"])
    if dtype is None:
        raise ValueError(f"{name}: {key} has dtype {info['dtype']}; float32, bfloat16, float16 "
                         "and float64 are supported")
    shape = tuple(info["shape"])
    if shape != tuple(dest.shape):
        raise ValueError(f"{name}: {key} has shape {shape}, the model expects "
                         f"{tuple(dest.shape)}")
    begin, end = info["data_offsets"]
    if end - begin != dest.numel() * dtype.itemsize:
        raise ValueError(f"{name}: {key} holds {end - begin} bytes, not {shape} of {dtype}")
    # read straight into the parameter when its bytes are the file's and in host
    # memory; otherwise (another dtype, a strided view, a GPU) through one CPU buffer
    direct = dest.dtype == dtype and dest.is_contiguous() and dest.device.type == "cpu"
    target = dest if direct else torch.empty(shape, dtype=dtype)
    f.seek(begin)
    buf = memoryview(target.view(-1).view(torch.uint8).numpy())
    if f.readinto(buf) != len(buf):
        raise ValueError(f"{name}: {key} is cut short")
    if target is not dest:
        dest.copy_(target)


def load_weights(model: LlamaForCausalLM, path: Path) -> None:
    files = sorted(Path(path).glob("*.safetensors"))
    if not files:
        raise ValueError(f"{path} has no *.safetensors weights")
    loaded: set[str] = set()
    params = dict(model.named_parameters())
    with torch.no_grad():
        for file in files:
            with open(file, "rb", buffering=0) as f:
                header = _header(f, file.name, file.stat().st_size)
                for key, info in header.items():
                    target, rows = _target(model, key)
                    if target is None:
                        continue
                    dest = params[target] if isinstance(target, str) else target
                    view = dest if rows is None else dest[rows[0]:rows[1]]
                    _read_into(f, file.name, key, info, view)
                    loaded.add(target if isinstance(target, str) else key)
    missing = [n for n in params if n not in loaded]
    if missing:
        raise ValueError(f"{path}: the checkpoint lacks weights for {missing[:5]}")


def _target(model: LlamaForCausalLM, key: str):
    if key == "model.embed_tokens.weight":
        return "embed_tokens", None
    if key == "lm_head.weight":
        return (None, None) if model.config.tie_word_embeddings else ("lm_head.weight", None)
    if key == "model.norm.weight":
        return "norm.weight", None
    if not key.startswith("model.layers."):
        return None, None
    idx, suffix = key[len("model.layers."):].split(".", 1)
    layer = model.layers[int(idx)]
    if suffix in _FUSED:
        name, shard = _FUSED[suffix]
        offsets = _shard_offsets(layer, name)
        return f"layers.{idx}.{name}", (offsets[shard], offsets[shard + 1])
    if suffix in _PLAIN:
        return f"layers.{idx}.{_PLAIN[suffix]}", None
    return None, None
