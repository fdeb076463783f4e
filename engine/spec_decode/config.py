"""--speculative-config (upstream's SpeculativeConfig): the JSON object the
flag and LLM(speculative_config=...) take, checked once; a bad one is a
ValueError of one line naming the key."""
from __future__ import annotations

import json
from dataclasses import dataclass

METHODS = ("ngram",)
# upstream's defaults when neither prompt_lookup bound is given
DEFAULT_PROMPT_LOOKUP = 5
_KEYS = ("method", "num_speculative_tokens", "prompt_lookup_max", "prompt_lookup_min")


@dataclass(frozen=True)
class SpeculativeConfig:
    method: str
    num_speculative_tokens: int  # drafts verified per step, at most
    prompt_lookup_max: int  # the longest n-gram of the context's end looked up
    prompt_lookup_min: int  # the shortest one

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
        if "model" in value:
            raise ValueError("speculative_config 'model': a draft model is not supported yet; "
                             'use "method": "ngram"')
        unknown = [k for k in value if k not in _KEYS]
        if unknown:
            raise ValueError(f"speculative_config has an unknown key {unknown[0]!r}; the keys "
                             f"are {', '.join(_KEYS)}")
        method = value.get("method")
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
        return cls(method, **ints)
