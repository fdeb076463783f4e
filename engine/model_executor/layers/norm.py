from __future__ import annotations

import torch
import torch.nn.functional as F
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


class LayerNorm(nn.Module):
    """LayerNorm with weight and bias (OPT), in torch."""

    def __init__(self, size: int, eps: float, dtype: torch.dtype, affine: bool = True):
        super().__init__()
        self.eps, self.size = eps, size
        self.weight = nn.Parameter(torch.ones(size, dtype=dtype), requires_grad=False) \
            if affine else None
        self.bias = nn.Parameter(torch.zeros(size, dtype=dtype), requires_grad=False) \
            if affine else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, (self.size,), self.weight, self.bias, self.eps)


class GemmaRMSNorm(nn.Module):
    """Gemma's RMSNorm: x / rms(x) * (1 + w), in float32 as transformers does."""

    def __init__(self, size: int, eps: float, dtype: torch.dtype):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.zeros(size, dtype=dtype), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (xf * (1.0 + self.weight.float())).to(x.dtype)
