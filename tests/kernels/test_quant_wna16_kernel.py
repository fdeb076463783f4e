"""The weight-only quantized kernels (W4A16, W8A16: wna16_linear for few rows,
wna16_dequant for the large-M panel) against engine.reference's on every
compiled CPU code path this CPU can run (avx512_bf16, avx512, avx2)."""
from __future__ import annotations

import pytest
import torch
from test_ops import isa, tiles  # noqa: F401  (every test on each code path, AMX or not)

from engine import ops, reference
from engine.model_executor.layers.quantization.wna16 import (LARGE_M, WNA16, dequant_buffer,
                                                             pack_wna16)

pytestmark = [pytest.mark.skipif(not ops.has_wna16_linear(),
                                 reason="no wna16 kernel in this build / on this CPU"),
              pytest.mark.usefixtures("tiles")]


def _case(n, k, bits, group, seed=0):
    g = torch.Generator().manual_seed(seed)
    groups = -(-k // group)
    q = torch.randint(0, 1 << bits, (n, k), generator=g, dtype=torch.uint8)
    zeros = torch.randint(0, 1 << bits, (n, groups), generator=g, dtype=torch.uint8)
    scales = torch.rand(n, groups, generator=g) * 0.02 + 1e-3
    return q, scales, zeros


def _dense(q, scales, zeros, group):
    g = torch.arange(q.shape[1]) // group
    return (q.int() - zeros.int()[:, g]).float() * scales[:, g]


# group sizes 32/64/128 and per channel (one group of K rounded up to a lane),
# k not a multiple of the group, columns past a panel, rows across the tiles
# (16 AVX-512, 4 AVX2)
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("m,n,k,group", [(1, 16, 128, 32), (1, 50, 256, 64), (3, 33, 130, 32),
                                         (4, 64, 256, 128), (16, 40, 96, 32), (17, 24, 64, 64),
                                         (5, 48, 200, 200), (40, 20, 72, 8),
                                         (16, 48, 300, 128), (33, 17, 64, 32),
                                         # one row, K ending inside a group; a group of one step
                                         (1, 24, 200, 128), (1, 20, 72, 8)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_wna16_linear_matches_reference(bits, m, n, k, group, dtype, tiles):
    group = -(-group // (32 // bits)) * (32 // bits)
    q, scales, zeros = _case(n, k, bits, group)
    packed, s, z = pack_wna16(q, scales, zeros, bits, group)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(1)).to(dtype)
    out, ref = torch.empty(m, n, dtype=dtype), torch.empty(m, n, dtype=dtype)
    ops.wna16_linear(out, x, packed, s, z, bits, group)
    reference.wna16_linear(ref, x, packed, s, z, bits, group)
    tol = dict(atol=1e-4, rtol=1e-4) if dtype == torch.float32 else dict(atol=2e-2, rtol=1.6e-2)
    if tiles == "amx" and dtype == torch.bfloat16 and m >= 16 and group % 32 == 0:
        # AMX multiplies bfloat16 weights, the dequantised ones rounded (as the large-M
        # panel): each product off by at most 2^-9 of itself, the sum then rounded once
        w = _dense(q, scales, zeros, group)
        exact = x.float() @ w.T
        bound = (x.float().abs() @ w.abs().T) * 2.0 ** -9 + exact.abs() * 2.0 ** -8 + 1e-6
        assert ((out.float() - exact).abs() <= bound).all()
        return
    torch.testing.assert_close(out, ref, **tol)
    # and the reference is the dense fake-quant product
    dense = x.float() @ _dense(q, scales, zeros, group).T
    torch.testing.assert_close(ref.float(), dense.to(dtype).float(), **tol)


@pytest.mark.parametrize("m", [1, 2, 3])
def test_few_rows_4bit_bfloat16_error_stays_near_the_answers_rounding(m, tiles):
    """One request's kernel (on AVX512_BF16 it sums x * (128 + q) and takes
    (128 + zero) * sum x off each group): deep K, asymmetric zeros, the error
    within the bfloat16 answer's rounding plus 2^-12 of sum |x| |w| (a wrong
    bias or group sum is off by the answer's size)."""
    n, k, group = 48, 2048, 128
    q, scales, zeros = _case(n, k, 4, group, seed=7)
    packed, s, z = pack_wna16(q, scales, zeros, 4, group)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(8)).to(torch.bfloat16)
    out = torch.empty(m, n, dtype=torch.bfloat16)
    ops.wna16_linear(out, x, packed, s, z, 4, group)
    w = _dense(q, scales, zeros, group).double()
    exact = x.double() @ w.T
    bound = exact.abs() * 2.0 ** -8 + (x.double().abs() @ w.abs().T) * 2.0 ** -12
    assert ((out.double() - exact).abs() <= bound).all()


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_wna16_dequant_is_the_reference_bit_for_bit(bits, dtype):
    n, k, group = 37, 160, 32
    q, scales, zeros = _case(n, k, bits, group, seed=2)
    packed, s, z = pack_wna16(q, scales, zeros, bits, group)
    out, ref = torch.empty(k, n, dtype=dtype), torch.empty(k, n, dtype=dtype)
    ops.wna16_dequant(out, packed, s, z, bits, group)
    reference.wna16_dequant(ref, packed, s, z, bits, group)
    assert torch.equal(out, ref)
    assert torch.equal(ref, _dense(q, scales, zeros, group).T.to(dtype))


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("dtype,k_pack", [(torch.float32, 1), (torch.bfloat16, 1),
                                          (torch.bfloat16, 2)])
@pytest.mark.parametrize("n,k,group", [(37, 160, 32), (16, 72, 8), (20, 131, 131)])
def test_wna16_dequant_panels_is_pack_panels_of_the_weight(bits, dtype, k_pack, n, k, group):
    """Bit for bit the reference, which is pack_panels of the dense weight (odd k:
    the last pair's second half zero)."""
    from engine.model_executor.layers.linear import pack_panels

    group = -(-group // (32 // bits)) * (32 // bits)
    q, scales, zeros = _case(n, k, bits, group, seed=4)
    packed, s, z = pack_wna16(q, scales, zeros, bits, group)
    shape = (-(-n // 16), -(-k // k_pack), 16 * k_pack)
    out, ref = torch.full(shape, float("nan"), dtype=dtype), torch.empty(shape, dtype=dtype)
    ops.wna16_dequant_panels(out, packed, s, z, bits, group, n, k)
    reference.wna16_dequant_panels(ref, packed, s, z, bits, group, n, k)
    assert torch.equal(out, ref)
    assert torch.equal(ref, pack_panels(_dense(q, scales, zeros, group).to(dtype), k_pack))


def test_pack_wna16_round_trips():
    q, scales, zeros = _case(21, 72, 4, 32, seed=3)
    packed, s, z = pack_wna16(q, scales, zeros, 4, 32)
    assert packed.shape == (2, 96 // 8, 16) and s.shape == z.shape == (2, 3, 16)
    assert torch.equal(reference.unpack_wna16(packed, s, z, 4, 32, 21, 72),
                       _dense(q, scales, zeros, 32))
    # lane order: column 0's first 8 k, k0 in the low nibble
    want = sum(int(q[0, j]) << (4 * j) for j in range(8))
    assert packed[0, 0, 0].item() & 0xFFFFFFFF == want


@pytest.mark.parametrize("bits", [4, 8])
def test_pack_wna16_takes_uint8_values_whole(bits):
    """uint8 q of whole panels and groups (as the checkpoint readers give) is
    packed without a padded copy; the top value's bits land in the sign bit."""
    q, scales, zeros = _case(32, 64, bits, 32, seed=6)
    q[:, :32 // bits] = 2 ** bits - 1  # column 0's first lane: every bit set
    packed, s, z = pack_wna16(q.to(torch.uint8), scales, zeros, bits, 32)
    assert torch.equal(reference.unpack_wna16(packed, s, z, bits, 32, 32, 64),
                       _dense(q, scales, zeros, 32))
    assert packed[0, 0, 0].item() == -1


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, LARGE_M])
def test_layer_runs_the_kernel_and_the_large_m_panel_alike(rows, dtype):
    """The method's two paths (kernel below LARGE_M rows, the weight dequantised
    into the panel kernel's layout and multiplied by it from there; AMX tiles
    where they run) and the act-order input permutation."""
    from torch import nn

    n, k, group = 40, 128, 32
    q, scales, zeros = _case(n, k, 4, group, seed=4)
    layer = nn.Module()
    layer.weight, layer.bias = torch.empty(n, k), torch.randn(n)
    method = WNA16(4, group)
    method.create_weights(layer)
    perm = torch.randperm(k, generator=torch.Generator().manual_seed(5))
    method.set_weights(layer, q, scales, zeros, perm, group)
    x = torch.randn(rows, k).to(dtype)
    want = x[:, perm].float() @ _dense(q, scales, zeros, group).T + layer.bias
    tol = dict(atol=1e-4, rtol=1e-4) if dtype == torch.float32 else dict(atol=5e-2, rtol=2e-2)
    torch.testing.assert_close(method.apply(layer, x).float(), want, **tol)


def test_large_m_layers_share_one_dequant_buffer():
    a = dequant_buffer(64, 32, dtype=torch.float32)
    b = dequant_buffer(16, 24, dtype=torch.float32)
    assert b.data_ptr() == a.data_ptr() and b.shape == (16, 24) and b.is_contiguous()
    assert dequant_buffer(128, 32, dtype=torch.float32).shape == (128, 32)  # grown
    assert dequant_buffer(8, 8, dtype=torch.bfloat16).dtype == torch.bfloat16
    assert dequant_buffer(2, 4, 32, dtype=torch.bfloat16).shape == (2, 4, 32)  # panels


def test_wna16_linear_rejects_a_misshapen_weight():
    q, scales, zeros = _case(32, 64, 4, 32)
    packed, s, z = pack_wna16(q, scales, zeros, 4, 32)
    x, out = torch.randn(2, 64), torch.empty(2, 32)
    with pytest.raises(ValueError, match="packed_weight must be contiguous int32"):
        torch.ops._C.wna16_linear(out, x, packed[:, :4].contiguous(), s, z, 4, 32)
    with pytest.raises(ValueError, match="zeros must be contiguous uint8"):
        torch.ops._C.wna16_linear(out, x, packed, s, z.int(), 4, 32)
    with pytest.raises(ValueError, match="group_size must be a positive multiple of 8"):
        torch.ops._C.wna16_linear(out, x, packed, s, z, 4, 12)
