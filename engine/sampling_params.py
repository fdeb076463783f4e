"""Sampling parameters, checked as upstream vLLM's SamplingParams checks them:
a bad value is a ValueError naming the field and its allowed range (the
server turns it into a 400)."""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field

logger = logging.getLogger("engine")

SAMPLING_EPS = 1e-5  # a temperature below this is greedy (upstream's _SAMPLING_EPS)
MIN_TEMPERATURE = 1e-2  # a smaller positive one is raised to this (upstream's _MAX_TEMP):
# dividing logits by 1e-39 overflows to inf, and softmax turns that into nan
MAX_TEMPERATURE = 2
MAX_LOGPROBS = 20  # upstream's default --max-logprobs
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


@dataclass
class StructuredOutputsParams:
    """What the output must match (upstream's StructuredOutputsParams): exactly
    one of json (a JSON schema, as its JSON text), regex, choice, grammar
    (EBNF), json_object or structural_tag (its JSON text). The core compiles
    it for the model's tokenizer (engine/structured_output/)."""

    json: str | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    structural_tag: str | None = None
    disable_any_whitespace: bool = False
    # the token ids that end the model's reasoning (--reasoning-parser): the
    # output is constrained only after them
    reasoning_end: list[int] | None = None

    def kind(self) -> tuple[str, str]:
        """(kind, spec text): the one constraint set, as the backend compiles it."""
        import json

        given = [(k, v) for k, v in (("json", self.json), ("regex", self.regex),
                                     ("choice", self.choice), ("grammar", self.grammar),
                                     ("json_object", self.json_object or None),
                                     ("structural_tag", self.structural_tag)) if v is not None]
        if len(given) != 1:
            names = ", ".join(k for k, _ in given) or "none"
            raise ValueError(f"structured_outputs: set exactly one of json, regex, choice, "
                             f"grammar, json_object, structural_tag (got {names})")
        k, v = given[0]
        if k == "choice":
            return k, json.dumps(v)
        return k, "" if k == "json_object" else str(v)


@dataclass
class SamplingParams:
    """As upstream vLLM's: temperature 0 is greedy; seed -1 is unseeded."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1  # -1 or 0: all tokens
    min_p: float = 0.0
    seed: int | None = None
    max_tokens: int = 16
    min_tokens: int = 0
    stop: list[str] | str | None = None
    stop_token_ids: list[int] = field(default_factory=list)
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: dict[int, float] | None = None
    logprobs: int | None = None  # top alternatives per token besides the sampled one
    prompt_logprobs: int | None = None  # the same for each prompt token after the first
    structured_outputs: StructuredOutputsParams | None = None
    # vLLM's: only these tokens may be sampled; token sequences never to complete
    allowed_token_ids: list[int] | None = None
    bad_words_token_ids: list[list[int]] | None = None
    skip_special_tokens: bool = True  # in the output's text

    def __post_init__(self):
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop or [])
        self.stop_token_ids = list(dict.fromkeys(self.stop_token_ids or []))
        if self.seed == -1:
            self.seed = None
        self._verify()
        if 0 < self.temperature < MIN_TEMPERATURE:
            logger.warning("temperature %s is below %s, which overflows the logits; using %s",
                           self.temperature, MIN_TEMPERATURE, MIN_TEMPERATURE)
            self.temperature = MIN_TEMPERATURE
        if self.temperature < SAMPLING_EPS:
            self.temperature, self.top_p, self.top_k, self.min_p = 0.0, 1.0, -1, 0.0
        if self.top_k == 0:
            self.top_k = -1

    def _verify(self) -> None:
        def check(ok: bool, message: str) -> None:
            if not ok:
                raise ValueError(message)

        for name in ("temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty",
                     "repetition_penalty"):
            check(math.isfinite(getattr(self, name)),
                  f"{name} must be a finite number, got {getattr(self, name)}")
        check(0 <= self.temperature <= MAX_TEMPERATURE,
              f"temperature must be in [0, {MAX_TEMPERATURE}], got {self.temperature}")
        check(0 < self.top_p <= 1, f"top_p must be in (0, 1], got {self.top_p}")
        check(self.top_k >= -1, f"top_k must be 0 or -1 (all tokens) or >= 1, got {self.top_k}")
        check(0 <= self.min_p <= 1, f"min_p must be in [0, 1], got {self.min_p}")
        check(-2 <= self.presence_penalty <= 2,
              f"presence_penalty must be in [-2, 2], got {self.presence_penalty}")
        check(-2 <= self.frequency_penalty <= 2,
              f"frequency_penalty must be in [-2, 2], got {self.frequency_penalty}")
        check(self.repetition_penalty > 0,
              f"repetition_penalty must be > 0, got {self.repetition_penalty}")
        check(self.max_tokens >= 1, f"max_tokens must be >= 1, got {self.max_tokens}")
        check(0 <= self.min_tokens <= self.max_tokens,
              f"min_tokens must be in [0, max_tokens={self.max_tokens}], got {self.min_tokens}")
        check(self.seed is None or INT64_MIN <= self.seed <= INT64_MAX,
              f"seed must be in [{INT64_MIN}, {INT64_MAX}], got {self.seed}")
        check(all(isinstance(t, int) and t >= 0 for t in self.stop_token_ids),
              f"stop_token_ids must be non-negative integers, got {self.stop_token_ids}")
        assert isinstance(self.stop, list), "__post_init__ made stop a list"
        check(all(isinstance(s, str) and s for s in self.stop),
              "stop must be non-empty strings")
        # their upper bound is the engine's max_logprobs (InputProcessor.check_logprobs)
        check(self.logprobs is None or self.logprobs >= 0,
              f"logprobs must be >= 0, got {self.logprobs}")
        check(self.prompt_logprobs is None or self.prompt_logprobs >= 0,
              f"prompt_logprobs must be >= 0, got {self.prompt_logprobs}")
        check(self.allowed_token_ids is None or len(self.allowed_token_ids) > 0,
              "allowed_token_ids must hold at least one token id")
        for t, b in (self.logit_bias or {}).items():
            check(isinstance(t, int) and t >= 0 and math.isfinite(b),
                  f"logit_bias maps token ids to finite numbers, got {t!r}: {b!r}")

    def check_vocab(self, vocab_size: int) -> None:
        """Token ids the model cannot emit (ValueError)."""
        for name, ids in (("stop_token_ids", self.stop_token_ids),
                          ("logit_bias", list(self.logit_bias or {})),
                          ("allowed_token_ids", self.allowed_token_ids or [])):
            bad = [t for t in ids if not 0 <= t < vocab_size]
            if bad:
                raise ValueError(f"{name}: token ids must be in [0, {vocab_size}), got {bad[:5]}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1

    @property
    def needs_processing(self) -> bool:
        """Anything besides temperature/top-k/top-p: the sampler's slow path."""
        return bool(self.presence_penalty or self.frequency_penalty
                    or self.repetition_penalty != 1.0 or self.logit_bias or self.min_tokens
                    or self.min_p or self.allowed_token_ids or self.bad_words_token_ids)


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
