"""Every compiled op against its pure-torch reference (engine.reference), on
both x86 code paths where the processor has them, in float32 and bfloat16,
on shapes that include odd sizes, one token, many sequences and GQA 1/4/8.

This file also runs inside a fresh virtual environment against the repaired
wheel (tests/toolchain/test_wheel_e2e.py), so it imports only `engine` and torch.
"""
from __future__ import annotations

import math

import pytest
import torch

import engine
from engine import ops, reference

# Tolerances per dtype: float32 differs only by summation order; bfloat16
# results are rounded once from float32, so they may differ by about one ulp.
TOL = {torch.float32: dict(atol=2e-5, rtol=2e-5), torch.bfloat16: dict(atol=1.6e-2, rtol=1.6e-2)}
DTYPES = [torch.float32, torch.bfloat16]


def _isas() -> list:
    """Every compiled CPU code path; one this CPU cannot run (or that
    VLLM_CPU_MAX_ISA hides) is a visible skip with the reason."""
    if not engine.BUILD_INFO.has_kernels or engine.BUILD_INFO.device != "cpu":
        return ["none"]
    from engine.platforms.cpu_features import CpuIsaError

    params = []
    for name in ops.compiled_cpu_isas():
        try:
            ops.select_cpu_isa(name)
            params.append(name)
        except CpuIsaError as exc:
            params.append(pytest.param(name, marks=pytest.mark.skip(
                reason=f"{name} code path not run: {exc}")))
    ops.select_cpu_isa("auto")
    return params


@pytest.fixture(params=_isas(), autouse=True)
def isa(request):
    if request.param != "none":
        assert ops.select_cpu_isa(request.param) == request.param
    yield request.param
    if request.param != "none":
        ops.select_cpu_isa("auto")


@pytest.fixture(params=["vector", "amx"])
def tiles(request, isa):
    """A test with the vector kernels and, where this CPU has AMX, its tiles
    (int8_linear, bfloat16 prefill attention): pytestmark usefixtures("tiles")."""
    from engine.platforms import cpu_features

    amx = request.param == "amx"
    has = cpu_features.has_amx(cpu_features.current())
    if amx and not has:
        pytest.skip("AMX: this CPU has none (or VLLM_CPU_MAX_ISA hides it)")
    if ops.set_amx(amx) != amx:
        ops.set_amx(has)
        pytest.skip(f"AMX: the {isa} code path has no AMX kernels")
    yield request.param
    ops.set_amx(has)


def test_kernels_are_compiled():
    assert engine.BUILD_INFO.has_kernels, "engine has no compiled kernels; build it first"
    assert engine.BUILD_INFO.torch_version.split("+")[0] == torch.__version__.split("+")[0]


def test_op_list_is_what_the_extension_registers():
    """engine.ops.OP_NAMES (read by ci/smoke-test.sh) against csrc/torch_bindings.cpp's
    registrations: every _C op with a kernel for this build's device, no more, no less."""
    key = {"cpu": "CPU"}.get(engine.BUILD_INFO.device, "CUDA")
    registered = {name.split("::", 1)[1] for name in torch._C._dispatch_get_all_op_names()
                  if name.startswith("_C::")
                  and torch._C._dispatch_has_kernel_for_dispatch_key(name, key)}
    assert registered == set(ops.OP_NAMES) | set(ops.DEVICE_OP_NAMES.get(engine.BUILD_INFO.device, ()))


def close(a, b, dtype):
    torch.testing.assert_close(a.float(), b.float(), **TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,hidden", [(1, 1), (1, 17), (7, 128), (33, 4097), (3, 4096)])
def test_rms_norm(dtype, rows, hidden):
    g = torch.Generator().manual_seed(rows * hidden)
    x = torch.randn(rows, hidden, generator=g).to(dtype)
    w = torch.randn(hidden, generator=g).to(dtype)
    out, ref = torch.empty_like(x), torch.empty_like(x)
    ops.rms_norm(out, x, w, 1e-6)
    reference.rms_norm(ref, x, w, 1e-6)
    close(out, ref, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_strided_and_3d_input(dtype):
    x = torch.randn(4, 5, 2 * 96).to(dtype)[..., :96]  # non-contiguous rows
    w = torch.randn(96).to(dtype)
    out, ref = torch.empty(4, 5, 96, dtype=dtype), torch.empty(4, 5, 96, dtype=dtype)
    ops.rms_norm(out, x, w, 1e-5)
    reference.rms_norm(ref, x, w, 1e-5)
    close(out, ref, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,hidden", [(1, 3), (9, 257), (16, 4096)])
def test_fused_add_rms_norm(dtype, rows, hidden):
    g = torch.Generator().manual_seed(hidden)
    x = torch.randn(rows, hidden, generator=g).to(dtype)
    r = torch.randn(rows, hidden, generator=g).to(dtype)
    w = torch.randn(hidden, generator=g).to(dtype)
    x2, r2 = x.clone(), r.clone()
    ops.fused_add_rms_norm(x, r, w, 1e-6)
    reference.fused_add_rms_norm(x2, r2, w, 1e-6)
    close(r, r2, dtype)
    close(x, x2, dtype)


@pytest.mark.parametrize("hidden", [80, 83, 512])  # two-vector, one-vector and scalar stores
def test_bfloat16_rounding_is_torchs_bit_for_bit(hidden):
    """The residual fused_add_rms_norm stores is x + r rounded once, so it must
    equal torch's rounding of the float sum bit for bit, ties to even and
    denormals included (AVX512_BF16's one-instruction rounding flushes
    denormals, so vectors holding them must take the exact path), and NaN
    stays NaN."""
    g = torch.Generator().manual_seed(hidden)
    x = torch.randn(4, hidden, generator=g).bfloat16()
    r = torch.randn(4, hidden, generator=g).bfloat16()
    one, step = torch.tensor(1.0).bfloat16(), torch.tensor(2.0 ** -8).bfloat16()
    x[1, ::3], r[1, ::3] = one, step                         # 1 + 2^-8: a tie, rounds down to even
    x[1, 1::3], r[1, 1::3] = one + 2 * step, step            # a tie that rounds up to even
    x[2, ::5], r[2, ::5] = 1.5 * 2.0 ** -126, -(2.0 ** -126)  # the sum is a denormal
    x[2, 1::5] = torch.tensor([5], dtype=torch.int16).view(torch.bfloat16)  # a denormal input
    r[2, 1::5] = 0.0
    x[3, hidden // 2], x[3, hidden - 1], r[3, 7] = float("nan"), float("inf"), -float("inf")
    want = (x.float() + r.float()).bfloat16()
    w = torch.ones(hidden).bfloat16()
    ops.fused_add_rms_norm(x, r, w, 1e-6)
    nan = want.isnan()
    assert torch.equal(r.isnan(), nan)
    assert torch.equal(r.view(torch.int16)[~nan], want.view(torch.int16)[~nan])
    assert (want[2, ::5] != 0).all() and (want[2, ::5].abs() < 2.0 ** -126).all()  # denormals


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 2), (5, 2 * 17), (3, 4, 2 * 1000), (64, 2 * 5504)])
def test_silu_and_mul(dtype, shape):
    x = (torch.randn(*shape) * 4).to(dtype)
    x[..., 0] = -100.0  # far tail of exp
    out_shape = (*shape[:-1], shape[-1] // 2)
    out, ref = torch.empty(out_shape, dtype=dtype), torch.empty(out_shape, dtype=dtype)
    ops.silu_and_mul(out, x)
    reference.silu_and_mul(ref, x)
    close(out, ref, dtype)


def _cos_sin_cache(max_pos: int, rot_dim: int, dtype) -> torch.Tensor:
    inv = 1.0 / (10000 ** (torch.arange(0, rot_dim, 2).float() / rot_dim))
    freqs = torch.outer(torch.arange(max_pos).float(), inv)
    return torch.cat([freqs.cos(), freqs.sin()], -1).to(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("is_neox", [True, False])
@pytest.mark.parametrize("tokens,q_heads,k_heads,head_size,rot_dim",
                         [(1, 1, 1, 64, 64), (13, 8, 2, 80, 80), (7, 4, 4, 64, 32), (33, 3, 1, 36, 36)])
def test_rotary_embedding(dtype, is_neox, tokens, q_heads, k_heads, head_size, rot_dim):
    g = torch.Generator().manual_seed(tokens)
    cache = _cos_sin_cache(4096, rot_dim, dtype)
    pos = torch.randint(0, 4096, (tokens,), generator=g)
    q = torch.randn(tokens, q_heads * head_size, generator=g).to(dtype)
    k = torch.randn(tokens, k_heads, head_size, generator=g).to(dtype)  # 3-D layout
    q2, k2 = q.clone(), k.clone()
    ops.rotary_embedding(pos, q, k, head_size, cache, is_neox)
    reference.rotary_embedding(pos, q2, k2, head_size, cache, is_neox)
    close(q, q2, dtype)
    close(k, k2, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_rotary_embedding_views_of_qkv_and_batched_positions(dtype):
    heads, kv, hs, b, s = 4, 2, 64, 2, 5
    qkv = torch.randn(b, s, (heads + 2 * kv) * hs).to(dtype)
    q, k, _ = qkv.split([heads * hs, kv * hs, kv * hs], dim=-1)  # strided views
    pos = torch.randint(0, 100, (b, s))
    cache = _cos_sin_cache(100, hs, dtype)
    q2, k2 = q.clone(), k.clone()
    ops.rotary_embedding(pos, q, k, hs, cache, True)
    reference.rotary_embedding(pos, q2, k2, hs, cache, True)
    close(q, q2, dtype)
    close(k, k2, dtype)
    # key is optional, as upstream
    q3 = q2.clone()
    ops.rotary_embedding(pos, q2, None, hs, cache, True)
    reference.rotary_embedding(pos, q3, None, hs, cache, True)
    close(q2, q3, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_reshape_and_cache(dtype):
    blocks, kv_heads, bs, hs, tokens = 6, 3, 16, 40, 37
    g = torch.Generator().manual_seed(0)
    key = torch.randn(tokens, kv_heads, hs, generator=g).to(dtype)
    value = torch.randn(tokens, kv_heads, hs, generator=g).to(dtype)
    slots = torch.randperm(blocks * bs, generator=g)[:tokens]
    slots[::5] = -1  # padding tokens are not stored
    kc = torch.zeros(blocks, kv_heads, bs, hs, dtype=dtype)
    vc = torch.zeros_like(kc)
    kc2, vc2 = kc.clone(), vc.clone()
    ops.reshape_and_cache(key, value, kc, vc, slots)
    reference.reshape_and_cache(key, value, kc2, vc2, slots)
    assert torch.equal(kc, kc2) and torch.equal(vc, vc2)


def make_paged(seq_lens, heads, kv_heads, head_size, block_size, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    nblk = [math.ceil(n / block_size) for n in seq_lens]
    total = sum(nblk) + 3
    max_blocks = max(nblk + [1])
    kc = torch.randn(total, kv_heads, block_size, head_size, generator=g).to(dtype)
    vc = torch.randn(total, kv_heads, block_size, head_size, generator=g).to(dtype)
    perm = torch.randperm(total, generator=g).tolist()
    tables = torch.zeros(len(seq_lens), max_blocks, dtype=torch.int32)
    i = 0
    for s, n in enumerate(nblk):
        tables[s, :n] = torch.tensor(perm[i:i + n], dtype=torch.int32)
        i += n
    q = torch.randn(len(seq_lens), heads, head_size, generator=g).to(dtype)
    return q, kc, vc, tables, torch.tensor(seq_lens, dtype=torch.int32)


@pytest.mark.parametrize("dtype", DTYPES)
# gqa and head sizes: every group x vectors-a-head the key pass keeps in
# registers (1-4 and 6 heads of 2 or 4 AVX-512 vectors, 1-2 of 8), and the
# portable pass beyond them
@pytest.mark.parametrize("gqa", [1, 2, 3, 4, 6, 8])
@pytest.mark.parametrize("seq_lens,head_size,block_size",
                         [([1], 64, 16), ([5, 17, 100, 1, 33], 80, 16), ([300, 129, 2, 64], 128, 32),
                          ([7] * 20, 36, 32), ([40, 16, 3, 57], 32, 16)])
def test_paged_attention(dtype, gqa, seq_lens, head_size, block_size):
    kv_heads = 2
    q, kc, vc, tables, lens = make_paged(seq_lens, kv_heads * gqa, kv_heads, head_size,
                                         block_size, dtype, seed=len(seq_lens))
    scale = head_size ** -0.5
    out, ref = torch.empty_like(q), torch.empty_like(q)
    ops.paged_attention(out, q, kc, vc, tables, lens, scale)
    reference.paged_attention(ref, q.float(), kc.float(), vc.float(), tables, lens, scale)
    close(out, ref, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_paged_attention_reads_query_rows_where_they_lie(dtype):
    """The q part of a fused qkv output, read in place: equal to its copy."""
    heads, kv_heads, hs = 9, 3, 64
    q, kc, vc, tables, lens = make_paged([5, 40, 17, 64], heads, kv_heads, hs, 16, dtype)
    qkv = torch.randn(q.shape[0], (heads + 2 * kv_heads) * hs).to(dtype)
    qkv[:, :heads * hs] = q.reshape(q.shape[0], -1)
    in_place = qkv[:, :heads * hs].reshape(q.shape)
    assert not in_place.is_contiguous()
    out, want = torch.empty_like(q), torch.empty_like(q)
    ops.paged_attention(out, in_place, kc, vc, tables, lens, hs ** -0.5)
    ops.paged_attention(want, q, kc, vc, tables, lens, hs ** -0.5)
    assert torch.equal(out, want)


@pytest.mark.parametrize("layout", ["heads apart", "head_size strided"])
def test_paged_attention_copies_a_query_it_cannot_read_in_place(layout):
    """Rows whose heads lie apart, or whose values do, give the contiguous answer."""
    q, kc, vc, tables, lens = make_paged([5, 40, 17], 4, 2, 64, 16, torch.float32)
    odd = (q.transpose(0, 1).contiguous().transpose(0, 1) if layout == "heads apart"
           else torch.stack([q, q], -1)[..., 0])
    assert odd.stride() != q.stride() and torch.equal(odd, q)
    out, want = torch.empty_like(q), torch.empty_like(q)
    ops.paged_attention(out, odd, kc, vc, tables, lens, 0.125)
    ops.paged_attention(want, q, kc, vc, tables, lens, 0.125)
    assert torch.equal(out, want)


def test_paged_attention_empty_sequence_gives_zeros():
    q, kc, vc, tables, lens = make_paged([0, 5], 4, 2, 64, 16, torch.float32)
    out = torch.full_like(q, float("nan"))
    ops.paged_attention(out, q, kc, vc, tables, lens, 0.125)
    assert torch.equal(out[0], torch.zeros_like(out[0]))
    assert torch.isfinite(out[1]).all()


# ---- bad input: a clear Python exception, never an out-of-bounds access -------


def _attn_args():
    q, kc, vc, tables, lens = make_paged([20, 9], 4, 2, 64, 16, torch.float32)
    return [torch.empty_like(q), q, kc, vc, tables, lens, 0.125]


@pytest.mark.parametrize("mutate,exc,match", [
    (lambda a: a.__setitem__(4, a[4].clone().fill_(99)), IndexError, "points outside the cache"),
    (lambda a: a.__setitem__(4, a[4].clone().fill_(-1)), IndexError, "points outside the cache"),
    (lambda a: a.__setitem__(5, torch.tensor([20, 33], dtype=torch.int32)), IndexError, "seq_lens .must fit"),
    (lambda a: a.__setitem__(5, a[5].long()), TypeError, "seq_lens must have dtype Int"),
    (lambda a: a.__setitem__(1, a[1].to(torch.float16)), TypeError, "float16|Half"),
    (lambda a: a.__setitem__(2, a[2].to(torch.bfloat16)), TypeError, "must match"),
    (lambda a: a.__setitem__(1, a[1][:, :3]), ValueError, "multiple of the cache's num_kv_heads|query"),
    (lambda a: a.__setitem__(1, a[1][0]), ValueError, "query must be"),
    (lambda a: a.__setitem__(0, a[0][:1]), ValueError, "out must be"),
    (lambda a: a.__setitem__(3, a[3][:, :1]), ValueError, "value_cache has shape"),
])
def test_paged_attention_rejects_bad_input(mutate, exc, match):
    args = _attn_args()
    mutate(args)
    with pytest.raises(exc, match=match):
        ops.paged_attention(*args)


def test_bad_input_messages_for_other_ops():
    x = torch.randn(4, 8)
    with pytest.raises(TypeError, match="dtype Int"):
        ops.rms_norm(torch.empty(4, 8), x.int(), torch.randn(8), 1e-6)
    with pytest.raises(ValueError, match="weight must be a contiguous 1-D tensor of size 8"):
        ops.rms_norm(torch.empty(4, 8), x, torch.randn(7), 1e-6)
    with pytest.raises(ValueError, match="result has shape"):
        ops.rms_norm(torch.empty(4, 9), x, torch.randn(8), 1e-6)
    with pytest.raises(ValueError, match="residual has shape"):
        ops.fused_add_rms_norm(x, torch.randn(3, 8), torch.randn(8), 1e-6)
    with pytest.raises(ValueError, match="must be even"):
        ops.silu_and_mul(torch.empty(4, 3), torch.randn(4, 7))
    with pytest.raises(ValueError, match="result must have shape"):
        ops.silu_and_mul(torch.empty(4, 3), torch.randn(4, 8))
    cache = _cos_sin_cache(10, 8, torch.float32)
    with pytest.raises(IndexError, match=r"positions \(rows of cos_sin_cache"):
        ops.rotary_embedding(torch.tensor([3, 10]), torch.randn(2, 8), None, 8, cache, True)
    with pytest.raises(ValueError, match="not a multiple of head_size"):
        ops.rotary_embedding(torch.tensor([3, 1]), torch.randn(2, 12), None, 8, cache, True)
    with pytest.raises(TypeError, match="positions must have dtype int64"):
        ops.rotary_embedding(torch.tensor([3, 1], dtype=torch.int32), torch.randn(2, 8), None, 8,
                             cache, True)
    kc = torch.zeros(2, 1, 4, 8)
    with pytest.raises(IndexError, match="slot_mapping entries"):
        ops.reshape_and_cache(torch.randn(2, 1, 8), torch.randn(2, 1, 8), kc, kc.clone(),
                              torch.tensor([0, 8]))
    with pytest.raises(ValueError, match="key must be"):
        ops.reshape_and_cache(torch.randn(2, 2, 8), torch.randn(2, 2, 8), kc, kc.clone(),
                              torch.tensor([0, 1]))


# Weight layouts: k-major for both dtypes, and k pairs (AVX512_BF16) for bfloat16.
LINEAR_LAYOUTS = [pytest.param(torch.float32, 1, id="float32-k-major"),
                  pytest.param(torch.bfloat16, 1, id="bfloat16-k-major"),
                  pytest.param(torch.bfloat16, 2, id="bfloat16-k-pairs")]


@pytest.mark.parametrize("dtype,k_pack", LINEAR_LAYOUTS)
@pytest.mark.parametrize("m,k,n,bias", [
    (1, 7, 5, False),        # one row, a lone partial panel
    (3, 128, 2006, True),    # a partial last panel (a vocabulary)
    (16, 512, 96, False),    # the largest decode tile
    (17, 33, 100, True),     # the first prefill-shaped call, odd K
    (40, 256, 48, False),    # an odd number of panels: the lone-panel tile
    (600, 2048, 40, True),   # rows of x in several cache blocks (kBlockBytes), a ragged last
])
def test_linear(isa, dtype, m, k, n, bias, k_pack):
    if isa == "none" or not ops.has_panel_linear():
        pytest.skip(f"the {isa} code path has no panel linear kernel (torch's linear runs)")
    if k_pack == 2 and ops.panel_k_pack(dtype) != 2:
        pytest.skip(f"the k-pair layout not run: it is the avx512_bf16 code path's, and "
                    f"the {isa} path reads k-major (it refuses pairs: tested below)")
    from engine.model_executor.layers.linear import pack_panels

    g = torch.Generator().manual_seed(m * k + n)
    x = torch.randn(m, k, generator=g).to(dtype)
    w = (torch.randn(n, k, generator=g) / k ** 0.5).to(dtype)
    b = torch.randn(n, generator=g).to(dtype) if bias else None
    packed = pack_panels(w, k_pack)
    out, want = torch.empty(m, n, dtype=dtype), torch.empty(m, n, dtype=dtype)
    ops.linear(out, x, packed, b)
    reference.linear(want, x, packed, b)
    close(out, want, dtype)
    # the reference itself is F.linear on the unpacked weight
    close(want, torch.nn.functional.linear(x.float(), w.float(), None if b is None else b.float()),
          dtype)


def test_linear_refuses_a_weight_that_does_not_fit(isa):
    if isa == "none" or not ops.has_panel_linear():
        pytest.skip(f"the {isa} code path has no panel linear kernel")
    from engine.model_executor.layers.linear import pack_panels

    packed = pack_panels(torch.randn(40, 8))
    with pytest.raises(ValueError, match="out has 50 columns but packed_weight holds 48"):
        ops.linear(torch.empty(2, 50), torch.randn(2, 8), packed, None)
    with pytest.raises(ValueError, match=r"packed_weight must be contiguous \[ceil\(N/16\), 9, 16\]"):
        ops.linear(torch.empty(2, 40), torch.randn(2, 9), packed, None)
    pairs = pack_panels(torch.randn(40, 8), k_pack=2)
    with pytest.raises(ValueError, match="k pairs is bfloat16 only"):
        ops.linear(torch.empty(2, 40), torch.randn(2, 8), pairs, None)


def test_linear_refuses_pairs_where_the_cpu_lacks_avx512_bf16(isa):
    """A weight packed in k pairs on a code path without AVX512_BF16 (here: any
    path but avx512_bf16) is refused in one line, never misread."""
    if isa == "none" or not ops.has_panel_linear():
        pytest.skip(f"the {isa} code path has no panel linear kernel")
    if ops.has_bf16_pair_linear():
        pytest.skip(f"the {isa} code path runs the AVX512_BF16 pair kernel on this CPU")
    from engine.model_executor.layers.linear import pack_panels

    pairs = pack_panels(torch.randn(40, 8).bfloat16(), k_pack=2)
    with pytest.raises(RuntimeError, match="packed in k pairs for AVX512_BF16"):
        ops.linear(torch.empty(2, 40, dtype=torch.bfloat16), torch.randn(2, 8).bfloat16(),
                   pairs, None)
