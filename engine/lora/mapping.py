"""A step's tokens by adapter slot (its own module: the forward context
carries one, and the LoRA layers read the forward context)."""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class LoRAMapping:
    """One step's tokens by adapter slot, set on the forward context by the
    model runner: `slot`, when every token is of that one slot; else `mask`,
    [tokens, max_loras] with a 1 at each token's slot (a base token's row is 0).
    `token_slot`, int32 [tokens]: each token's slot (-1: the base model), what
    the few-token kernel (ops.lora_add) reads."""

    slot: int | None
    mask: torch.Tensor | None = None
    token_slot: torch.Tensor | None = None
