from __future__ import annotations

import torch
from torch import nn

from engine import ops


class SiluAndMul(nn.Module):
    def forward(self, gate_up: torch.Tensor) -> torch.Tensor:
        out = torch.empty(*gate_up.shape[:-1], gate_up.shape[-1] // 2, dtype=gate_up.dtype,
                          device=gate_up.device)
        ops.silu_and_mul(out, gate_up)
        return out
