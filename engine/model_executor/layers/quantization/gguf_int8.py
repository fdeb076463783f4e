"""GGUF's few-row layers as llama.cpp runs them: x quantized to int8 per row
and group, the weight's unsigned q multiplied in integer dot products
(engine.ops.gguf_int8_linear, csrc/cpu/gguf_int8.h), over the wna16 packed
weight the layer has anyway. What it needs beside that: per group and column
the scale and the term min - scale * zero, float16 (the GGUF files' own
precision for Q4_0/Q8_0's scales; half of float32's bytes, and at decode the
bytes are the cost): x . W over a group = scale * (x . q) + term * sum(x)."""
from __future__ import annotations

import torch

from engine import envs, ops

PANEL = ops.PANEL
#: Rows up to which the int8 kernel runs by default, wna16's float kernel (or
#: the large-M GEMM) from there. Where AMX tiles run (wna16 from 16 rows) they
#: take 16: on a 2-core Xeon at 16 rows, 4-bit, the tiles ran K x N 576 x 960 /
#: 1536 x 576 in 48 / 75 us, this kernel in 58 / 119 us; 576 x 3072 126 vs 121
INT8_MAX_M = 16
INT8_MAX_M_AMX = 15


def max_rows() -> int:
    """Rows up to which a GGUF layer runs the int8 kernel (0: none)."""
    if not ops.has_gguf_int8_linear():
        return 0
    rows = envs.gguf_int8_max_m()
    if rows is not None:
        return rows
    return INT8_MAX_M_AMX if ops.amx_in_use() else INT8_MAX_M


def pack_group_terms(scales: torch.Tensor, zeros: torch.Tensor,
                     mins: torch.Tensor | None) -> torch.Tensor | None:
    """scales, zeros, mins [N, groups] -> [ceil(N/16), groups, 2, 16] float16
    (scale, then min - scale * zero, per panel column; zero past N), or None
    where a term is not finite in float16 (the layer then runs wna16 only)."""
    n, groups = scales.shape
    term = -scales.float() * zeros.float()
    if mins is not None:
        term += mins.float()
    both = torch.stack([scales.float(), term])  # [2, N, groups]
    panels = -(-n // PANEL)
    padded = torch.zeros(2, panels * PANEL, groups)
    padded[:, :n] = both
    out = padded.view(2, panels, PANEL, groups).permute(1, 3, 0, 2).to(torch.float16).contiguous()
    return out if bool(torch.isfinite(out).all()) else None

