"""Load a GGUF file's tensors into a model (upstream's
model_loader/gguf_loader.py): llama.cpp's tensor names mapped back to the
Hugging Face ones the model's checkpoint_map() reads, llama.cpp's Q/K row
permutation of llama-family attention undone, Gemma's norms shifted back by
the 1 llama.cpp adds; quantized linear weights repacked for the wna16 kernels
(layers/quantization/gguf), every other tensor (embeddings, norms, types no
kernel holds exactly) dequantized to the model's dtype. Under tensor
parallelism each rank reads its rows or columns of the file's blocks
(gguf_shard); under pipeline parallelism each stage its own tensors."""
from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from engine.model_executor.gguf_shard import block_size, block_slice, pad_rows, whole_blocks
from engine.model_executor.layers.linear import Linear
from engine.model_executor.layers.parallel import checkpoint_slice, stage_holds
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
# split by vocabulary rows over the ranks (layers/parallel.vocab_range)
_VOCAB = ("model.embed_tokens.weight", "lm_head.weight")


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


def _float(data, type_name: str) -> torch.Tensor:
    """The tensor in float32, [rows, cols] as the model holds it (`data` as
    the gguf reader gives it, or rows or whole blocks of columns of it)."""
    if type_name in _FLOATS:
        return torch.from_numpy(np.array(data, dtype=_FLOATS[type_name])).float()
    raw = np.ascontiguousarray(data)
    if type_name == "BF16":
        return torch.from_numpy(raw.view(np.int16).copy()).view(torch.bfloat16).float()
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    return torch.from_numpy(dequantize(raw, GGMLQuantizationType[type_name]))


def load_gguf(model: CausalLM, file: Path) -> None:
    """Read every tensor of `file` (this rank's part of it) into `model`; one
    line naming the tensor for one the model does not know, one whose shape
    does not fit, and one the model needs that the file lacks."""
    reader = open_gguf(file)
    arch = architecture(reader, file)
    params = dict(model.named_parameters())
    modules = dict(model.named_modules())
    mapping = model.checkpoint_map()
    tensors = _match(model, reader, file, arch, mapping, params)
    # a linear layer runs quantized when every part of it is of a type a kernel
    # holds, cut (tensor parallel) between its blocks
    kinds: dict[str, set[bool]] = {}
    count: dict[str, int] = {}  # each linear layer's parts in the file
    for t, key, name, part, cut in tensors:
        layer = name.removesuffix(".weight")
        if name.endswith(".weight") and isinstance(modules.get(layer), Linear):
            type_name = t.tensor_type.name
            kinds.setdefault(layer, set()).add(type_name in FORMS and whole_blocks(type_name, cut))
            count[layer] = count.get(layer, 0) + 1
    quantized: dict[str, dict[int, Unpacked]] = {}  # linear layer -> its parts' blocks
    dequantized: set[str] = set()
    split: dict[str, set[str]] = {}  # type -> layers whose columns this rank cut inside blocks
    loaded: dict[str, set] = {}
    with torch.no_grad():
        for t, key, name, part, cut in tensors:
            dest: torch.Tensor = params[name]
            if part is not None:  # a fused parameter's rows
                start = sum(dest.shard_sizes[:part])  # type: ignore[attr-defined]
                dest = dest[start:start + dest.shard_sizes[part]]  # type: ignore[attr-defined]
            data, type_name = t.data, t.tensor_type.name
            heads = {"attn_q": model.config.num_heads, "attn_k": model.config.num_kv_heads}.get(
                t.name.split(".")[-2]) if arch in _PERMUTED else None
            if heads:  # llama.cpp permuted each head's rows: undone before a rank's cut
                data = _unpermute(np.asarray(data), heads)
            mine = data if cut is None else block_slice(data, type_name, *cut)
            layer = name.removesuffix(".weight")
            loaded.setdefault(name, set()).add(part)
            if kinds.get(layer) == {True}:
                assert mine is not None, "a quantized layer's cuts fall between blocks"
                parts = quantized.setdefault(layer, {})
                parts[part or 0] = unpack(type_name, pad_rows(mine, dest.shape[0]), *dest.shape)
                if len(parts) == count[layer]:  # packed now: no layer's bytes wait for others
                    method_for(list(parts.values())).load(
                        modules[layer], [parts[i] for i in sorted(parts)])
                    del quantized[layer]
                continue
            if mine is None:  # columns cut inside blocks: the floats' columns
                assert cut is not None
                split.setdefault(type_name, set()).add(layer)
                value = _float(data, type_name)[:, cut[1]:cut[2]]
            else:
                if type_name not in _FLOATS and type_name != "BF16":
                    dequantized.add(type_name)
                value = _float(mine, type_name)
            if arch.startswith("gemma") and key.endswith("norm.weight"):
                value -= 1.0
            rows = value.shape[0]
            dest[:rows].copy_(value)
            dest[rows:].zero_()  # the last rank's rows past the vocabulary
            if part is None and mine is not None and type_name in FORMS:
                _tied_head(modules, dest, pad_rows(mine, dest.shape[0]), type_name)
    for key, (name, part) in mapping.items():
        got = loaded.get(name, set())
        sizes = getattr(params[name], "shard_sizes", None)
        whole = None in got or (sizes is not None and got >= set(range(len(sizes))))
        if part not in got and not whole:
            raise ValueError(f"{file}: the GGUF file lacks the tensor for {key}")
    _log_floats(file, next(iter(params.values())).dtype, dequantized, split)


def _log_floats(file: Path, dtype: torch.dtype, dequantized: set[str],
                split: dict[str, set[str]]) -> None:
    """One line per type of the tensors dequantized at load, and why."""
    dt = str(dtype).removeprefix("torch.")
    for type_name in sorted(dequantized):
        logger.info("GGUF %s: %s tensors dequantized to %s at load (no kernel runs %s blocks "
                    "as they are)", file.name, type_name, dt, type_name)
    for type_name, layers in sorted(split.items()):
        kinds: dict[str, int] = {}  # layers.3.o_proj -> o_proj: one count for every layer's
        for layer in layers:
            stem = re.sub(r"^layers\.\d+\.", "", layer)
            kinds[stem] = kinds.get(stem, 0) + 1
        named = ", ".join(f"{k} ({n} layers)" for k, n in sorted(kinds.items()))
        logger.info("GGUF %s: %s in %s dequantized to %s at load and run unquantized: tensor "
                    "parallel cuts their input columns inside %s blocks of %d values (a "
                    "block's scale would serve two ranks)", file.name, named, type_name, dt,
                    type_name, block_size(type_name))


def _tied_head(modules: dict, param: torch.Tensor, data, type_name: str) -> None:
    """Where `param` is also the LM head's weight (tied embeddings), the head
    runs on the file's blocks (layers/quantization/gguf)."""
    head = modules.get("lm_head")
    if isinstance(head, Linear) and head.weight is param and head.quant_method is None:
        blocks = unpack(type_name, data, *param.shape)
        method_for([blocks]).load(head, [blocks])


def _match(model: CausalLM, reader, file: Path, arch: str, mapping: dict, params: dict) -> list:
    """(tensor, Hugging Face name, our parameter, part, this rank's cut: (dim,
    start, end) or None for the whole) of each tensor this rank reads, the
    shape of its part checked."""
    skip = set(getattr(model, "skipped_checkpoint_keys", lambda: ())())
    c = model.config
    out = []
    for t in reader.tensors:
        if t.name in _CONFIG_TENSORS:
            continue
        key = hf_name(t.name, arch)
        if key in skip or (key is not None and not stage_holds(c, key)):  # another stage's
            continue
        if key is None or key not in mapping:
            raise ValueError(f"{file}: tensor {t.name} is not a weight of "
                             f"{type(model).__name__} ({c.architecture})")
        name, part = mapping[key]
        dest = params[name]
        rows = getattr(dest, "shard_sizes", ())[part] if part is not None else dest.shape[0]
        want = (rows, *dest.shape[1:])
        shape = tuple(reversed([int(d) for d in t.shape]))
        cut = checkpoint_slice(c, key)
        got = shape
        if cut is not None and key in _VOCAB:  # its rows per rank, the last rank's padded
            want = (c.vocab_size, *want[1:])
        elif cut is not None:
            dim, start, end = cut
            got = shape[:dim] + (min(end, shape[dim]) - start,) + shape[dim + 1:]
        if got != want:
            note = "" if got == shape else f" (this rank's part {got})"
            raise ValueError(f"{file}: tensor {t.name} has shape {shape}{note}, the model "
                             f"expects {want}")
        out.append((t, key, name, part, cut))
    return out
