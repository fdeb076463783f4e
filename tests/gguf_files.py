"""GGUF files for the tests, written from a tiny Hugging Face checkpoint (engine's
make_tiny_model) as llama.cpp's convert_hf_to_gguf.py writes them: its tensor
names and metadata keys (spelled out here, apart from the engine's own
tables, so that a wrong name on either side fails), q/k rows permuted for the
llama family, Gemma's norms + 1, a byte-level BPE tokenizer as `gpt2`. Weights
are quantized by gguf.quants.quantize where it can; the K-quants, which the
gguf package only dequantizes, by the small round-to-nearest packers here
(valid blocks; not llama.cpp's error-minimizing search)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

# Hugging Face suffix in a layer -> llama.cpp's
LAYER = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q",
         "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
         "self_attn.o_proj": "attn_output", "self_attn.qkv_proj": "attn_qkv",
         "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
         "post_attention_layernorm": "ffn_norm", "mlp.gate_proj": "ffn_gate",
         "mlp.up_proj": "ffn_up", "mlp.gate_up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
GEMMA = {"post_attention_layernorm": "post_attention_norm",
         "pre_feedforward_layernorm": "ffn_norm",
         "post_feedforward_layernorm": "post_ffw_norm"}
TOP = {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output"}
ARCH = {"llama": "llama", "mistral": "llama", "granite": "granite", "qwen2": "qwen2",
        "qwen3": "qwen3", "phi3": "phi3", "gemma2": "gemma2", "gemma3_text": "gemma3"}
# a shape every block type divides (K-quant rows are 256 values)
QUANT_SHAPE = dict(hidden_size=256, intermediate_size=512, num_attention_heads=4,
                   num_key_value_heads=2, head_dim=64, num_hidden_layers=2)


def gguf_name(hf: str, arch: str) -> str:
    stem, _, kind = hf.rpartition(".")
    if stem in TOP:
        return f"{TOP[stem]}.{kind}"
    _, _, i, rest = stem.split(".", 3)
    table = {**LAYER, **(GEMMA if arch.startswith("gemma") else {})}
    return f"blk.{i}.{table[rest]}.{kind}"


def permute(w: np.ndarray, heads: int) -> np.ndarray:
    """convert_hf_to_gguf.py's LlamaModel.permute."""
    return (w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


# llama.cpp's type for a tensor whose rows are not whole 256-value super-blocks
FALLBACK = {"Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0"}


def quantize(w: np.ndarray, qtype: str) -> np.ndarray:
    from gguf import GGMLQuantizationType, quants

    if qtype in KQUANTS:
        return KQUANTS[qtype](w)
    return quants.quantize(w, GGMLQuantizationType[qtype])


def dequantize(data: np.ndarray, qtype: str) -> np.ndarray:
    from gguf import GGMLQuantizationType, quants

    return quants.dequantize(data, GGMLQuantizationType[qtype])


def write_gguf(src: Path, out: Path, qtype: str = "F32", *, types: dict | None = None,
               dequantized_dir: Path | None = None, drop: tuple[str, ...] = (),
               meta_drop: tuple[str, ...] = (), extra: dict | None = None,
               meta: dict | None = None) -> Path:
    """src (a make_tiny_model folder) as a GGUF file at out: 2-D weights in
    qtype (or types[gguf name]), 1-D ones F32. dequantized_dir: the same
    checkpoint with each weight as the GGUF holds it (dequantized), for the
    engine to load beside the file. extra: more F32 tensors by GGUF name
    (rope_freqs.weight); meta: more metadata, key -> (add_KIND, value)."""
    import gguf
    import torch
    from safetensors.torch import load_file, save_file

    cfg = json.loads((src / "config.json").read_text())
    mt = cfg["model_type"]
    arch = ARCH[mt]
    tensors = load_file(str(src / "model.safetensors"))
    w = gguf.GGUFWriter(str(out), arch)
    _metadata(w, cfg, arch, src, meta_drop)
    for key, (kind, value) in (meta or {}).items():
        getattr(w, f"add_{kind}")(key, value)
    back = {}
    for hf, value in tensors.items():
        name = gguf_name(hf, arch)
        if name in drop:
            continue
        a = value.float().numpy()
        if arch.startswith("gemma") and hf.endswith("norm.weight"):
            a = a + 1
        if arch in ("llama", "granite") and name.endswith(("attn_q.weight", "attn_k.weight")):
            heads = cfg["num_attention_heads"] if ".attn_q." in name else cfg["num_key_value_heads"]
            a = permute(a, heads)
        t = (types or {}).get(name, qtype) if a.ndim == 2 else "F32"
        if a.shape[-1] % 256 and t in FALLBACK:
            t = FALLBACK[t]
        if t == "F32":
            data, held = a, a
        elif t == "F16":
            data = a.astype(np.float16)
            held = data.astype(np.float32)
        else:
            data = quantize(a, t)
            held = dequantize(data, t)
        w.add_tensor(name, data, raw_dtype=gguf.GGMLQuantizationType[t])
        back[hf] = torch.from_numpy(np.ascontiguousarray(_unheld(held, hf, name, arch, cfg)))
    for name, a in (extra or {}).items():
        w.add_tensor(name, np.asarray(a, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    if dequantized_dir is not None:
        import shutil

        shutil.copytree(src, dequantized_dir)
        save_file(back, str(dequantized_dir / "model.safetensors"), metadata={"format": "pt"})
    return out


def _unheld(held, hf, name, arch, cfg):
    """What the file holds, back in the Hugging Face layout."""
    if arch.startswith("gemma") and hf.endswith("norm.weight"):
        held = held - 1
    if arch in ("llama", "granite") and name.endswith(("attn_q.weight", "attn_k.weight")):
        heads = cfg["num_attention_heads"] if ".attn_q." in name else cfg["num_key_value_heads"]
        h = held.shape[0] // heads // 2
        held = held.reshape(heads, h, 2, -1).swapaxes(1, 2).reshape(held.shape)
    return held.astype(np.float32)


def _metadata(w, cfg: dict, arch: str, src: Path, drop: tuple[str, ...]) -> None:
    keys = {f"{arch}.context_length": ("uint32", cfg["max_position_embeddings"]),
            f"{arch}.embedding_length": ("uint32", cfg["hidden_size"]),
            f"{arch}.block_count": ("uint32", cfg["num_hidden_layers"]),
            f"{arch}.feed_forward_length": ("uint32", cfg["intermediate_size"]),
            f"{arch}.attention.head_count": ("uint32", cfg["num_attention_heads"]),
            f"{arch}.attention.head_count_kv": ("uint32", cfg["num_key_value_heads"]),
            f"{arch}.attention.key_length": ("uint32", cfg["head_dim"]),
            f"{arch}.attention.value_length": ("uint32", cfg["head_dim"]),
            f"{arch}.attention.layer_norm_rms_epsilon": ("float32", cfg["rms_norm_eps"]),
            f"{arch}.rope.freq_base": ("float32", cfg.get("rope_theta") or cfg.get(
                "rope_parameters", {}).get("rope_theta", 10000.0)),
            f"{arch}.rope.dimension_count": (
                "uint32", int(cfg["head_dim"] * cfg.get("partial_rotary_factor", 1.0)))}
    if cfg.get("sliding_window") and arch != "llama":
        keys[f"{arch}.attention.sliding_window"] = ("uint32", cfg["sliding_window"])
    for ours, theirs in (("attn_logit_softcapping", "attn_logit_softcapping"),
                         ("final_logit_softcapping", "final_logit_softcapping"),
                         ("embedding_multiplier", "embedding_scale"),
                         ("residual_multiplier", "residual_scale"),
                         ("attention_multiplier", "attention.scale"),
                         ("logits_scaling", "logit_scale")):
        if cfg.get(ours) is not None:
            keys[f"{arch}.{theirs}"] = ("float32", cfg[ours])
    for key, (kind, value) in keys.items():
        if key not in drop:
            getattr(w, f"add_{kind}")(key, value)
    if arch == "gemma3" and cfg.get("layer_types"):
        w.add_array(f"{arch}.attention.sliding_window_pattern",
                    [t == "sliding_attention" for t in cfg["layer_types"]])
    _tokenizer(w, src, cfg)


def _tokenizer(w, src: Path, cfg: dict) -> None:
    """A byte-level BPE as `gpt2`; a word-level vocabulary (tests/helpers'
    make_checkpoint) as a scoreless `llama` one, enough for llama.cpp to load
    and detokenize (the engine then takes --tokenizer)."""
    tok = json.loads((src / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    special = {a["content"] for a in tok.get("added_tokens") or () if a.get("special")}
    if "merges" not in tok["model"]:
        w.add_tokenizer_model("llama")
        w.add_token_list(tokens)
        w.add_token_scores([0.0] * len(tokens))
        w.add_token_types([3 if i < 3 else 1 for i in range(len(tokens))])
        w.add_bos_token_id(cfg["bos_token_id"])
        w.add_eos_token_id(cfg["eos_token_id"])
        return
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([3 if t in special else 1 for t in tokens])
    w.add_token_merges(merges)
    w.add_bos_token_id(cfg["bos_token_id"])
    eos = cfg["eos_token_id"]
    w.add_eos_token_id(eos[0] if isinstance(eos, list) else eos)
    if isinstance(eos, list) and len(eos) > 1:
        w.add_eot_token_id(eos[1])
    w.add_add_bos_token(True)
    tc = json.loads((src / "tokenizer_config.json").read_text())
    w.add_chat_template(tc["chat_template"])


# ---- K-quant blocks: round to nearest, laid out as ggml-quants.c lays them out ----

def _f16(a: np.ndarray) -> np.ndarray:
    return a.astype(np.float16).view(np.uint8).reshape(len(a), 2)


def _scale_min_bytes(sc: np.ndarray, mn: np.ndarray) -> np.ndarray:
    """8 six-bit scales and mins -> the 12 bytes get_scale_min reads."""
    out = np.empty((len(sc), 12), np.uint8)
    out[:, 0:4] = sc[:, :4] | ((sc[:, 4:] >> 4) << 6)
    out[:, 4:8] = mn[:, :4] | ((mn[:, 4:] >> 4) << 6)
    out[:, 8:12] = (sc[:, 4:] & 0xF) | ((mn[:, 4:] & 0xF) << 4)
    return out


def _k_with_min(x: np.ndarray, top: int):
    """(q [B, 8, 32], d, dmin, sc, m) of blocks x [B, 256], q in 0..top."""
    sub = x.reshape(-1, 8, 32)
    lo = np.minimum(sub.min(-1), 0)
    scale = np.maximum((sub.max(-1) - lo) / top, 1e-8)
    d = (scale.max(-1) / 63).astype(np.float16).astype(np.float32)
    dmin = (-lo.min(-1) / 63).astype(np.float16).astype(np.float32)
    sc = np.clip(np.round(scale / np.maximum(d, 1e-12)[:, None]), 1, 63).astype(np.uint8)
    m = np.clip(np.round(-lo / np.maximum(dmin, 1e-12)[:, None]), 0, 63).astype(np.uint8)
    eff_s = (d[:, None] * sc)[..., None]
    eff_m = (dmin[:, None] * m)[..., None]
    q = np.clip(np.round((sub + eff_m) / eff_s), 0, top).astype(np.uint8)
    return q, d, dmin, sc, m


def _nibble_chunks(q: np.ndarray) -> np.ndarray:
    """[B, 8, 32] 4-bit values -> 128 bytes: chunk c holds sub-blocks 2c (low) and 2c + 1."""
    return (q[:, 0::2] | (q[:, 1::2] << 4)).reshape(-1, 128)


def q4_k(w: np.ndarray) -> np.ndarray:
    x = w.reshape(-1, 256)
    q, d, dmin, sc, m = _k_with_min(x, 15)
    blocks = np.concatenate([_f16(d), _f16(dmin), _scale_min_bytes(sc, m), _nibble_chunks(q)], 1)
    return blocks.reshape(w.shape[0], -1)


def q5_k(w: np.ndarray) -> np.ndarray:
    x = w.reshape(-1, 256)
    q, d, dmin, sc, m = _k_with_min(x, 31)
    qh = np.zeros((len(x), 32), np.uint8)
    for j in range(8):
        qh |= ((q[:, j] >> 4) & 1) << j
    blocks = np.concatenate([_f16(d), _f16(dmin), _scale_min_bytes(sc, m), qh,
                             _nibble_chunks(q & 0xF)], 1)
    return blocks.reshape(w.shape[0], -1)


def q6_k(w: np.ndarray) -> np.ndarray:
    x = w.reshape(-1, 16, 16)
    scale = np.maximum(np.abs(x).max(-1) / 31, 1e-8)
    d = (scale.max(-1) / 127).astype(np.float16).astype(np.float32)
    sc = np.clip(np.round(scale / d[:, None]), 1, 127).astype(np.int8)
    q = (np.clip(np.round(x / (d[:, None] * sc)[..., None]), -32, 31) + 32).astype(np.uint8)
    q = q.reshape(-1, 2, 4, 32)  # [B, half, j, 32]
    ql = np.concatenate([q[:, :, 0] & 0xF | ((q[:, :, 2] & 0xF) << 4),
                         q[:, :, 1] & 0xF | ((q[:, :, 3] & 0xF) << 4)], axis=-1)  # [B, 2, 64]
    qh = sum(((q[:, :, j] >> 4) & 3) << (2 * j) for j in range(4)).astype(np.uint8)  # [B, 2, 32]
    blocks = np.concatenate([ql.reshape(-1, 128), qh.reshape(-1, 64), sc.view(np.uint8),
                             _f16(d)], 1)
    return blocks.reshape(w.shape[0], -1)


KQUANTS = {"Q4_K": q4_k, "Q5_K": q5_k, "Q6_K": q6_k}
