"""paged_prefill_attention (csrc/cpu/prefill_attention_impl.h) against its torch
reference (engine.reference), on every compiled CPU code path this processor
runs (the isa fixture of test_ops.py): GQA 1/2/4/8, block boundaries, ragged
batches, cached prefixes (seq_lens > query count), sliding windows, head sizes
on the vector path and off it, float32 and bfloat16."""
from __future__ import annotations

import math

import pytest
import torch

from engine import ops, reference
from test_ops import TOL, isa, tiles  # noqa: F401  (isa: the autouse per-code-path fixture)

DTYPES = [torch.float32, torch.bfloat16]
# bfloat16 also with AMX tiles where the CPU has them (csrc/cpu/prefill_attention_amx.h)
pytestmark = pytest.mark.usefixtures("tiles")


def make_prefill(q_lens, seq_lens, heads, kv_heads, head_size, block_size, dtype, seed=0):
    """Random caches holding every sequence's seq_lens[b] tokens in shuffled blocks,
    and the queries of its last q_lens[b] tokens."""
    g = torch.Generator().manual_seed(seed)
    nblk = [math.ceil(n / block_size) for n in seq_lens]
    total = sum(nblk) + 2
    kc = torch.randn(total, kv_heads, block_size, head_size, generator=g).to(dtype)
    vc = torch.randn(total, kv_heads, block_size, head_size, generator=g).to(dtype)
    perm = torch.randperm(total, generator=g).tolist()
    tables = torch.zeros(len(seq_lens), max(nblk + [1]) + 1, dtype=torch.int32)
    i = 0
    for s, n in enumerate(nblk):
        tables[s, :n] = torch.tensor(perm[i:i + n], dtype=torch.int32)
        i += n
    starts = torch.tensor([0] + q_lens, dtype=torch.int32).cumsum(0).to(torch.int32)
    q = torch.randn(sum(q_lens), heads, head_size, generator=g).to(dtype)
    return q, kc, vc, tables, starts, torch.tensor(seq_lens, dtype=torch.int32)


def check(q_lens, seq_lens, gqa, head_size, block_size, dtype, window=-1, kv_heads=2):
    q, kc, vc, tables, starts, lens = make_prefill(
        q_lens, seq_lens, kv_heads * gqa, kv_heads, head_size, block_size, dtype,
        seed=len(q_lens) + gqa)
    scale = head_size ** -0.5
    out = torch.full_like(q, float("nan"))
    ref = torch.empty(q.shape, dtype=torch.float32)
    ops.paged_prefill_attention(out, q, kc, vc, tables, starts, lens, scale, window)
    reference.paged_prefill_attention(ref, q, kc, vc, tables, starts, lens, scale, window)
    torch.testing.assert_close(out.float(), ref, **TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("gqa", [1, 2, 4, 8])
@pytest.mark.parametrize("q_lens,seq_lens,head_size,block_size", [
    ([1], [1], 64, 16),                            # one token
    ([37], [37], 64, 16),                          # a fresh prompt across block boundaries
    ([16, 33, 5, 70], [16, 33, 5, 70], 80, 16),    # ragged batch, a block exactly full
    ([20, 3, 1], [52, 40, 9], 128, 32),            # cached prefixes (chunked prefill)
    ([9, 12], [9, 30], 36, 8),                     # head size off the vector path
])
def test_matches_reference(dtype, gqa, q_lens, seq_lens, head_size, block_size):
    check(q_lens, seq_lens, gqa, head_size, block_size, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("window", [1, 5, 16, 40])
def test_sliding_window(dtype, window):
    check([45, 7], [45, 60], 4, 64, 16, dtype, window=window)


def test_long_prompt_float32():
    """Many key tiles and query tiles: the online softmax's rescaling is exercised."""
    check([300], [300], 2, 64, 16, torch.float32)


@pytest.mark.parametrize("gqa,head_size", [(1, 128), (16, 64), (3, 256)])
def test_long_prompt_bfloat16(gqa, head_size):
    check([300, 41], [300, 90], gqa, head_size, 16, torch.bfloat16, kv_heads=1)


def test_bfloat16_error_is_about_the_rounding_of_the_answer():
    """Beyond the tolerance, which a slightly wrong exponential passes: the RMS
    error of a bfloat16 answer stays near that of rounding the exact answer to
    bfloat16 (1.06x with AMX; a first-order term off by 3% gave 2.07x)."""
    q, kc, vc, tables, starts, lens = make_prefill([300], [300], 6, 2, 64, 16, torch.bfloat16,
                                                   seed=5)
    q = q * 3  # scores over several units: the exponential's whole range counts
    out, ref = torch.empty_like(q), torch.empty(q.shape, dtype=torch.float32)
    ops.paged_prefill_attention(out, q, kc, vc, tables, starts, lens, 64 ** -0.5, -1)
    reference.paged_prefill_attention(ref, q, kc, vc, tables, starts, lens, 64 ** -0.5, -1)

    def rms(x):
        return x.pow(2).mean().sqrt().item()

    rounding = rms(ref.to(torch.bfloat16).float() - ref)
    assert rms(out.float() - ref) < 1.5 * rounding


def test_a_sequence_without_queries_is_skipped():
    check([5, 0, 3], [5, 12, 3], 1, 64, 16, torch.float32)


def _args():
    q, kc, vc, tables, starts, lens = make_prefill([4, 6], [10, 6], 4, 2, 64, 16, torch.float32)
    return [torch.empty_like(q), q, kc, vc, tables, starts, lens, 0.125, -1]


@pytest.mark.parametrize("mutate,exc,match", [
    (lambda a: a.__setitem__(6, torch.tensor([3, 6], dtype=torch.int32)), ValueError,
     "only 3 tokens"),
    (lambda a: a.__setitem__(5, torch.tensor([0, 4, 9], dtype=torch.int32)), ValueError,
     "end at the number of query tokens"),
    (lambda a: a.__setitem__(5, torch.tensor([0, 4], dtype=torch.int32)), ValueError,
     "query_start_loc 3 entries"),
    (lambda a: a.__setitem__(5, a[5].long()), TypeError, "query_start_loc must have dtype Int"),
    (lambda a: a.__setitem__(4, a[4].clone().fill_(99)), IndexError, "points outside the cache"),
    (lambda a: a.__setitem__(8, 0), ValueError, "sliding_window must be -1"),
    (lambda a: a.__setitem__(1, a[1][:, :3]), ValueError, "multiple of the cache's num_kv_heads|query"),
    (lambda a: a.__setitem__(0, a[0][:1]), ValueError, "out must be"),
])
def test_rejects_bad_input(isa, mutate, exc, match):  # noqa: F811
    if isa == "none" or not ops.has_paged_prefill_attention():
        pytest.skip(f"the {isa} code path runs the torch reference, which does not validate")
    args = _args()
    mutate(args)
    with pytest.raises(exc, match=match):
        ops.paged_prefill_attention(*args)
