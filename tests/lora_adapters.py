"""PEFT adapters of a tiny checkpoint for the LoRA tests and benchmark: random
A and B (PEFT starts B at zero, which would test nothing), saved in PEFT's
format, and the same adapter merged into the base (merge_and_unload) as a
checkpoint the engine loads: the reference each LoRA output must equal."""
from __future__ import annotations

import shutil
from pathlib import Path

ALL_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def make_adapter(base: Path, out: Path, *, rank: int = 8, alpha: int = 16, seed: int = 1,
                 targets=ALL_TARGETS, rslora: bool = False, std: float = 0.1,
                 merged: Path | None = None) -> Path:
    """An adapter of `base` in `out`; with `merged`, the merged model there too."""
    import peft
    import torch
    import transformers

    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    cfg = peft.LoraConfig(r=rank, lora_alpha=alpha, target_modules=list(targets),
                          use_rslora=rslora, init_lora_weights=False, lora_dropout=0.0)
    model = peft.get_peft_model(model, cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.normal_(0, std)
    model.save_pretrained(out, safe_serialization=True)
    if merged is not None:
        model.merge_and_unload().save_pretrained(merged, safe_serialization=True)
        for f in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
            if (base / f).exists():
                shutil.copy(base / f, merged / f)
    return out
