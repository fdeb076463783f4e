"""Which model class serves a checkpoint, by its config.json `architectures`
(else its `model_type`).

Names only (no imports): the config reader asks what is supported without
loading torch or any model code; `model_class()` imports the one it needs."""
from __future__ import annotations

import importlib

# architecture -> (model_type, module under engine.model_executor.models, class)
_ARCHITECTURES = {
    "LlamaForCausalLM": ("llama", "llama", "LlamaForCausalLM"),
    "MistralForCausalLM": ("mistral", "llama", "LlamaForCausalLM"),
    "Qwen2ForCausalLM": ("qwen2", "llama", "LlamaForCausalLM"),
    "Qwen3ForCausalLM": ("qwen3", "llama", "LlamaForCausalLM"),
    "GraniteForCausalLM": ("granite", "llama", "LlamaForCausalLM"),
    "Phi3ForCausalLM": ("phi3", "llama", "LlamaForCausalLM"),
    "OPTForCausalLM": ("opt", "opt", "OPTForCausalLM"),
    "Olmo2ForCausalLM": ("olmo2", "olmo2", "Olmo2ForCausalLM"),
    "Gemma2ForCausalLM": ("gemma2", "gemma", "GemmaForCausalLM"),
    "Gemma3ForCausalLM": ("gemma3_text", "gemma", "GemmaForCausalLM"),
    "MixtralForCausalLM": ("mixtral", "moe", "MoeForCausalLM"),
    "Qwen2MoeForCausalLM": ("qwen2_moe", "moe", "MoeForCausalLM"),
    "Qwen3MoeForCausalLM": ("qwen3_moe", "moe", "MoeForCausalLM"),
    # encoders: pooling models only (engine.pooler_config), the base model first
    # of each model_type (the one a config without `architectures` gets)
    "BertModel": ("bert", "bert", "BertModel"),
    "BertForSequenceClassification": ("bert", "bert", "BertForSequenceClassification"),
    "RobertaModel": ("roberta", "roberta", "RobertaModel"),
    "RobertaForSequenceClassification": ("roberta", "roberta",
                                         "RobertaForSequenceClassification"),
    "XLMRobertaModel": ("xlm-roberta", "roberta", "RobertaModel"),
    "XLMRobertaForSequenceClassification": ("xlm-roberta", "roberta",
                                            "RobertaForSequenceClassification"),
}
_BY_MODEL_TYPE: dict[str, str] = {}
for _arch, (_mt, _, _) in _ARCHITECTURES.items():
    _BY_MODEL_TYPE.setdefault(_mt, _arch)

#: architectures that only pool (no LM head), and the head each has: "embed"
#: (hidden states pooled) or "classify" (a sequence-classification head)
POOLING_ARCHITECTURES = {
    "BertModel": "embed", "RobertaModel": "embed", "XLMRobertaModel": "embed",
    "BertForSequenceClassification": "classify",
    "RobertaForSequenceClassification": "classify",
    "XLMRobertaForSequenceClassification": "classify",
}

SUPPORTED_ARCHITECTURES = tuple(_ARCHITECTURES)
SUPPORTED_MODEL_TYPES = tuple(_BY_MODEL_TYPE)


def resolve_architecture(cfg: dict) -> tuple[str, str]:
    """(model_type, architecture) of a config.json, or one line naming the supported ones."""
    for arch in cfg.get("architectures") or []:
        if arch in _ARCHITECTURES:
            return _ARCHITECTURES[arch][0], arch
    mt = cfg.get("model_type")
    if mt in _BY_MODEL_TYPE:
        return mt, _BY_MODEL_TYPE[mt]
    given = ", ".join(cfg.get("architectures") or []) or "none"
    raise ValueError(f"architecture {given} (model_type {mt!r}) is not supported; supported "
                     f"architectures: {', '.join(SUPPORTED_ARCHITECTURES)}")


def model_class(architecture: str):
    try:
        _, module, name = _ARCHITECTURES[architecture]
    except KeyError:
        raise ValueError(f"architecture {architecture!r} is not supported; supported: "
                         f"{', '.join(SUPPORTED_ARCHITECTURES)}") from None
    return getattr(importlib.import_module(f"engine.model_executor.models.{module}"), name)
