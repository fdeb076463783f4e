"""config.json's fields checked before anything is built from them: a
checkpoint whose config is not a JSON object, or whose sizes are not positive
integers and epsilons not positive numbers, is refused in one line naming the
field, instead of a torch or pybind11 traceback from deep inside the model."""
from __future__ import annotations

import math
from pathlib import Path

# sizes every architecture's model is built from: positive integers where present
POSITIVE_INTS = ("vocab_size", "hidden_size", "intermediate_size", "ffn_dim",
                 "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
                 "max_position_embeddings", "num_experts", "num_local_experts",
                 "num_experts_per_tok", "moe_intermediate_size")
POSITIVE_FLOATS = ("rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon", "rope_theta")
REQUIRED = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads")


def check_config(cfg: object, path: Path) -> dict:
    """cfg as read from path/config.json, or ValueError naming what is wrong."""
    where = path / "config.json"
    if not isinstance(cfg, dict):
        raise ValueError(f"{where} holds a JSON {type(cfg).__name__}, not an object; "
                         "it must be the checkpoint's configuration (a {...} of its fields)")
    for name in REQUIRED:
        if name not in cfg:
            raise ValueError(f"{where} has no {name}; a checkpoint's config.json names it")
    for name in POSITIVE_INTS:
        value = cfg.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{where}: {name} must be a positive integer, got {value!r}")
    for name in POSITIVE_FLOATS:
        value = cfg.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) \
                or not math.isfinite(value) or value <= 0:
            raise ValueError(f"{where}: {name} must be a positive number, got {value!r}")
    heads, kv = cfg["num_attention_heads"], cfg.get("num_key_value_heads") or cfg[
        "num_attention_heads"]
    if heads % kv:
        raise ValueError(f"{where}: num_attention_heads ({heads}) must be a multiple of "
                         f"num_key_value_heads ({kv})")
    if not cfg.get("head_dim") and cfg["hidden_size"] % heads:
        raise ValueError(f"{where}: hidden_size ({cfg['hidden_size']}) must be a multiple of "
                         f"num_attention_heads ({heads}) when head_dim is not given")
    return cfg
