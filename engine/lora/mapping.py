"""A step's tokens by adapter slot (its own module: the forward context
carries one, and the LoRA layers read the forward context)."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F


@dataclass
class LoRAMapping:
    """One step's tokens by adapter slot, set on the forward context by the
    model runner: `token_slot`, int32 [tokens], each token's slot (-1: the base
    model), what the few-token kernel (ops.lora_add) reads; `slot`, when every
    token is of that one slot."""

    slot: int | None
    token_slot: torch.Tensor
    _masks: dict[tuple[int, torch.dtype], torch.Tensor] = field(default_factory=dict, repr=False)

    def mask(self, max_loras: int, dtype: torch.dtype) -> torch.Tensor:
        """[tokens, max_loras] with a 1 at each token's slot (a base token's row
        is 0), for the GEMM path of a mixed step: made once a step, on first use."""
        key = (max_loras, dtype)
        if key not in self._masks:  # slot -1 falls in column 0, dropped
            hot = F.one_hot(self.token_slot.long() + 1, max_loras + 1)
            self._masks[key] = hot[:, 1:].to(dtype)
        return self._masks[key]
