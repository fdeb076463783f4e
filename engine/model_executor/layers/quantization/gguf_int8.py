"""GGUF's few-row layers as llama.cpp runs them: x quantized to int8 per row
and group, the weight's unsigned q multiplied in integer dot products
(engine.ops.gguf_int8_linear, csrc/cpu/gguf_int8.h). The weight streams as
many bits a value as the file's blocks hold: 4- and 8-bit q as wna16 packs
them (the layer's own copy, shared), 5- and 6-bit q as their 4-bit nibbles
plus a plane of the bits above (Q5_0's qh, Q6_K's high pairs). Beside it per
group and column float16 factors (the files' own precision for the scales;
at decode the bytes are the cost): the scale alone where the zero point is
one for the layer and there is no min (x . W = scale * (x . q - zero * sum(x))),
else the scale and the term min - scale * zero (+ term * sum(x))."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from engine import envs, ops
from engine.model_executor.layers.quantization.wna16 import pack_wna16
from engine.platforms import cpu_hugepages

PANEL = ops.PANEL
#: Rows up to which the int8 kernel runs by default, wna16's float kernel (or
#: the large-M GEMM, or AMX tiles) from there. At 16 rows (16 concurrent
#: requests) it beat wna16's AMX tiles on a 2-core Sapphire Rapids once the
#: weight streamed at the file's bits: SmolLM-135M shape, 16 x 64 tokens,
#: Q4_K file (mostly Q5_0) 697-715 tok/s vs 447, Q8_0 640-652 vs 419-434.
INT8_MAX_M = 16


@dataclass(frozen=True)
class Int8Weight:
    """Output columns [n0, n0 + n) of a layer as gguf_int8_linear reads them:
    one run of parts of one block type (a fused layer's parts may differ)."""
    n0: int
    n: int
    packed: torch.Tensor
    high: torch.Tensor | None
    terms: torch.Tensor
    bits: int
    group: int
    zero: int


def max_rows() -> int:
    """Rows up to which a GGUF layer runs the int8 kernel (0: none)."""
    if not ops.has_gguf_int8_linear():
        return 0
    rows = envs.gguf_int8_max_m()
    return INT8_MAX_M if rows is None else rows


def pack(q: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, mins: torch.Tensor | None,
         bits: int, group: int, n0: int = 0,
         packed: torch.Tensor | None = None) -> Int8Weight | None:
    """q [N, K] values below 2**bits (4, 5, 6 or 8), scales/zeros/mins [N, K / group]
    -> the kernel's weight, or None where a factor is not finite in float16.
    packed: the wna16 packing of q where the layer has it (4 and 8 bits)."""
    terms, zero = pack_group_terms(scales, zeros, mins)
    if terms is None:
        return None
    high = None
    if bits in (5, 6):
        packed = pack_wna16(q & 0x0F, scales, zeros, 4, group)[0]
        high = pack_high_bits(q, bits, group)
    elif packed is None:
        packed = pack_wna16(q, scales, zeros, bits, group)[0]
    return Int8Weight(n0, q.shape[0], packed, high, terms, bits, group, zero)


def pack_high_bits(q: torch.Tensor, bits: int, group: int) -> torch.Tensor:
    """The bits of q [N, K] above its low 4 (h = bits - 4 each) as gguf_int8.h's
    plane: [ceil(N/16), chunks, 16] int32, a lane a column and chunk of 32 / h k;
    in byte j, at bit 2h * t, k = 8t + 2j's bits, at bit 2h * t + h k = 8t + 2j + 1's."""
    h = bits - 4
    n, k = q.shape
    chunk, kp = 32 // h, -(-k // group) * group
    panels = -(-n // PANEL)
    hi = torch.zeros(panels * PANEL, kp, dtype=torch.int64)
    hi[:n, :k] = q.to(torch.int64) >> 4
    kk = torch.arange(chunk)
    pos = 8 * ((kk % 8) // 2) + 2 * h * (kk // 8) + h * (kk % 2)
    # the bits do not overlap: a sum is an OR
    words = (hi.view(panels * PANEL, kp // chunk, chunk) << pos).sum(-1)
    words = torch.where(words >= 1 << 31, words - (1 << 32), words).to(torch.int32)
    out = cpu_hugepages.empty((panels, kp // chunk, PANEL), torch.int32)  # streamed every step
    out.copy_(words.view(panels, PANEL, kp // chunk).permute(0, 2, 1))
    return out


def pack_group_terms(scales: torch.Tensor, zeros: torch.Tensor,
                     mins: torch.Tensor | None) -> tuple[torch.Tensor | None, int]:
    """scales, zeros, mins [N, groups] -> (terms [ceil(N/16), groups, T, 16]
    float16, zero): T = 1, the scales, where there is no min and every zero point
    is `zero`; else T = 2, the scale then min - scale * zero (zero 0). Zero past
    N; terms None where one is not finite in float16 (the layer then runs wna16)."""
    n, groups = scales.shape
    one_zero = mins is None and bool((zeros == zeros.flatten()[0]).all())
    if one_zero:
        both, zero = scales.float()[None], int(zeros.flatten()[0])
    else:
        term = -scales.float() * zeros.float()
        if mins is not None:
            term += mins.float()
        both, zero = torch.stack([scales.float(), term]), 0  # [T, N, groups]
    t, panels = both.shape[0], -(-n // PANEL)
    padded = torch.zeros(t, panels * PANEL, groups)
    padded[:, :n] = both
    out = padded.view(t, panels, PANEL, groups).permute(1, 3, 0, 2).to(torch.float16).contiguous()
    return (out if bool(torch.isfinite(out).all()) else None), zero
