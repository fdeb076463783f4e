"""A linear layer whose weight is laid out once at load for the way this CPU
runs it (engine.platforms.cpu_features.choose_linear decides): the engine's 16-column
panels (csrc/cpu/linear_impl.h), oneDNN's prepacked layout, or torch's plain
[out, in] weight for F.linear."""
from __future__ import annotations

import logging
from functools import cache
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn

from engine import ops
from engine.platforms import cpu_features, cpu_hugepages

logger = logging.getLogger("engine")


_logged: set[str] = set()


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


@cache
def cpu_linear_choice(dtype: torch.dtype) -> cpu_features.LinearChoice:
    """How this CPU runs linear layers of `dtype` (decided once per dtype per process)."""
    from engine import envs

    return cpu_features.choose_linear(dtype_name(dtype), cpu_features.current(),
                                      cpu_features.TorchLinearSupport.detect(),
                                      panels=ops.has_panel_linear(),
                                      requested=envs.cpu_linear(),
                                      bf16_pairs=ops.has_bf16_pair_linear())


PANEL = ops.PANEL


def pack_panels(weight: torch.Tensor, k_pack: int = 1) -> torch.Tensor:
    """[N, K] -> [ceil(N/16), K, 16]: each panel's 16 columns k-major and
    contiguous, zero-padded past N (the layout csrc/cpu/linear_impl.h reads).
    k_pack=2 (bfloat16 for AVX512_BF16, engine.ops.panel_k_pack): k in pairs,
    [ceil(N/16), ceil(K/2), 16 * 2], each column's k and k+1 side by side,
    zero-padded past K."""
    n, k = weight.shape
    panels, steps = -(-n // PANEL), -(-k // k_pack)
    padded = weight
    if (panels * PANEL, steps * k_pack) != (n, k):  # a zero-padded copy; else none
        padded = weight.new_zeros(panels * PANEL, steps * k_pack)
        padded[:n, :k] = weight
    out = cpu_hugepages.empty((panels, steps, PANEL * k_pack), weight.dtype)  # streamed every step
    out.view(panels, steps, PANEL, k_pack).copy_(
        padded.view(panels, PANEL, steps, k_pack).permute(0, 2, 1, 3))
    return out


@cache
def cpu_large_m_choice(dtype: torch.dtype) -> cpu_features.LargeMChoice:
    """From how many rows panel layers of `dtype` switch to oneDNN / F.linear."""
    from engine import envs

    return cpu_features.choose_large_m(dtype_name(dtype), ops.cpu_isa(), cpu_linear_choice(dtype),
                                       cpu_features.TorchLinearSupport.detect(),
                                       cpu_features.current(), envs.cpu_linear_large_m())


def log_cpu_linear_choice(dtype: torch.dtype) -> cpu_features.LinearChoice:
    choice = cpu_linear_choice(dtype)
    if dtype_name(dtype) not in _logged:
        _logged.add(dtype_name(dtype))
        logger.info("linear layers (%s): %s: %s", dtype_name(dtype), choice.mode, choice.reason)
        if choice.mode == cpu_features.PANELS:
            large = cpu_large_m_choice(dtype)
            logger.info("linear layers (%s), large batches: %s", dtype_name(dtype), large.reason)
    return choice


class QuantMethod(Protocol):
    """What a quantized checkpoint's method (layers/quantization) does for a layer."""

    def process_weights(self, layer: Linear) -> None: ...

    def apply(self, layer: Linear, x: torch.Tensor) -> torch.Tensor: ...


class Linear(nn.Module):
    # set by prepare(), or by a quantized checkpoint's method (layers/quantization)
    in_features: int
    out_features: int
    # W8A8Int8's: the int8 weight's scales, and the weight packed for the kernel
    weight_scale: nn.Parameter
    input_scale: nn.Parameter | None
    int8_packed: torch.Tensor
    int8_scale: torch.Tensor
    int8_comp: torch.Tensor
    # WNA16's: the packed weight (packed, scales, zeros), its group size and input order
    wna16: tuple[torch.Tensor, torch.Tensor, torch.Tensor]
    wna16_group: int
    wna16_perm: torch.Tensor | None
    # GGUF's (quantization/gguf.py): the mins of types that have them, their groups
    gguf_mins: torch.Tensor | None
    gguf_groups: int
    gguf_int8: list  # the int8 kernel's weight, a run of parts each (quantization/gguf_int8)
    gguf_int8_rows: int  # up to which rows it runs

    def __init__(self, in_features: int, out_features: int, bias: bool, dtype: torch.dtype,
                 shard_sizes: tuple[int, ...] | None = None):
        """shard_sizes: the rows of each fused part (q/k/v, gate/up), read by the loader."""
        super().__init__()
        # None once laid out (prepare) or quantized
        self.weight: nn.Parameter | None = nn.Parameter(
            torch.empty(out_features, in_features, dtype=dtype), requires_grad=False)
        self.bias = nn.Parameter(torch.empty(out_features, dtype=dtype),
                                 requires_grad=False) if bias else None
        for p in (self.weight, self.bias):
            if p is not None and shard_sizes is not None:
                setattr(p, "shard_sizes", shard_sizes)  # an attribute of ours on the Parameter
        self.packed: torch.Tensor | None = None   # oneDNN's layout
        self.panels: torch.Tensor | None = None   # the engine's (pack_panels)
        # a quantized checkpoint's (layers/quantization)
        self.quant_method: QuantMethod | None = None
        # With panels: from this many rows, `packed` (or the plain weight) runs instead.
        self.large_rows: int | None = None

    def prepare(self, mode: str, batch_hint: int = 16) -> None:
        """Lay the weight out for `mode` (a cpu_features mode); the plain copy is
        freed unless another module shares it, as tied embeddings do."""
        if self.quant_method is not None:
            self.quant_method.process_weights(self)
            return
        if mode == cpu_features.PLAIN:
            return
        weight = self.weight
        assert weight is not None, "a float layer's weight is laid out once"
        if mode == cpu_features.PANELS:
            self.panels = pack_panels(weight.data, ops.panel_k_pack(weight.dtype))
            large = cpu_large_m_choice(weight.dtype)
            self.large_rows = large.rows
            if large.rows is not None and large.mode == cpu_features.PREPACKED:
                self.packed = torch.ops.mkldnn._reorder_linear_weight(weight.data, large.rows)
            elif large.rows is not None:  # F.linear on the plain weight, kept
                self.out_features = weight.shape[0]
                return
        elif mode == cpu_features.PREPACKED:
            self.packed = torch.ops.mkldnn._reorder_linear_weight(weight.data, batch_hint)
        else:
            raise ValueError(f"unknown linear mode {mode!r}")
        self.out_features = weight.shape[0]
        del self.weight
        self.weight = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.quant_method is not None:
            return self.quant_method.apply(self, x)
        rows = x.numel() // x.shape[-1]
        if self.panels is not None and (self.large_rows is None or rows < self.large_rows):
            x2 = x.reshape(-1, x.shape[-1])
            if x2.stride(-1) != 1:
                x2 = x2.contiguous()
            out = x2.new_empty(x2.shape[0], self.out_features)
            ops.linear(out, x2, self.panels, self.bias)
            return out.view(*x.shape[:-1], self.out_features)
        if self.packed is not None:
            return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")
        assert self.weight is not None, "a laid-out layer ran its panels or packed weight above"
        return F.linear(x, self.weight, self.bias)
