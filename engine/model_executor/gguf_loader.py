"""Load a GGUF file's tensors into a model (upstream's
model_loader/gguf_loader.py): llama.cpp's tensor names mapped back to the
Hugging Face ones the model's checkpoint_map() reads, llama.cpp's Q/K row
permutation of llama-family attention undone, Gemma's norms shifted back by
the 1 llama.cpp adds; quantized linear weights repacked for the wna16 kernels
(layers/quantization/gguf), every other tensor (embeddings, norms, types no
kernel holds exactly) dequantized to the model's dtype."""
from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from engine.model_executor.layers.linear import Linear
from engine.model_executor.layers.quantization.gguf import method_for
from engine.model_executor.layers.quantization.gguf_blocks import FORMS, Unpacked, unpack
from engine.transformers_utils.gguf_config import architecture
from engine.transformers_utils.gguf_reader import open_gguf

if TYPE_CHECKING:
    from engine.model_executor.models.weights import CausalLM

logger = logging.getLogger("engine")

_TOP = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
_LAYER = {"attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj",
          "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
          "attn_output": "self_attn.o_proj", "attn_qkv": "self_attn.qkv_proj",
          "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
          "ffn_norm": "post_attention_layernorm", "ffn_gate": "mlp.gate_proj",
          "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}
_GEMMA = {"ffn_norm": "pre_feedforward_layernorm",
          "post_attention_norm": "post_attention_layernorm",
          "post_ffw_norm": "post_feedforward_layernorm"}
_PHI3 = {"ffn_up": "mlp.gate_up_proj"}  # gate and up fused in one tensor
# tensors the config took in (engine.transformers_utils.gguf_config)
_CONFIG_TENSORS = ("rope_freqs.weight",)
# convert_hf_to_gguf.py permutes q/k rows for these (its LlamaModel and subclasses)
_PERMUTED = ("llama", "granite")
_FLOATS = {"F32": np.float32, "F16": np.float16}


def hf_name(gguf_name: str, arch: str) -> str | None:
    """The Hugging Face name of a GGUF tensor (None: not one of the known)."""
    stem, _, kind = gguf_name.rpartition(".")
    if stem in _TOP:
        return f"{_TOP[stem]}.{kind}"
    parts = stem.split(".")
    if len(parts) != 3 or parts[0] != "blk" or not parts[1].isdigit():
        return None
    table = _LAYER | (_GEMMA if arch.startswith("gemma") else {}) | (
        _PHI3 if arch == "phi3" else {})
    name = table.get(parts[2])
    return None if name is None else f"model.layers.{parts[1]}.{name}.{kind}"


def _unpermute(rows: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's permute of q/k rows undone: per head, its rows were
    reordered (2, dim/2) -> (dim/2, 2), interleaving the rotary halves."""
    half = rows.shape[0] // heads // 2
    return rows.reshape(heads, half, 2, *rows.shape[1:]).swapaxes(1, 2).reshape(rows.shape)


def _float(t, type_name: str) -> torch.Tensor:
    """The tensor in float32, [rows, cols] as the model holds it."""
    shape = tuple(reversed([int(d) for d in t.shape]))
    if type_name in _FLOATS:
        return torch.from_numpy(np.array(t.data, dtype=_FLOATS[type_name]).reshape(shape)).float()
    if type_name == "BF16":
        raw = np.ascontiguousarray(t.data).view(np.int16).reshape(shape)
        return torch.from_numpy(raw.copy()).view(torch.bfloat16).float()
    from gguf.quants import dequantize

    return torch.from_numpy(dequantize(t.data, t.tensor_type).reshape(shape))


def load_gguf(model: CausalLM, file: Path) -> None:
    """Read every tensor of `file` into `model`; one line naming the tensor for
    one the model does not know, one whose shape does not fit, and one the
    model needs that the file lacks."""
    reader = open_gguf(file)
    arch = architecture(reader, file)
    params = dict(model.named_parameters())
    modules = dict(model.named_modules())
    mapping = model.checkpoint_map()
    tensors = _match(model, reader, file, arch, mapping, params)
    # a linear layer runs quantized when every part of it is of a type a kernel holds
    kinds: dict[str, set[bool]] = {}
    count: dict[str, int] = {}  # each linear layer's parts in the file
    for t, key, name, part in tensors:
        layer = name.removesuffix(".weight")
        if name.endswith(".weight") and isinstance(modules.get(layer), Linear):
            kinds.setdefault(layer, set()).add(t.tensor_type.name in FORMS)
            count[layer] = count.get(layer, 0) + 1
    quantized: dict[str, dict[int, Unpacked]] = {}  # linear layer -> its parts' blocks
    dequantized: set[str] = set()
    loaded: dict[str, set] = {}
    with torch.no_grad():
        for t, key, name, part in tensors:
            dest: torch.Tensor = params[name]
            shape = tuple(reversed([int(d) for d in t.shape]))
            data, type_name = t.data, t.tensor_type.name
            heads = {"attn_q": model.config.num_heads, "attn_k": model.config.num_kv_heads}.get(
                t.name.split(".")[-2]) if arch in _PERMUTED else None
            if heads:
                data = _unpermute(np.asarray(data), heads)
            layer = name.removesuffix(".weight")
            loaded.setdefault(name, set()).add(part)
            if kinds.get(layer) == {True}:
                parts = quantized.setdefault(layer, {})
                parts[part or 0] = unpack(type_name, data, *shape)
                if len(parts) == count[layer]:  # packed now: no layer's bytes wait for others
                    method_for(list(parts.values())).load(
                        modules[layer], [parts[i] for i in sorted(parts)])
                    del quantized[layer]
                continue
            if type_name not in _FLOATS and type_name != "BF16":
                dequantized.add(type_name)
            value = _float(t._replace(data=data), type_name)
            if arch.startswith("gemma") and key.endswith("norm.weight"):
                value -= 1.0
            if part is not None:
                start = sum(getattr(dest, "shard_sizes", ())[:part])  # a fused parameter's
                dest = dest[start:start + shape[0]]
            dest.copy_(value)
            if part is None and type_name in FORMS:
                _tied_head(modules, dest, data, type_name, shape)
    for key, (name, part) in mapping.items():
        got = loaded.get(name, set())
        sizes = getattr(params[name], "shard_sizes", None)
        whole = None in got or (sizes is not None and got >= set(range(len(sizes))))
        if part not in got and not whole:
            raise ValueError(f"{file}: the GGUF file lacks the tensor for {key}")
    dtype = next(iter(params.values())).dtype
    for type_name in sorted(dequantized):
        logger.info("GGUF %s: %s tensors dequantized to %s at load (no kernel runs %s blocks "
                    "as they are)", file.name, type_name, str(dtype).removeprefix("torch."),
                    type_name)


def _tied_head(modules: dict, param: torch.Tensor, data, type_name: str, shape: tuple) -> None:
    """Where `param` is also the LM head's weight (tied embeddings), the head
    runs on the file's blocks (layers/quantization/gguf)."""
    head = modules.get("lm_head")
    if (isinstance(head, Linear) and head.weight is param and head.quant_method is None
            and tuple(param.shape) == shape):
        blocks = unpack(type_name, data, *shape)
        method_for([blocks]).load(head, [blocks])


def _match(model: CausalLM, reader, file: Path, arch: str, mapping: dict, params: dict) -> list:
    """(tensor, Hugging Face name, our parameter, part) of each tensor the
    model reads, its shape checked."""
    skip = set(getattr(model, "skipped_checkpoint_keys", lambda: ())())
    out = []
    for t in reader.tensors:
        if t.name in _CONFIG_TENSORS:
            continue
        key = hf_name(t.name, arch)
        if key in skip:
            continue
        if key is None or key not in mapping:
            raise ValueError(f"{file}: tensor {t.name} is not a weight of "
                             f"{type(model).__name__} ({model.config.architecture})")
        name, part = mapping[key]
        dest = params[name]
        rows = getattr(dest, "shard_sizes", ())[part] if part is not None else dest.shape[0]
        want = (rows, *dest.shape[1:])
        shape = tuple(reversed([int(d) for d in t.shape]))
        if shape != want:
            raise ValueError(f"{file}: tensor {t.name} has shape {shape}, the model expects "
                             f"{want}")
        out.append((t, key, name, part))
    return out
