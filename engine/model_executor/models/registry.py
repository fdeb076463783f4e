"""Which model class serves a checkpoint, by its config.json `model_type`.

Names only (no imports): the config reader asks what is supported without
loading torch or any model code; `model_class()` imports the one it needs."""
from __future__ import annotations

import importlib

# model_type -> (module under engine.model_executor.models, class)
_MODELS = {
    "llama": ("llama", "LlamaForCausalLM"),
    "mistral": ("llama", "LlamaForCausalLM"),
    "qwen2": ("llama", "LlamaForCausalLM"),
    "qwen3": ("llama", "LlamaForCausalLM"),
}

SUPPORTED_MODEL_TYPES = tuple(_MODELS)


def model_class(model_type: str):
    try:
        module, name = _MODELS[model_type]
    except KeyError:
        raise ValueError(f"model_type {model_type!r} is not supported; supported: "
                         f"{', '.join(SUPPORTED_MODEL_TYPES)}") from None
    return getattr(importlib.import_module(f"engine.model_executor.models.{module}"), name)
