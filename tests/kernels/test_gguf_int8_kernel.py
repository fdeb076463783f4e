"""GGUF's int8-activation kernel (gguf_int8_linear: x rounded to int8 per row
and group, integer dot products with q of 4, 5, 6 or 8 bits a value, float16
factors a group: the scale, and the term or the layer's zero point) against
engine.reference's on every compiled CPU code path this CPU can run
(avx512_bf16's VNNI, avx512's and avx2's vpmaddubsw), and the reference
against the dense float product within x's rounding."""
from __future__ import annotations

import pytest
import torch
from test_ops import isa  # noqa: F401  (every test on each code path)

from engine import ops, reference
from engine.model_executor.layers.quantization.gguf_int8 import (
    pack,
    pack_group_terms,
    pack_high_bits,
)

pytestmark = pytest.mark.skipif(not ops.has_gguf_int8_linear(),
                                reason="no gguf_int8 kernel in this build / on this CPU")


def _case(n, k, bits, group, zero, with_mins, seed=0):
    """q, scales, zeros, mins as GGUF's blocks give them (scales and mins float16
    values, one zero point a type; 8-bit q over the whole byte)."""
    g = torch.Generator().manual_seed(seed)
    groups = k // group
    q = torch.randint(0, 1 << bits, (n, k), generator=g, dtype=torch.uint8)
    zeros = torch.full((n, groups), zero, dtype=torch.uint8)
    scales = (torch.rand(n, groups, generator=g) * 0.02 + 1e-3).half().float()
    mins = (torch.randn(n, groups, generator=g) * 0.02).half().float() if with_mins else None
    return q, scales, zeros, mins


def _dense(q, scales, zeros, mins, group):
    g = torch.arange(q.shape[1]) // group
    w = (q.float() - zeros.float()[:, g]) * scales[:, g]
    return w if mins is None else w + mins[:, g]


# smallest group a layout takes: whole 8-k steps (4-k for bytes), whole chunks
# of high bits for 5 and 6 (32 / (bits - 4) k)
UNIT = {4: 8, 5: 32, 6: 16, 8: 4}


# rows across the tiles (4 a tile on AVX2, 8 on AVX-512), columns past a panel
# (and past half of one: AVX2's two vectors), groups of 8 (4-bit only), 16 (Q6_K),
# 32 and 64, K a multiple of the group only and not of a vector (the staging's
# scalar tail: 48, 96, 160 at groups of 16/32 on AVX-512); one zero point (one
# term a group) and mins (two)
@pytest.mark.parametrize("bits,zero,with_mins", [(4, 8, False), (4, 0, True), (5, 16, False),
                                                 (5, 0, True), (6, 32, False), (6, 0, True),
                                                 (8, 128, False), (8, 32, False), (8, 0, True)])
@pytest.mark.parametrize("m,n,k,group", [(1, 16, 64, 32), (1, 7, 96, 32), (3, 33, 160, 32),
                                         (5, 50, 48, 16), (9, 24, 128, 64), (16, 40, 64, 8),
                                         (17, 100, 96, 32), (2, 20, 40, 8),
                                         (130, 40, 96, 32)])  # prefill's batches
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_matches_reference(bits, zero, with_mins, m, n, k, group, dtype):
    if group % UNIT[bits]:
        pytest.skip(f"{bits}-bit values take groups of whole {UNIT[bits]} k: not {group}")
    q, scales, zeros, mins = _case(n, k, bits, group, zero, with_mins)
    w = pack(q, scales, zeros, mins, bits, group)
    assert w is not None and w.terms.shape[2] == (2 if with_mins else 1)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(1)).to(dtype)
    x[0, :group] = 0  # a group of zeros: scale 0, no division by it
    if m > 1:
        x[1, :] *= 100  # large x: the 8-bit signed form's int16 pairs must not overflow
    out, ref = torch.empty(m, n, dtype=dtype), torch.empty(m, n)
    args = (w.packed, w.high, w.terms, bits, group, w.zero)
    ops.gguf_int8_linear(out, x, *args)
    reference.gguf_int8_linear(ref, x, *args)
    # the integer sums are exact on both sides; the float ones differ in order
    # (and the output rounds once to bfloat16). A product x * 127 / max|x| that
    # lands on a tie (bfloat16 x has few bits) may round either way: one x step
    # times one weight (seen once: 16 x 40 x 64, 8-bit, groups of 8)
    xf = x.float()
    w = _dense(q, scales, zeros, mins, group)
    tie = float(xf.abs().amax() / 127 * w.abs().max())
    tol = dict(atol=1e-4 + tie, rtol=1e-4) if dtype == torch.float32 else \
        dict(atol=2e-2 + tie, rtol=1e-2)
    torch.testing.assert_close(out.float(), ref, **tol)
    # the reference: the dense product within x's rounding, half a step (max|x| / 254
    # of its group) a value, and the terms' float16 rounding
    # (in float64: torch's float32 GEMM may take reduced-precision paths on aarch64)
    xd, wd = xf.double(), w.double()
    step = xd.abs().view(m, k // group, group).amax(-1) / 254  # [m, groups]
    wabs = wd.abs().view(n, k // group, group).sum(-1)  # [n, groups]
    bound = step @ wabs.T + (xd.abs() @ wd.abs().T) * 2.0 ** -10 + 1e-5
    assert ((ref.double() - xd @ wd.T).abs() <= bound).all()


def test_refuses_a_wrong_layout():
    q, scales, zeros, mins = _case(16, 64, 5, 32, 16, False)
    w = pack(q, scales, zeros, mins, 5, 32)
    out, x = torch.empty(1, 16), torch.randn(1, 64)
    op = torch.ops._C.gguf_int8_linear
    with pytest.raises(ValueError, match="terms must be contiguous float16"):
        op(out, x, w.packed, w.high, w.terms.float(), 5, 32, 16)
    with pytest.raises(ValueError, match="packed_weight must be"):
        op(out, x, w.packed, None, w.terms, 8, 32, 16)
    with pytest.raises(ValueError, match="high_bits is for 5- and 6-bit"):
        op(out, x, w.packed, None, w.terms, 5, 32, 16)
    with pytest.raises(ValueError, match="high_bits must be"):
        op(out, x, w.packed, w.high, w.terms, 6, 32, 16)
    with pytest.raises(ValueError, match="whole 32 k|multiple of 32"):
        op(out, x, w.packed, w.high, w.terms, 5, 16, 16)


def test_group_terms_layout():
    """[panels, groups, 2, 16]: column c's scale, then min - scale * zero; one
    term, the scale, where there is no min and one zero point."""
    scales = torch.tensor([[0.5, 0.25]] * 17)
    zeros = torch.tensor([[8, 8]] * 17, dtype=torch.uint8)
    mins = torch.full((17, 2), 1.0)
    t, zero = pack_group_terms(scales, zeros, mins)
    assert t.shape == (2, 2, 2, 16) and t.dtype == torch.float16 and zero == 0
    assert t[0, 1, 0, 3] == 0.25 and t[0, 1, 1, 3] == 1.0 - 0.25 * 8
    assert t[1, 0, 0, 0] == 0.5 and (t[1, :, :, 1:] == 0).all()  # columns past N
    t, zero = pack_group_terms(scales, zeros, None)
    assert t.shape == (2, 2, 1, 16) and zero == 8 and t[0, 1, 0, 3] == 0.25
    zeros[3, 1] = 9  # two zero points: the term carries them
    assert pack_group_terms(scales, zeros, None)[0].shape == (2, 2, 2, 16)
    assert pack_group_terms(scales * 1e5, zeros, None)[0] is None  # not finite in float16


@pytest.mark.parametrize("bits", [5, 6])
def test_high_bits_layout(bits):
    """Byte j of a column's lane, at bit 2h * t: k = 8t + 2j's bits above 4, at
    2h * t + h: k = 8t + 2j + 1's (gguf_int8.h); 32 / h k a lane."""
    h, n, k = bits - 4, 17, 64
    q = torch.zeros(n, k, dtype=torch.uint8)
    q[16, 8 * 1 + 2 * 3 + 1] = ((1 << h) - 1) << 4  # column 16 (panel 1, lane 0): t 1, j 3, odd
    q[2, 0] = 0x0F  # nibble bits only: no high bits
    plane = pack_high_bits(q, bits, 32)
    chunk = 32 // h
    assert plane.shape == (2, k // chunk, 16) and plane.dtype == torch.int32
    want = torch.zeros_like(plane)
    bits_at = ((1 << h) - 1) << (8 * 3 + 2 * h * 1 + h)  # all h bits of that value
    want[1, 0, 0] = bits_at - (1 << 32) if bits_at >= 1 << 31 else bits_at  # int32's wrap
    torch.testing.assert_close(plane, want)
