"""Load a Hugging Face checkpoint's safetensors into LlamaForCausalLM, fusing
q/k/v and gate/up projections as the model expects."""
from __future__ import annotations

from pathlib import Path

import torch
from safetensors import safe_open

from engine.models.llama import LlamaForCausalLM

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


def load_weights(model: LlamaForCausalLM, path: Path) -> None:
    files = sorted(Path(path).glob("*.safetensors"))
    if not files:
        raise ValueError(f"{path} has no *.safetensors weights")
    loaded: set[str] = set()
    params = dict(model.named_parameters())
    with torch.no_grad():
        for f in files:
            with safe_open(str(f), framework="pt") as st:
                for key in st.keys():
                    tensor = st.get_tensor(key)
                    target, rows = _target(model, key)
                    if target is None:
                        continue
                    dest = params[target] if isinstance(target, str) else target
                    view = dest if rows is None else dest[rows[0]:rows[1]]
                    if view.shape != tensor.shape:
                        raise ValueError(f"{f.name}: {key} has shape {tuple(tensor.shape)}, "
                                         f"the model expects {tuple(view.shape)}")
                    view.copy_(tensor)
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
