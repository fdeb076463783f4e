"""A GGUF file's metadata as the config.json (and generation_config.json) of
the Hugging Face checkpoint it was converted from, for the families llama.cpp's
convert_hf_to_gguf.py writes: Llama (and Mistral, which it writes as llama),
Qwen2, Qwen3, Phi-3, Gemma 2, Gemma 3 and Granite."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from engine.transformers_utils.gguf_reader import meta

# general.architecture -> (config.json architectures, model_type)
ARCHITECTURES = {
    "llama": ("LlamaForCausalLM", "llama"),
    "qwen2": ("Qwen2ForCausalLM", "qwen2"),
    "qwen3": ("Qwen3ForCausalLM", "qwen3"),
    "phi3": ("Phi3ForCausalLM", "phi3"),
    "gemma2": ("Gemma2ForCausalLM", "gemma2"),
    "gemma3": ("Gemma3ForCausalLM", "gemma3_text"),
    "granite": ("GraniteForCausalLM", "granite"),
}
# {arch}.KEY -> config.json key, each optional
_OPTIONAL = {"attention.head_count_kv": "num_key_value_heads",
             "attention.key_length": "head_dim",
             "attention.layer_norm_rms_epsilon": "rms_norm_eps",
             "rope.freq_base": "rope_theta",
             "attention.sliding_window": "sliding_window",
             "attn_logit_softcapping": "attn_logit_softcapping",  # Gemma 2
             "final_logit_softcapping": "final_logit_softcapping",
             "embedding_scale": "embedding_multiplier",  # Granite's four
             "residual_scale": "residual_multiplier",
             "attention.scale": "attention_multiplier",
             "logit_scale": "logits_scaling"}
_REQUIRED = {"embedding_length": "hidden_size", "feed_forward_length": "intermediate_size",
             "block_count": "num_hidden_layers", "attention.head_count": "num_attention_heads",
             "context_length": "max_position_embeddings"}
# llama.cpp's token ids that end a turn besides eos
_END_IDS = ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id",
            "tokenizer.ggml.eom_token_id")
_FLOAT_DTYPES = {"F32": "float32", "F16": "float16", "BF16": "bfloat16"}


def architecture(reader, path: Path) -> str:
    arch = meta(reader, path, "general.architecture")
    if arch not in ARCHITECTURES:
        raise ValueError(f"{path}: GGUF architecture {arch!r} is not supported; supported: "
                         f"{', '.join(ARCHITECTURES)}")
    return arch


def hf_config(reader, path: Path) -> dict:
    """config.json of the file: shape, rope, tied embeddings (no output.weight),
    vocabulary (token_embd's rows), the dtype its float tensors are stored in."""
    arch = architecture(reader, path)
    archs, model_type = ARCHITECTURES[arch]
    cfg: dict = {"architectures": [archs], "model_type": model_type}
    for key, name in _REQUIRED.items():
        cfg[name] = int(meta(reader, path, f"{arch}.{key}"))
    for key, name in _OPTIONAL.items():
        value = meta(reader, path, f"{arch}.{key}", None)
        if isinstance(value, float):  # stored as float32: its shortest decimal (1e-06)
            value = float(str(np.float32(value)))
        if value is not None:
            cfg[name] = value
    if not cfg.get("sliding_window"):  # Phi-4's files write 0 for none
        cfg.pop("sliding_window", None)
    tensors = {t.name: t for t in reader.tensors}
    embed = tensors.get("token_embd.weight")
    if embed is None:
        raise ValueError(f"{path}: the GGUF file has no token_embd.weight tensor")
    cfg["vocab_size"] = int(embed.shape[1])
    cfg["tie_word_embeddings"] = "output.weight" not in tensors
    heads = cfg["num_attention_heads"]
    head_dim = cfg.setdefault("head_dim", cfg["hidden_size"] // heads)
    rot = meta(reader, path, f"{arch}.rope.dimension_count", None)
    if rot is not None and int(rot) != head_dim:
        cfg["partial_rotary_factor"] = int(rot) / head_dim
    cfg.update(_rope_scaling(reader, path, arch, tensors, cfg))
    if model_type.startswith("gemma"):
        cfg.update(_gemma(reader, path, arch, cfg))
    bos = meta(reader, path, "tokenizer.ggml.bos_token_id", None)
    if bos is not None:
        cfg["bos_token_id"] = int(bos)
    cfg["eos_token_id"] = eos_ids(reader, path)
    cfg["torch_dtype"] = _float_dtype(reader)
    return cfg


def eos_ids(reader, path: Path) -> list[int]:
    ids: list[int] = []
    for key in _END_IDS:
        value = meta(reader, path, key, None)
        if value is not None and int(value) not in ids:
            ids.append(int(value))
    return ids


def generation_config(reader, path: Path) -> dict:
    out: dict = {"eos_token_id": eos_ids(reader, path)}
    bos = meta(reader, path, "tokenizer.ggml.bos_token_id", None)
    if bos is not None:
        out["bos_token_id"] = int(bos)
    return out


def _rope_scaling(reader, path: Path, arch: str, tensors: dict, cfg: dict) -> dict:
    """llama.cpp's rope scaling: linear and yarn as metadata; Llama 3's as a
    rope_freqs tensor of per-frequency factors, whose parameters are found
    again among the ones Llama 3.x ship (else refused: no other is known)."""
    kind = meta(reader, path, f"{arch}.rope.scaling.type", None)
    factor = meta(reader, path, f"{arch}.rope.scaling.factor", None)
    orig = meta(reader, path, f"{arch}.rope.scaling.original_context_length", None)
    if "rope_freqs.weight" in tensors:
        return {"rope_scaling": _llama3_params(tensors["rope_freqs.weight"], path, cfg)}
    if "rope_factors_long.weight" in tensors:
        raise ValueError(f"{path}: longrope factors (rope_factors_long.weight) are not read from "
                         "GGUF files yet; give --hf-config-path with the model's config.json")
    if kind in (None, "none") or factor is None:
        return {}
    if kind not in ("linear", "yarn"):
        raise ValueError(f"{path}: GGUF rope scaling {kind!r} is not supported; supported: "
                         "linear, yarn")
    out: dict = {"rope_type": kind, "factor": float(factor)}
    if orig is not None:
        out["original_max_position_embeddings"] = int(orig)
    for beta in ("beta_fast", "beta_slow"):  # yarn's, where the file sets them
        value = meta(reader, path, f"{arch}.rope.scaling.yarn_{beta}", None)
        if value is not None:
            out[beta] = float(value)
    return {"rope_scaling": out}


def _llama3_params(tensor, path: Path, cfg: dict) -> dict:
    factors = np.asarray(tensor.data, dtype=np.float32).reshape(-1)
    dim = int(cfg["head_dim"] * cfg.get("partial_rotary_factor", 1.0))
    base = float(cfg.get("rope_theta", 10000.0))
    inv = 1.0 / base ** (np.arange(0, dim, 2, dtype=np.float64) / dim)
    wavelen = 2 * math.pi / inv
    for old in (8192, 16384, 32768, 4096, 131072):
        for factor in (8.0, 32.0, 16.0, 4.0):
            for low, high in ((1.0, 4.0), (1.0, 2.0)):
                smooth = (old / wavelen - low) / (high - low)
                want = np.where(wavelen < old / high, 1.0, np.where(
                    wavelen > old / low, factor, 1 / ((1 - smooth) / factor + smooth)))
                if want.shape == factors.shape and np.allclose(want, factors, rtol=1e-3):
                    return {"rope_type": "llama3", "factor": factor, "low_freq_factor": low,
                            "high_freq_factor": high, "original_max_position_embeddings": old}
    raise ValueError(f"{path}: rope_freqs.weight holds rope factors of no known Llama 3 "
                     "scaling; give --hf-config-path with the model's config.json")


# layers of Gemma's 27B models, whose attention scale llama.cpp takes from the
# width per head rather than head_dim (as gemma_pytorch does)
_GEMMA_27B_LAYERS = {"gemma2": 46, "gemma3": 62}


def _gemma(reader, path: Path, arch: str, cfg: dict) -> dict:
    """What llama.cpp fixes for Gemma rather than stores (src/models/gemma*.cpp):
    the attention scale, GeLU-tanh, the local rope base and the pattern of
    sliding layers (every other for Gemma 2, five in six for Gemma 3, unless
    the file gives a period or one flag a layer)."""
    layers = cfg["num_hidden_layers"]
    scalar = cfg["hidden_size"] // cfg["num_attention_heads"] \
        if layers == _GEMMA_27B_LAYERS[arch] else cfg["head_dim"]
    out: dict = {"query_pre_attn_scalar": scalar, "hidden_activation": "gelu_pytorch_tanh"}
    pattern = meta(reader, path, f"{arch}.attention.sliding_window_pattern", None)
    if isinstance(pattern, int) and not isinstance(pattern, bool) and pattern > 0:
        pattern = [i % pattern < pattern - 1 for i in range(layers)]
    if isinstance(pattern, list) and len(pattern) == layers:
        out["layer_types"] = ["sliding_attention" if p else "full_attention" for p in pattern]
    if arch == "gemma3":
        local = meta(reader, path, f"{arch}.rope.freq_base_swa", 10000.0)
        out["rope_local_base_freq"] = float(str(np.float32(local)))
    return out


def _float_dtype(reader) -> str | None:
    """The dtype of the file's 2-D float tensors (a BF16 file serves in
    bfloat16 by default); None (float32) for quantized files, as for a
    checkpoint that names none."""
    names = {t.tensor_type.name for t in reader.tensors if len(t.shape) > 1}
    floats = [_FLOAT_DTYPES[n] for n in names if n in _FLOAT_DTYPES]
    return floats[0] if len(floats) == len(names) == 1 else None
