"""What every model shares about its weights: empty parameters to load into,
and the checkpoint_map the loader reads (engine.model_executor.model_loader)."""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from engine.model_executor.layers.fused_moe import FusedMoE
from engine.model_executor.layers.linear import Linear

if TYPE_CHECKING:
    from engine.config import ModelConfig


def param(*shape, dtype) -> nn.Parameter:
    return nn.Parameter(torch.empty(*shape, dtype=dtype), requires_grad=False)


def checkpoint_map(top: dict[str, str], layer_prefix: str, num_layers: int,
                   layer: dict[str, tuple[str, int | None]], first: int = 0) -> dict:
    """checkpoint tensor -> (our parameter, part): `top` names whole parameters;
    `layer` maps each layer's checkpoint suffixes under `layer_prefix`{first + i}.
    to ours under layers.{i} (a pipeline stage holds layers from `first` on)."""
    out: dict[str, tuple[str, int | None]] = {key: (name, None) for key, name in top.items()}
    for i in range(num_layers):
        for suffix, (name, part) in layer.items():
            out[f"{layer_prefix}{first + i}.{suffix}"] = (f"layers.{i}.{name}", part)
    return out


class CausalLM(nn.Module):
    """The runner's side of a model: linear layouts and attention layers."""

    config: ModelConfig
    layers: nn.ModuleList  # this pipeline stage's decoder layers

    def checkpoint_map(self) -> dict:
        """checkpoint tensor -> (our parameter, part), which the loader reads
        by (engine.model_executor.model_loader); every model has its own."""
        raise NotImplementedError

    def prepare_linear(self, mode: str) -> None:
        """Every linear layer and expert laid out for `mode` (engine.platforms.cpu_features)."""
        for m in self.modules():
            if isinstance(m, (Linear, FusedMoE)):
                m.prepare(mode)

    def attention_layers(self) -> list:
        return [layer.attn for layer in self.layers]
