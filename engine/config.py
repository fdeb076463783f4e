"""What the engine needs to know about a Hugging Face checkpoint of the Llama
family (Llama, Mistral, Qwen2, Qwen3), read from its config.json."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from engine.model_executor.models.registry import SUPPORTED_MODEL_TYPES


@dataclass(frozen=True)
class ModelConfig:
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position: int
    tie_word_embeddings: bool
    qkv_bias: bool  # Qwen2
    qk_norm: bool  # Qwen3: RMSNorm of each head's q and k
    eos_token_ids: tuple[int, ...]
    torch_dtype: str | None

    @classmethod
    def from_dir(cls, path: Path) -> "ModelConfig":
        path = Path(path)
        try:
            cfg = json.loads((path / "config.json").read_text())
        except FileNotFoundError:
            raise ValueError(f"{path} has no config.json; give the folder of a Hugging Face "
                             "checkpoint") from None
        mt = cfg.get("model_type")
        if mt not in SUPPORTED_MODEL_TYPES:
            raise ValueError(f"{path}: model_type {mt!r} is not supported; supported: "
                             f"{', '.join(SUPPORTED_MODEL_TYPES)}")
        scaling = cfg.get("rope_scaling") or {}
        kind = scaling.get("rope_type", scaling.get("type", "default"))
        if kind not in ("default", None):
            raise ValueError(f"{path}: rope_scaling {kind!r} is not supported yet")
        eos = cfg.get("eos_token_id")
        gen = path / "generation_config.json"
        if gen.is_file():
            eos = json.loads(gen.read_text()).get("eos_token_id", eos)
        eos_ids = tuple(eos if isinstance(eos, list) else [eos] if eos is not None else [])
        heads = cfg["num_attention_heads"]
        rope = cfg.get("rope_parameters") or {}
        return cls(
            model_type=mt,
            vocab_size=cfg["vocab_size"],
            hidden_size=cfg["hidden_size"],
            intermediate_size=cfg["intermediate_size"],
            num_layers=cfg["num_hidden_layers"],
            num_heads=heads,
            num_kv_heads=cfg.get("num_key_value_heads") or heads,
            head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
            rope_theta=cfg.get("rope_theta", rope.get("rope_theta", 10000.0)),
            max_position=cfg.get("max_position_embeddings", 4096),
            tie_word_embeddings=cfg.get("tie_word_embeddings", False),
            qkv_bias=mt == "qwen2" or bool(cfg.get("attention_bias", False)),
            qk_norm=mt == "qwen3",
            eos_token_ids=eos_ids,
            torch_dtype=cfg.get("torch_dtype") or cfg.get("dtype"),
        )
