"""GGUF's quantized linear layers on the wna16 kernels, weights never
dequantized: each block type repacked exactly (gguf_blocks) into unsigned q,
per-group scales and integer zero points. The types with a float min per group
(Q4_1, Q5_1, Q4_K, Q5_K) run as the kernel's zero-point-free product plus
the min's share, x's sums over each group times the mins:
x . ((q * s) + m) = x . (q * s) + sum_g m_g * sum_{k in g} x_k, a small
[rows, groups] x [groups, N] product (1/group of the weights' FLOPs and one
float a group to read). A fused layer (q/k/v, gate/up) whose parts differ in
type (Q4_K_M files give v_proj Q6_K beside Q4_K) takes the widest bits and
the finest group of its parts: a 4-bit q fits 8 bits, a scale covers two
half-groups as it covers one. The x86 kernels quantize x to int8 and
multiply in integer dot products as llama.cpp does (gguf_int8; every batch,
or up to gguf_int8.INT8_MAX_M_AMX rows where bfloat16 runs AMX tiles), over
a weight of the file's bits a value: the same packed weight for 4- and 8-bit
types, nibbles and high bits for 5- and 6-bit ones; a fused layer's parts by
runs of one type."""
from __future__ import annotations

from dataclasses import dataclass
from functools import cache

import torch

from engine import ops
from engine.model_executor.layers.linear import Linear, pack_panels
from engine.model_executor.layers.quantization import gguf_int8
from engine.model_executor.layers.quantization.gguf_blocks import Unpacked
from engine.model_executor.layers.quantization.wna16 import WNA16


@dataclass(frozen=True)
class GGUFLinear(WNA16):
    """WNA16 with mins: the layer holds gguf_mins (None without), float32 [groups, N]
    or the engine's panels of its transpose, and gguf_groups."""

    def load(self, layer: Linear, parts: list[Unpacked]) -> None:
        """Give `layer` this method and its weight: parts, the fused layer's in
        order of their rows."""
        assert layer.weight is not None, "the float layer, before its weights are read"
        dtype = layer.weight.dtype  # the model's: create_weights drops the placeholder
        self.create_weights(layer)
        group = self.group_size
        assert group is not None, "GGUF blocks have groups"
        qs, scales, zeros, mins = [], [], [], []
        for u in parts:
            repeat = u.form.group // group
            qs.append(u.q)
            scales.append(u.scales.repeat_interleave(repeat, dim=1))
            zeros.append(torch.full_like(scales[-1], u.form.zero, dtype=torch.uint8))
            mins.append(torch.zeros_like(scales[-1]) if u.mins is None
                        else u.mins.repeat_interleave(repeat, dim=1))
        self.set_weights(layer, _cat(qs), _cat(scales), _cat(zeros), None, group)
        layer.gguf_mins = None
        has_mins = any(u.mins is not None for u in parts)
        layer.gguf_int8_rows = gguf_int8.max_rows(dtype)
        layer.gguf_int8 = _int8_weights(layer, parts) if layer.gguf_int8_rows > 0 else []
        if has_mins:
            m = _cat(mins)  # [N, groups]
            layer.gguf_groups = m.shape[1]
            # the engine's panel GEMM where it has one: MKL's float32 GEMM of K = groups
            # ran 20x slower on Zen 4 (16 ms vs 0.7 ms at 500 x 64 x 4096)
            layer.gguf_mins = pack_panels(m, ops.panel_k_pack(torch.float32)) \
                if ops.has_panel_linear() else m.T.contiguous()

    def apply(self, layer: Linear, x: torch.Tensor) -> torch.Tensor:
        rows, runs = x.numel() // x.shape[-1], layer.gguf_int8
        if runs and rows <= layer.gguf_int8_rows:
            x2 = x.reshape(rows, x.shape[-1])
            x2 = x2 if x2.stride(-1) == 1 else x2.contiguous()
            out = x2.new_empty(rows, layer.out_features)
            for w in runs:  # columns of out: the kernel writes with out's row stride
                ops.gguf_int8_linear(out if len(runs) == 1 else out[:, w.n0:w.n0 + w.n], x2,
                                     w.packed, w.high, w.terms, w.bits, w.group, w.zero)
            if layer.bias is not None:
                out += layer.bias
            return out.view(*x.shape[:-1], layer.out_features)
        out = super().apply(layer, x)
        mins = layer.gguf_mins
        if mins is None:
            return out
        # each group's sum of x in float32, as a product with ones: torch's sum over
        # an innermost dim of 32 ran 100x slower (24 ms vs 0.24 ms at 500 x 2048)
        groups, k = layer.gguf_groups, x.shape[-1]
        x32 = x.reshape(-1, k).float()
        sums = torch.mm(x32.view(-1, k // groups), _ones(k // groups)).view(-1, groups)
        flat = out.view(-1, out.shape[-1])
        if mins.dim() == 3:  # the engine's panels
            share = sums.new_empty(sums.shape[0], flat.shape[1])
            ops.linear(share, sums, mins, None)
        else:
            share = torch.mm(sums, mins)
        flat.add_(share)  # in float32, rounded to the output's dtype once
        return out


def _int8_weights(layer: Linear, parts: list[Unpacked]) -> list[gguf_int8.Int8Weight]:
    """The int8 kernel's weight: each run of parts of one type at its own bits
    and group (a 4- or 8-bit layer of one type shares the wna16 packing); []
    where a factor is not finite in float16."""
    runs: list[list[Unpacked]] = []
    for u in parts:
        if runs and runs[-1][0].form == u.form:
            runs[-1].append(u)
        else:
            runs.append([u])
    out, n0 = [], 0
    for run in runs:
        form = run[0].form
        q, scales = _cat([u.q for u in run]), _cat([u.scales for u in run])
        mins = _cat([u.mins for u in run if u.mins is not None]) if form.has_min else None
        shared = layer.wna16[0] if len(runs) == 1 and form.value_bits == form.bits else None
        w = gguf_int8.pack(q, scales, torch.full_like(scales, form.zero, dtype=torch.uint8),
                           mins, form.value_bits, form.group, n0, shared)
        if w is None:
            return []
        out.append(w)
        n0 += q.shape[0]
    return out


def _cat(parts: list[torch.Tensor]) -> torch.Tensor:
    return parts[0] if len(parts) == 1 else torch.cat(parts)  # one part: no copy


@cache
def _ones(n: int) -> torch.Tensor:
    return torch.ones(n, 1)


def method_for(parts: list[Unpacked]) -> GGUFLinear:
    """The widest bits and finest group among a layer's parts."""
    bits = max(u.form.bits for u in parts)
    group = min(u.form.group for u in parts)
    return GGUFLinear(bits, group, symmetric=False)
