from __future__ import annotations

import torch
from torch import nn

from engine import ops


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float, dtype: torch.dtype):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(size, dtype=dtype), requires_grad=False)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        """Without residual: rms_norm(x). With it: residual += x, then
        x = rms_norm(residual), both in place (fused_add_rms_norm)."""
        if residual is None:
            out = torch.empty_like(x)
            ops.rms_norm(out, x, self.weight, self.eps)
            return out
        ops.fused_add_rms_norm(x, residual, self.weight, self.eps)
        return x, residual
