"""The W8A8 kernel (int8 x int8 -> int32, per-token and per-channel scales)
against engine.reference.int8_linear, bit for bit, on every compiled CPU code
path this CPU can run: VNNI on avx512_bf16, widened int16 on avx512 and avx2;
and AMX-INT8 tiles on avx512_bf16 where the CPU has them (from 8 rows)."""
from __future__ import annotations

import pytest
import torch
from test_ops import isa, tiles  # noqa: F401  (every test on each code path, AMX or not)

from engine import ops, reference
from engine.model_executor.layers.quantization.w8a8 import pack_int8

pytestmark = [pytest.mark.skipif(not ops.has_int8_linear(),
                                 reason="no int8 linear kernel in this build / on this CPU"),
              pytest.mark.usefixtures("tiles")]


def _case(m, n, k, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    w = torch.randint(-128, 128, (n, k), dtype=torch.int8, generator=g)
    x = (torch.randn(m, k, generator=g) * 3).to(dtype)
    scale = torch.rand(n, generator=g) * 0.01 + 1e-4
    return x, w, scale


# rows across the decode (<= 16) and prefill tiles, columns past a panel and
# odd, k not a multiple of 4
@pytest.mark.parametrize("m,n,k", [(1, 16, 64), (1, 33, 7), (3, 50, 130), (16, 64, 257),
                                   (17, 40, 96), (40, 100, 33), (8, 48, 5456), (33, 80, 128)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("static", [False, True])
def test_int8_linear_matches_reference(m, n, k, dtype, static):
    x, w, scale = _case(m, n, k, dtype)
    x[0, :] = 0  # a zero row: scale 1, output 0
    packed, comp = pack_int8(w)
    s = torch.tensor([0.05]) if static else None
    out, ref = torch.empty(m, n, dtype=dtype), torch.empty(m, n, dtype=dtype)
    ops.int8_linear(out, x, packed, scale, comp, s)
    reference.int8_linear(ref, x, packed, scale, comp, s)
    assert torch.equal(out, ref)
    assert not out[0].any()


def test_int8_linear_strided_input_rows():
    x, w, scale = _case(5, 24, 64, torch.bfloat16)
    wide = torch.zeros(5, 80, dtype=torch.bfloat16)
    wide[:, :64] = x
    packed, comp = pack_int8(w)
    out, ref = torch.empty(5, 24, dtype=torch.bfloat16), torch.empty(5, 24, dtype=torch.bfloat16)
    ops.int8_linear(out, wide[:, :64], packed, scale, comp)
    reference.int8_linear(ref, x, packed, scale, comp, None)
    assert torch.equal(out, ref)


def test_reference_is_the_quantised_matmul():
    """The reference itself: int8 rows times int8 weight, exact int32 sums."""
    x, w, scale = _case(4, 20, 50, torch.float32)
    q, s = reference.quant_int8_rows(x)
    assert q.dtype == torch.int8 and s.shape == (4, 1)
    assert torch.equal(s[:, 0], x.abs().amax(1) / 127)
    packed, comp = pack_int8(w)
    assert torch.equal(reference.unpack_int8(packed, 20, 50), w)
    assert torch.equal(comp[:20], w.int().sum(1) * 128)
    out = torch.empty(4, 20)
    reference.int8_linear(out, x, packed, scale, comp, None)
    acc = (q.int()[:, None, :] * w.int()[None]).sum(-1)
    assert torch.equal(out, (acc.float() * s) * scale)


def test_int8_linear_rejects_a_misshapen_weight():
    x, w, scale = _case(2, 32, 64, torch.float32)
    packed, comp = pack_int8(w)
    with pytest.raises(ValueError, match="packed_weight must be contiguous int8"):
        torch.ops._C.int8_linear(torch.empty(2, 32), x, packed.float(), scale, comp, None)
    with pytest.raises(ValueError, match="weight_scale must be contiguous float32"):
        torch.ops._C.int8_linear(torch.empty(2, 32), x, packed, scale[:16], comp, None)


def test_pack_int8_offsets_every_block_of_rows():
    """pack_int8 sums the weight's rows COMP_ROWS at a time: every block, the
    last one short, and a shape needing no padding (packed without a copy)."""
    from engine.model_executor.layers.quantization.w8a8 import COMP_ROWS

    for n, k in ((2 * COMP_ROWS + 16, 64), (2 * COMP_ROWS + 5, 50)):
        w = torch.randint(-128, 128, (n, k), dtype=torch.int8,
                          generator=torch.Generator().manual_seed(n))
        packed, comp = pack_int8(w)
        assert torch.equal(reference.unpack_int8(packed, n, k), w)
        assert torch.equal(comp[:n], w.int().sum(1) * 128) and not comp[n:].any()
