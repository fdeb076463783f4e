"""GGUF's quantized blocks taken apart into the weight-only form the wna16
kernels run (wna16.pack_wna16): unsigned q [N, K], one scale and an integer
zero point per group of K, and for the types with a minimum (Q4_1, Q5_1, the
K-quants) a float min per group, W = (q - zero) * scale + min. Each is
exactly the weight gguf.quants.dequantize gives (tests/models/test_gguf_blocks.py):
the scales are fp16 x int products, exact in float32, and the kernel forms
(q - zero) * scale in float32 as the gguf package does.

Types with no exact form here (Q2_K, Q3_K, the IQ types...) are dequantized
to the model's dtype at load by the caller."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class Form:
    """A type's place in the kernels: bits of q in wna16 (4, or 8 for 5/6/8-bit
    values), the group its scale covers, its zero point, whether it has a min,
    and the bits of its values (the int8 kernel streams as many)."""
    bits: int
    group: int
    zero: int
    has_min: bool
    value_bits: int


FORMS = {"Q4_0": Form(4, 32, 8, False, 4), "Q4_1": Form(4, 32, 0, True, 4),
         "Q5_0": Form(8, 32, 16, False, 5), "Q5_1": Form(8, 32, 0, True, 5),
         "Q8_0": Form(8, 32, 128, False, 8), "Q4_K": Form(4, 32, 0, True, 4),
         "Q5_K": Form(8, 32, 0, True, 5), "Q6_K": Form(8, 16, 32, False, 6)}


@dataclass
class Unpacked:
    """q [N, K] uint8, scales [N, groups] float32, mins [N, groups] float32 or None."""
    q: torch.Tensor
    scales: torch.Tensor
    mins: torch.Tensor | None
    form: Form


def _f16(b: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(b).view(np.float16).astype(np.float32)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """[.., n, 16] bytes -> [.., n, 32]: the low nibbles, then the high ones."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=-1)


def _bits_of(qh: np.ndarray, count: int) -> np.ndarray:
    """[B, 4] bytes of a little-endian uint32 -> [B, count] bits, bit j for value j."""
    word = np.ascontiguousarray(qh).view("<u4").reshape(-1, 1)
    return ((word >> np.arange(count, dtype=np.uint32)) & 1).astype(np.uint8)


def _q4_0(b):
    return _nibbles(b[:, 2:]), _f16(b[:, :2]), None


def _q4_1(b):
    return _nibbles(b[:, 4:]), _f16(b[:, :2]), _f16(b[:, 2:4])


def _q5_0(b):
    return _nibbles(b[:, 6:]) | (_bits_of(b[:, 2:6], 32) << 4), _f16(b[:, :2]), None


def _q5_1(b):
    return _nibbles(b[:, 8:]) | (_bits_of(b[:, 4:8], 32) << 4), _f16(b[:, :2]), _f16(b[:, 2:4])


def _q8_0(b):
    return (b[:, 2:].view(np.int8).astype(np.int16) + 128).astype(np.uint8), _f16(b[:, :2]), None


def _k_scales(b):
    """d * sc and -dmin * m of Q4_K / Q5_K: [B, 8] each."""
    from gguf.quants import Q4_K

    sc, m = Q4_K.get_scale_min(np.ascontiguousarray(b[:, 4:16]))
    return _f16(b[:, :2]) * sc.astype(np.float32), -(_f16(b[:, 2:4]) * m.astype(np.float32))


def _q4_k(b):
    scales, mins = _k_scales(b)
    return _k_order(b[:, 16:]), scales, mins


def _k_order(qs: np.ndarray) -> np.ndarray:
    """128 bytes of a K-quant super-block -> its 256 4-bit values: chunk i of 32
    bytes holds sub-block 2i in its low nibbles and 2i + 1 in its high ones."""
    chunks = qs.reshape(-1, 4, 32)
    return np.stack([chunks & 0x0F, chunks >> 4], axis=2).reshape(-1, 256)


def _q5_k(b):
    high = (b[:, 16:48].reshape(-1, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(1, 8, 1)) & 1
    scales, mins = _k_scales(b)
    return _k_order(b[:, 48:]) | (high.reshape(-1, 256) << 4), scales, mins


def _q6_k(b):
    ql, qh = b[:, :128].reshape(-1, 2, 64), b[:, 128:192].reshape(-1, 2, 32)
    low = np.stack([ql & 0x0F, ql >> 4], axis=2).reshape(-1, 2, 4, 32)  # [B, half, 4, 32]
    high = (qh[:, :, None, :] >> np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 1, 4, 1)) & 3
    q = (low | (high << 4)).reshape(-1, 256)
    scales = _f16(b[:, 208:210]) * b[:, 192:208].view(np.int8).astype(np.float32)
    return q, scales, None


_UNPACK = {"Q4_0": _q4_0, "Q4_1": _q4_1, "Q5_0": _q5_0, "Q5_1": _q5_1, "Q8_0": _q8_0,
           "Q4_K": _q4_k, "Q5_K": _q5_k, "Q6_K": _q6_k}


def unpack(type_name: str, data: np.ndarray, rows: int, cols: int) -> Unpacked:
    """A [rows, cols] tensor of type_name (one of FORMS), data its blocks
    ([rows, bytes of a row] uint8, as the gguf reader gives them)."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    block, size = GGML_QUANT_SIZES[GGMLQuantizationType[type_name]]
    blocks = np.ascontiguousarray(data, dtype=np.uint8).reshape(-1, size)
    q, scales, mins = _UNPACK[type_name](blocks)
    form = FORMS[type_name]
    groups = cols // form.group

    def t(a: np.ndarray, width: int) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(a).reshape(rows, width))

    return Unpacked(t(q, cols), t(scales, groups).float(),
                    None if mins is None else t(mins, groups).float(), form)


def dequantized(u: Unpacked) -> torch.Tensor:
    """The float32 weight [N, K] of an Unpacked: (q - zero) * scale + min."""
    g = torch.arange(u.q.shape[1]) // u.form.group
    w = (u.q.int() - u.form.zero).float() * u.scales[:, g]
    return w if u.mins is None else w + u.mins[:, g]
