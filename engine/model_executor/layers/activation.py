"""Activations: SiLU-and-mul through the compiled op; the rest in torch."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine import ops


class SiluAndMul(nn.Module):
    def forward(self, gate_up: torch.Tensor) -> torch.Tensor:
        out = torch.empty(*gate_up.shape[:-1], gate_up.shape[-1] // 2, dtype=gate_up.dtype,
                          device=gate_up.device)
        ops.silu_and_mul(out, gate_up)
        return out


class GeluTanhAndMul(nn.Module):
    """gelu_pytorch_tanh(gate) * up over [.., gate | up] (Gemma's MLP)."""

    def forward(self, gate_up: torch.Tensor) -> torch.Tensor:
        gate, up = gate_up.chunk(2, dim=-1)
        return F.gelu(gate, approximate="tanh") * up


# transformers' ACT2FN names of the activations plain MLPs (OPT) use
_ACTIVATIONS = {"relu": F.relu, "gelu": F.gelu,
                "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
                "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh")}


def activation(name: str):
    try:
        return _ACTIVATIONS[name]
    except KeyError:
        raise ValueError(f"activation {name!r} is not supported; supported: "
                         f"{', '.join(_ACTIVATIONS)}") from None
