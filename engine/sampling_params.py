from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SamplingParams:
    """As upstream vLLM's: temperature 0 is greedy."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1  # -1 or 0: all tokens
    repetition_penalty: float = 1.0  # > 1 discourages tokens of the prompt and output
    seed: int | None = None
    max_tokens: int = 16
    stop: list[str] | str | None = None
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False

    def __post_init__(self):
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop or [])
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < -1:
            raise ValueError(f"top_k must be -1 (all) or >= 1, got {self.top_k}")
        if self.repetition_penalty <= 0:
            raise ValueError(f"repetition_penalty must be > 0, got {self.repetition_penalty}")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")


def with_model_defaults(requested: dict, model_defaults: dict) -> dict:
    """Sampling fields as upstream fills them: each one a request leaves unset
    (None) takes the checkpoint's generation_config.json value
    (ModelConfig.generation_defaults), else SamplingParams' own default."""
    out = {k: v for k, v in requested.items() if v is not None}
    for k, v in model_defaults.items():
        out.setdefault(k, v)
    if out.get("top_k") == 0:  # generation_config's "no top-k"
        out["top_k"] = -1
    return out
