"""Weight-only quantized linear layers (W4A16, W8A16): 4- or 8-bit weights
with a float scale and an integer zero point per group of input channels,
float (or bfloat16) activations. Every checkpoint format (wna16_formats)
comes to one form, q [N, K] unsigned, zeros and scales [N, groups], and an
optional input permutation (GPTQ's act-order), packed once for the kernels
(engine.ops.wna16_linear, csrc/cpu/wna16.h). Few rows run the kernel, which
reads the packed weight once a step; from LARGE_M rows (prefill) the weight
is dequantised once a call into the layout of the engine's panel GEMM
(engine.ops.linear), which multiplies it, or where there is none to a [K, N]
matrix for torch's. (torch.mm on a plain [K, N] bfloat16 matrix reorders it
for oneDNN every call: the large Llama's W4A16 prefill ran at 0.89x its
bfloat16 one on a 2-core Zen 4; the panels' own layout costs no reorder.)
CPUs with AMX run bfloat16 tiles instead up to AMX_MAX_M rows."""
from __future__ import annotations

import math
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from engine import ops
from engine.platforms import cpu_hugepages

if TYPE_CHECKING:
    from engine.model_executor.layers.linear import Linear

PANEL = ops.PANEL
#: rows from which a layer dequantises its weight and runs torch's GEMM: the
#: kernel converts each weight once per 16 rows (AVX-512, 4 on AVX2), the
#: GEMM once per call
LARGE_M = 64
#: Rows from which the [K, N] panel and torch's GEMM run even where AMX tiles could
#: (measured on a 2-core Xeon, 4-bit, K x N 2048 x 6144 / 5456 x 2048: tiles 6.2 / 5.5 ms
#: vs the panel 10.0 / 7.7 ms at 480 rows, 25.8 / 20.2 vs 29.2 / 25.5 ms at 1920; the
#: tiles read x once per 64 columns, so their lead shrinks as M grows)
AMX_MAX_M = 4096
_panel = threading.local()  # the dequantised weight's buffer, this thread's


def dequant_buffer(*shape: int, dtype: torch.dtype) -> torch.Tensor:
    """A view of `shape` of the buffer large-M calls dequantise into: one a
    thread, grown to the largest layer and reused by every layer and call. (A
    fresh one a call is fresh pages a call: the large Llama's gate/up layer at
    1000 rows took 148 ms instead of 128.)"""
    size = math.prod(shape)
    buf = getattr(_panel, "buf", None)
    if buf is None or buf.dtype != dtype or buf.numel() < size:
        _panel.buf = None  # the old one freed first
        buf = _panel.buf = cpu_hugepages.empty((size,), dtype)
    return buf[:size].view(*shape)


def pack_wna16(q: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, bits: int,
               group_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q [N, K] unsigned values (< 2**bits), scales float [N, groups], zeros
    [N, groups] (groups = ceil(K / group_size)) -> the kernel's (packed int32
    [ceil(N/16), steps, 16], scales float32 and zeros uint8 [ceil(N/16), groups,
    16]): lane c of step s holds column c's k = s * (32 / bits) + j at bits
    j * bits; columns past N and k past K are zero."""
    n, k = q.shape
    pf = 32 // bits
    groups = -(-k // group_size)
    if scales.shape != (n, groups) or zeros.shape != (n, groups):
        raise ValueError(f"scales and zeros must be [{n}, {groups}], got "
                         f"{tuple(scales.shape)} and {tuple(zeros.shape)}")
    panels, kp = -(-n // PANEL), groups * group_size
    qp = q
    if q.dtype != torch.uint8 or q.shape != (panels * PANEL, kp) or not q.is_contiguous():
        qp = torch.zeros(panels * PANEL, kp, dtype=torch.uint8)  # one byte a value, padded
        qp[:n, :k] = q
    values = qp.view(panels, PANEL, kp // pf, pf)
    packed = cpu_hugepages.empty((panels, kp // pf, PANEL), torch.int32)  # streamed every step
    lanes = packed.permute(0, 2, 1)  # [panels, PANEL, steps]
    lanes.copy_(values[..., 0])
    for j in range(1, pf):  # int32 shifts wrap into the sign bit: the lane's bits as they are
        lanes.bitwise_or_(values[..., j].to(torch.int32).bitwise_left_shift_(j * bits))

    def per_panel(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        out = torch.zeros(panels * PANEL, groups, dtype=dtype)
        out[:n] = t
        return out.view(panels, PANEL, groups).permute(0, 2, 1).contiguous()

    return packed, per_panel(scales.float(), torch.float32), per_panel(zeros, torch.uint8)


@dataclass(frozen=True)
class WNA16:
    """A layer's scheme: bits (4 or 8), group_size (None: one group of all K,
    per channel) and whether the zero point is stored (else 2**(bits-1)). The
    weights are read and packed by wna16_formats.load, not by the engine's
    loader."""
    bits: int
    group_size: int | None
    symmetric: bool = True

    def create_weights(self, layer: Linear) -> None:
        assert layer.weight is not None, "the float layer, before its weights are read"
        layer.in_features, layer.out_features = layer.weight.shape[1], layer.weight.shape[0]
        del layer.weight  # the float placeholder: the loader reads no .weight for this layer
        layer.weight = None
        layer.quant_method = self

    def set_weights(self, layer: Linear, q: torch.Tensor, scales: torch.Tensor,
                    zeros: torch.Tensor, perm: torch.Tensor | None, group_size: int) -> None:
        """The layer's weight in the one form, packed; perm: the order in which
        the kernel reads the input's columns (act-order), None for as they are."""
        layer.wna16 = pack_wna16(q, scales, zeros, self.bits, group_size)
        layer.wna16_group = group_size
        layer.wna16_perm = perm

    def process_weights(self, layer: Linear) -> None:
        """Nothing left to lay out: set_weights packed the weight."""

    @staticmethod
    def _amx_runs(layer: Linear, x2: torch.Tensor) -> bool:
        """AMX tiles (wna16_linear from 16 rows; bfloat16, groups of 32s) beat the
        dequantised weight and a GEMM up to AMX_MAX_M rows."""
        return (x2.shape[0] < AMX_MAX_M and x2.dtype == torch.bfloat16
                and layer.wna16_group % 32 == 0 and ops.amx_in_use())

    def apply(self, layer: Linear, x: torch.Tensor) -> torch.Tensor:
        x2 = x.reshape(-1, x.shape[-1])
        if layer.wna16_perm is not None:
            x2 = x2.index_select(1, layer.wna16_perm)
        elif x2.stride(-1) != 1:
            x2 = x2.contiguous()
        packed, scales, zeros = layer.wna16
        k, n = layer.in_features, layer.out_features
        if x2.shape[0] >= LARGE_M and not self._amx_runs(layer, x2):
            if ops.has_panel_linear():  # the engine's panel GEMM
                kp = ops.panel_k_pack(x2.dtype)
                wp = dequant_buffer(-(-n // PANEL), -(-k // kp), PANEL * kp, dtype=x2.dtype)
                ops.wna16_dequant_panels(wp, packed, scales, zeros, self.bits,
                                         layer.wna16_group, n, k)
                out = x2.new_empty(x2.shape[0], n)
                ops.linear(out, x2, wp, None)
            else:
                wt = dequant_buffer(k, n, dtype=x2.dtype)
                ops.wna16_dequant(wt, packed, scales, zeros, self.bits, layer.wna16_group)
                out = torch.mm(x2, wt)
        else:
            out = x2.new_empty(x2.shape[0], n)
            ops.wna16_linear(out, x2, packed, scales, zeros, self.bits, layer.wna16_group)
        if layer.bias is not None:
            out += layer.bias
        return out.view(*x.shape[:-1], n)
