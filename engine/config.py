"""What the engine needs to know about a Hugging Face checkpoint, read from its
config.json (and generation_config.json): the shape every architecture shares,
its rope parameters in one standard form, and the raw config for the
architecture's own settings."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

from engine.config_checks import check_config
from engine.model_executor.models.registry import resolve_architecture

# rope types whose tables are computed here (engine.model_executor.layers.rotary)
ROPE_TYPES = ("default", "linear", "llama3", "yarn", "longrope")
_NEEDS_ORIGINAL_MAX = ("llama3", "yarn", "longrope")
# generation_config.json fields a request that leaves them unset takes, as upstream
GENERATION_FIELDS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty",
                     "presence_penalty", "frequency_penalty")


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
    architecture: str = ""
    max_model_len: int | None = None  # set by the engine args (longrope picks its table by it)
    # rope parameters in transformers 5's standard form: one dict, or one per layer type
    rope: dict = field(default_factory=dict, compare=False, repr=False)
    layer_types: tuple[str, ...] = ()
    generation_defaults: dict = field(default_factory=dict, compare=False, repr=False)
    hf: dict = field(default_factory=dict, compare=False, repr=False)  # config.json as written

    def rope_for(self, layer_type: str | None = None) -> dict:
        """The rope parameters of a layer of `layer_type` (per-layer-type dicts, else the one)."""
        if layer_type is not None and layer_type in self.rope:
            return self.rope[layer_type]
        return self.rope

    @classmethod
    def from_dir(cls, path: Path) -> ModelConfig:
        path = Path(path)
        try:
            cfg = json.loads((path / "config.json").read_text())
        except FileNotFoundError:
            raise ValueError(f"{path} has no config.json; give the folder of a Hugging Face "
                             "checkpoint") from None
        except ValueError as e:
            raise ValueError(f"{path / 'config.json'} is not valid JSON: {e}") from None
        if isinstance(cfg, dict) and isinstance(cfg.get("text_config"), dict):
            cfg = {**cfg["text_config"], **cfg}
        cfg = check_config(cfg, path)
        try:
            mt, arch = resolve_architecture(cfg)
        except ValueError as e:
            raise ValueError(f"{path}: {e}") from None
        heads = cfg["num_attention_heads"]
        head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
        max_position = cfg.get("max_position_embeddings", 4096)
        try:
            rope = rope_parameters(cfg, max_position)
        except ValueError as e:
            raise ValueError(f"{path}: {e}") from None
        gen = _generation_config(path)
        eos = gen.get("eos_token_id", cfg.get("eos_token_id"))
        eos_ids = tuple(eos if isinstance(eos, list) else [eos] if eos is not None else [])
        flat = rope if "rope_type" in rope else next(iter(rope.values()), {})
        return cls(
            model_type=mt,
            vocab_size=cfg["vocab_size"],
            hidden_size=cfg["hidden_size"],
            # every supported architecture's config.json names one (OPT: ffn_dim)
            intermediate_size=cast(int, cfg.get("intermediate_size") or cfg.get("ffn_dim")),
            num_layers=cfg["num_hidden_layers"],
            num_heads=heads,
            num_kv_heads=cfg.get("num_key_value_heads") or heads,
            head_dim=head_dim,
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
            rope_theta=flat.get("rope_theta", 10000.0),
            max_position=max_position,
            tie_word_embeddings=cfg.get("tie_word_embeddings", mt in _TIED_BY_DEFAULT),
            qkv_bias=mt in ("qwen2", "qwen2_moe") or bool(cfg.get("attention_bias", False)),
            qk_norm=mt in ("qwen3", "qwen3_moe"),
            eos_token_ids=eos_ids,
            torch_dtype=cfg.get("torch_dtype") or cfg.get("dtype"),
            architecture=arch,
            rope=rope,
            layer_types=tuple(cfg.get("layer_types") or ()),
            generation_defaults={k: gen[k] for k in GENERATION_FIELDS if gen.get(k) is not None},
            hf=cfg,
        )


# transformers' own defaults of tie_word_embeddings where config.json may omit it
_TIED_BY_DEFAULT = ("opt", "gemma", "gemma2", "gemma3_text")


def generation_defaults(path: Path, source: str = "auto", override: dict | None = None) -> dict:
    """The sampling defaults of --generation-config (auto: the checkpoint's
    generation_config.json; vllm: none; a folder: its generation_config.json)
    with --override-generation-config over them, as upstream's
    get_diff_sampling_param; max_new_tokens is the default max_tokens."""
    if source == "vllm":
        gen: dict = {}
    else:
        folder = Path(path if source == "auto" else source)
        if not folder.is_dir():
            raise ValueError(f"--generation-config {source}: not a folder; give auto, vllm or "
                             "a folder holding generation_config.json")
        gen = _generation_config(folder)
    gen = {**gen, **(override or {})}
    out = {k: gen[k] for k in GENERATION_FIELDS if gen.get(k) is not None}
    if gen.get("max_new_tokens") is not None:
        out["max_tokens"] = gen["max_new_tokens"]
    return out


def _generation_config(path: Path) -> dict:
    gen = path / "generation_config.json"
    if not gen.is_file():
        return {}
    try:
        return json.loads(gen.read_text())
    except ValueError:
        raise ValueError(f"{gen} is not valid JSON; fix or delete it") from None


def rope_parameters(cfg: dict, max_position: int) -> dict:
    """Rope parameters as transformers 5 standardizes them (`rope_parameters`,
    a dict or one per layer type) from either form a config.json carries: that
    one, or the older `rope_scaling` + `rope_theta` (+ Gemma 3's
    `rope_local_base_freq` for its sliding layers)."""
    params = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    params = {k: (dict(v) if isinstance(v, dict) else v) for k, v in params.items()}
    theta, partial = cfg.get("rope_theta"), cfg.get("partial_rotary_factor")
    if cfg.get("model_type") == "gemma3_text" and "full_attention" not in params:
        full = {"rope_type": "default", **params, "rope_theta": theta or 1_000_000.0}
        local = {"rope_type": "default", "rope_theta": cfg.get("rope_local_base_freq", 10_000.0)}
        params = {"full_attention": full, "sliding_attention": local}
    nested = bool(params) and all(isinstance(v, dict) for v in params.values())
    for layer_type, p in (params.items() if nested else [(None, params)]):
        p.setdefault("rope_type", p.pop("type", "default"))
        if p["rope_type"] == "su":  # Phi-3's first name for longrope
            p["rope_type"] = "longrope"
        p.setdefault("rope_theta", theta if theta is not None else 10000.0)
        if partial is not None:
            p.setdefault("partial_rotary_factor", partial)
        if p["rope_type"] not in ROPE_TYPES:
            where = f" (layer type {layer_type})" if layer_type else ""
            raise ValueError(f"rope type {p['rope_type']!r}{where} is not supported; supported: "
                             f"{', '.join(ROPE_TYPES)}")
        if p["rope_type"] in _NEEDS_ORIGINAL_MAX:
            if not nested and "original_max_position_embeddings" in cfg:
                p["original_max_position_embeddings"] = cfg["original_max_position_embeddings"]
            p.setdefault("original_max_position_embeddings", max_position)
    return params
