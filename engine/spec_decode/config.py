"""--speculative-config (upstream's SpeculativeConfig): the JSON object the
flag and LLM(speculative_config=...) take, checked once; a bad one is a
ValueError of one line naming the key."""
from __future__ import annotations

import json
from dataclasses import dataclass

METHODS = ("ngram", "draft_model")
# upstream's defaults when neither prompt_lookup bound is given
DEFAULT_PROMPT_LOOKUP = 5
_KEYS = ("method", "num_speculative_tokens", "prompt_lookup_max", "prompt_lookup_min", "model")
_NGRAM_KEYS = ("prompt_lookup_max", "prompt_lookup_min")


@dataclass(frozen=True)
class SpeculativeConfig:
    method: str
    num_speculative_tokens: int  # drafts verified per step, at most
    prompt_lookup_max: int  # the longest n-gram of the context's end looked up
    prompt_lookup_min: int  # the shortest one
    model: str | None = None  # draft_model: the draft's checkpoint (its vocabulary the target's)

    @classmethod
    def parse(cls, value: str | dict | SpeculativeConfig | None) -> SpeculativeConfig | None:
        """From the flag's JSON text or a dict; None stays None (no speculation)."""
        if value is None or isinstance(value, SpeculativeConfig):
            return value
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except ValueError as e:
                raise ValueError(f"speculative_config is not valid JSON ({e}); give an object "
                                 'such as {"method": "ngram", "num_speculative_tokens": 4}'
                                 ) from None
        if not isinstance(value, dict):
            raise ValueError("speculative_config must be a JSON object, e.g. "
                             '{"method": "ngram", "num_speculative_tokens": 4}')
        unknown = [k for k in value if k not in _KEYS]
        if unknown:
            raise ValueError(f"speculative_config has an unknown key {unknown[0]!r}; the keys "
                             f"are {', '.join(_KEYS)}")
        method = value.get("method", "draft_model" if "model" in value else None)
        if method == "draft_model":
            return cls._draft_model(value)
        if "model" in value:
            raise ValueError(f"speculative_config 'model' is a draft model's; give "
                             f"\"method\": \"draft_model\" with it (or no method), not {method!r}")
        if method not in METHODS:
            raise ValueError(f"speculative_config 'method' {method!r} is not supported; use "
                             f"{' or '.join(METHODS)}")
        lookup_max, lookup_min = value.get("prompt_lookup_max"), value.get("prompt_lookup_min")
        if lookup_max is None and lookup_min is None:
            lookup_max = lookup_min = DEFAULT_PROMPT_LOOKUP
        given = {"num_speculative_tokens": value.get("num_speculative_tokens"),
                 "prompt_lookup_max": lookup_min if lookup_max is None else lookup_max,
                 "prompt_lookup_min": lookup_max if lookup_min is None else lookup_min}
        ints: dict[str, int] = {}
        for name, v in given.items():
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"speculative_config {name!r} must be a whole number >= 1, "
                                 f"got {v!r}")
            ints[name] = v
        if ints["prompt_lookup_min"] > ints["prompt_lookup_max"]:
            raise ValueError(f"speculative_config 'prompt_lookup_min' "
                             f"({ints['prompt_lookup_min']}) must be <= 'prompt_lookup_max' "
                             f"({ints['prompt_lookup_max']})")
        return cls(method, ints["num_speculative_tokens"], ints["prompt_lookup_max"],
                   ints["prompt_lookup_min"])

    @classmethod
    def _draft_model(cls, value: dict) -> SpeculativeConfig:
        model, k = value.get("model"), value.get("num_speculative_tokens")
        if not isinstance(model, str) or not model:
            raise ValueError("speculative_config: the draft_model method needs 'model', the "
                             "draft's folder or Hugging Face id")
        given = [key for key in _NGRAM_KEYS if key in value]
        if given:
            raise ValueError(f"speculative_config {given[0]!r} is the ngram method's; leave it "
                             "out with a draft model")
        if not isinstance(k, int) or isinstance(k, bool) or k < 1:
            raise ValueError(f"speculative_config 'num_speculative_tokens' must be a whole "
                             f"number >= 1, got {k!r}")
        return cls("draft_model", k, 0, 0, model)
