"""A linear layer with the LoRA term of every adapter slot (upstream's
vllm/lora/layers): the base layer runs as ever (float, oneDNN, panels,
W8A8 or W4A16: the term is added to its output), then for each slot present in
the step one shrink over its tokens (x @ A^T for all the layer's slices at
once) and one expand per slice (h @ B^T), added in place. Tokens of the base
model skip it; a step of one adapter runs it over all rows without gathering."""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from engine.forward_context import get_context


@dataclass
class LoRAMapping:
    """One step's tokens by adapter slot: (slot, the rows of its tokens; None:
    every row of the step). Set on the forward context by the model runner."""

    groups: list[tuple[int, torch.Tensor | None]]


class LinearWithLoRA(nn.Module):
    """`base` (a Linear whose output is `slices` side by side, e.g. q, k, v)
    plus, per slot, A stacked as [max_loras, slices * max_rank, in] (slot s's
    rank r_s packs its slices' A rows densely, slice-major, in the first
    slices * r_s rows: one contiguous shrink) and B as [max_loras, out, max_rank]."""

    lora_a: torch.Tensor
    lora_b: torch.Tensor

    def __init__(self, base: nn.Module, fan_in: int, slices: tuple[int, ...], max_loras: int,
                 max_rank: int, dtype: torch.dtype):
        super().__init__()
        self.base, self.fan_in, self.slices = base, fan_in, slices
        self.offsets = [sum(slices[:j]) for j in range(len(slices))]
        self.register_buffer("lora_a", torch.zeros(max_loras, len(slices) * max_rank, fan_in,
                                                   dtype=dtype), persistent=False)
        self.register_buffer("lora_b", torch.zeros(max_loras, sum(slices), max_rank,
                                                   dtype=dtype), persistent=False)
        self.ranks = [0] * max_loras  # 0: the slot holds nothing for this layer

    def set_slot(self, slot: int, rank: int,
                 parts: dict[int, tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Slot `slot` holds an adapter of `rank`: parts[j] = (A, B) of slice j
        (slices it does not adapt are zero)."""
        self.lora_a[slot].zero_()
        self.lora_b[slot].zero_()
        self.ranks[slot] = rank if parts else 0
        for j, (a, b) in parts.items():
            self.lora_a[slot, j * rank:(j + 1) * rank].copy_(a)
            self.lora_b[slot, self.offsets[j]:self.offsets[j] + self.slices[j], :rank].copy_(b)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.base(x)
        mapping = get_context().lora_mapping
        if mapping is None:
            return out
        x2, o2 = x.reshape(-1, self.fan_in), out.view(-1, out.shape[-1])
        for slot, rows in mapping.groups:
            r = self.ranks[slot]
            if r == 0:
                continue
            xs = x2 if rows is None else x2.index_select(0, rows)
            h = xs @ self.lora_a[slot, :len(self.slices) * r].t()  # the shrink of every slice
            if rows is None:  # the step's every row: added in place, slice by slice
                for j, (off, n) in enumerate(zip(self.offsets, self.slices)):
                    o2[:, off:off + n].addmm_(h[:, j * r:(j + 1) * r],
                                              self.lora_b[slot, off:off + n, :r].t())
                continue
            delta = torch.cat([h[:, j * r:(j + 1) * r] @ self.lora_b[slot, off:off + n, :r].t()
                               for j, (off, n) in enumerate(zip(self.offsets, self.slices))],
                              dim=1)
            o2.index_add_(0, rows, delta.to(o2.dtype))
        return out
