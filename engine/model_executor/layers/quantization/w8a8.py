"""INT8 W8A8 linear layers: int8 weights with a float32 scale per output
channel, activations quantised to int8 per token at run time (or with a
static per-tensor scale), int32 accumulation (engine.ops.int8_linear)."""
from __future__ import annotations

import torch
from torch import nn

from engine import ops
from engine.model_executor.layers.linear import Linear, pack_panels
from engine.platforms import cpu_hugepages

PANEL = ops.PANEL
#: k values per 32-bit lane of the packed weight (one vpdpbusd step)
K_PACK = 4
#: rows of the weight widened to int32 at a time for the offset correction
COMP_ROWS = 256


def _param(t: torch.Tensor) -> nn.Parameter:
    return nn.Parameter(t, requires_grad=False)


def pack_int8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """int8 [N, K] -> ([ceil(N/16), ceil(K/4), 64]: linear.pack_panels' layout with 4
    k a step, one vpdpbusd lane; the VNNI offset correction 128 * sum_k W[n, k],
    int32 [ceil(N/16) * 16], zero past N) as csrc/cpu/int8_linear_impl.h reads them."""
    n = weight.shape[0]
    comp = torch.zeros(-(-n // PANEL) * PANEL, dtype=torch.int32)
    for r in range(0, n, COMP_ROWS):  # sum(dtype=int32) widens its input: a block at a time
        rows = weight[r:r + COMP_ROWS]
        comp[r:r + rows.shape[0]] = rows.sum(1, dtype=torch.int32) * 128
    return pack_panels(weight, K_PACK), comp


class W8A8Int8:
    """The layer's parameters as the checkpoint holds them (weight int8 [N, K],
    weight_scale [N, 1], input_scale [1] when static), packed once loaded."""

    def __init__(self, static_input: bool):
        self.static_input = static_input

    def __eq__(self, other) -> bool:
        return isinstance(other, W8A8Int8) and other.static_input == self.static_input

    def __hash__(self) -> int:
        return hash(self.static_input)

    def create_weights(self, layer: Linear) -> None:
        assert layer.weight is not None, "the float layer, before its weights are read"
        n, k = layer.weight.shape
        sizes = getattr(layer.weight, "shard_sizes", None)  # fused parts, for the loader
        # read once, packed, then freed: in a mapping of its own, given back when freed
        layer.weight = _param(cpu_hugepages.transient((n, k), torch.int8))
        layer.weight_scale = _param(torch.empty(n, 1, dtype=torch.float32))
        if sizes is not None:
            setattr(layer.weight, "shard_sizes", sizes)
            setattr(layer.weight_scale, "shard_sizes", sizes)
        layer.input_scale = _param(torch.empty(1, dtype=torch.float32)) if self.static_input \
            else None
        layer.quant_method = self

    def process_weights(self, layer: Linear) -> None:
        """Pack the loaded weight for the kernel; the [N, K] copy is freed."""
        if layer.weight is None:
            return
        layer.out_features = layer.weight.shape[0]
        layer.int8_packed, layer.int8_comp = pack_int8(layer.weight.data)
        layer.int8_scale = layer.weight_scale.data.reshape(-1).float().contiguous()
        del layer.weight
        layer.weight = None

    def apply(self, layer: Linear, x: torch.Tensor) -> torch.Tensor:
        self.process_weights(layer)
        x2 = x.reshape(-1, x.shape[-1])
        if x2.stride(-1) != 1:
            x2 = x2.contiguous()
        out = x2.new_empty(x2.shape[0], layer.out_features)
        scale = None if layer.input_scale is None else layer.input_scale.data
        ops.int8_linear(out, x2, layer.int8_packed, layer.int8_scale, layer.int8_comp, scale)
        if layer.bias is not None:
            out += layer.bias
        return out.view(*x.shape[:-1], layer.out_features)
