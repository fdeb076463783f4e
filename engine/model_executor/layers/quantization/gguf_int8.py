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
#: Rows up to which the int8 kernel runs by default where bfloat16 layers run
#: AMX tiles (wna16's, from 16 rows; oneDNN's for a large batch): at 16 rows
#: (16 concurrent requests) the int8 kernel beat wna16's AMX tiles on a 2-core
#: Sapphire Rapids once the weight streamed at the file's bits: SmolLM-135M
#: shape, 16 x 64 tokens, Q4_K file (mostly Q5_0) 697-715 tok/s vs 447, Q8_0
#: 640-652 vs 419-434. Past 16 rows there the tiles were not measured against it.
INT8_MAX_M_AMX = 16
#: Elsewhere every batch, prefill too (as llama.cpp quantizes x for every batch):
#: measured on a 2-core AMD Zen 4, SmolLM-135M shape, the same process switching
#: paths, float path (dequantized panels + GEMM) / int8 ms, bfloat16: Q4_0 500-token
#: prompt 392/309, 2000 2054/1739, 16 x 32-token prompts 361/285; Q4_K 371/271,
#: 2014/1759, 327/298; Q8_0 337/256, 1922/1711, 310/242; float32 Q4_0 579/265,
#: 2952/1714, 567/228; capped to AVX-512 (no VNNI) Q4_0 bfloat16 636/378,
#: 3104/2129, 618/352; to AVX2 627/520, 3357/3037, 592/480 (Q4_K 1.09-1.20x,
#: Q8_0 1.04-1.11x, float32 1.06-1.20x faster). A count no step reaches:
EVERY_BATCH = 1 << 40


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


def max_rows(dtype: torch.dtype) -> int:
    """Rows up to which a GGUF layer of `dtype` runs the int8 kernel (0: none)."""
    if not ops.has_gguf_int8_linear():
        return 0
    rows = envs.gguf_int8_max_m()
    if rows is not None:
        return rows
    return INT8_MAX_M_AMX if dtype == torch.bfloat16 and ops.amx_in_use() else EVERY_BATCH


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
