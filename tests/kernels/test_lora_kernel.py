"""The LoRA kernel (ops.lora_add, punica's bgmv: each token against its own
slot's A and B, -1 tokens skipped, padded ranks ignored) against a float64
reference on every compiled CPU code path this CPU can run, float32 and
bfloat16; engine.reference's against the same; and the glue's refusals."""
from __future__ import annotations

import pytest
import torch
from test_ops import isa  # noqa: F401  (every test on each code path)

from engine import ops, reference

pytestmark = pytest.mark.skipif(not ops.has_lora_kernel(), reason="no CPU kernels in this build")


def _case(tokens, k, slices, slots, max_rank, ranks, dtype, seed=0):
    """x, A [slots, slices, max_rank, k] and Bt [slots, max_rank, n] with zero
    padding past each slot's rank (garbage past it where `ranks` says less:
    the kernel must not read it), token slots mixed with -1."""
    g = torch.Generator().manual_seed(seed)
    n = sum(slices)
    x = torch.randn(tokens, k, generator=g).to(dtype)
    a = torch.randn(slots, len(slices), max_rank, k, generator=g).to(dtype)
    bt = (torch.randn(slots, max_rank, n, generator=g) * 0.1).to(dtype)
    token_slot = torch.randint(-1, slots, (tokens,), generator=g, dtype=torch.int32)
    token_slot[0] = -1
    token_slot[-1] = slots - 1
    return x, a, bt, token_slot, torch.tensor(ranks, dtype=torch.int32)


def _expected(out0, x, a, bt, token_slot, ranks, bounds):
    """float64: out0 plus each token's own slot's term, the slot's rank only."""
    out = out0.double().clone()
    for t, s in enumerate(token_slot.tolist()):
        if s < 0:
            continue
        r = int(ranks[s])
        for j, (lo, hi) in enumerate(zip(bounds, bounds[1:])):
            h = a[s, j, :r].double() @ x[t].double()
            out[t, lo:hi] += h @ bt[s, :r, lo:hi].double()
    return out


# one token and many (past the threading threshold), K and slices odd and past
# the 64-column block, ranks under max_rank (one 0: a slot not adapting the
# layer), one slice and three (q/k/v), two (gate/up)
@pytest.mark.parametrize("tokens,k,slices,max_rank,ranks", [
    (1, 64, (64,), 8, [8, 4]),
    (5, 97, (33, 17, 17), 16, [16, 3, 0, 9]),
    (16, 512, (512, 128, 128), 16, [16, 16, 16, 16]),
    (13, 130, (200, 200), 7, [7, 5, 1]),
    (64, 1376, (512,), 16, [16, 13, 16, 2]),
])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_matches_float_reference(tokens, k, slices, max_rank, ranks, dtype):
    slots = len(ranks)
    x, a, bt, token_slot, r = _case(tokens, k, slices, slots, max_rank, ranks, dtype)
    for s, rank in enumerate(ranks):  # past a slot's rank: must be skipped, not read as zeros
        a[s, :, rank:] = 1e4
        bt[s, rank:] = 1e4
    bounds = [sum(slices[:j]) for j in range(len(slices) + 1)]
    out0 = torch.randn(tokens, bounds[-1], generator=torch.Generator().manual_seed(2)).to(dtype)
    want = _expected(out0, x, a, bt, token_slot, r, bounds)
    for fn in (ops.lora_add, reference.lora_add):
        out = out0.clone()
        fn(out, x, a, bt, token_slot, r, bounds)
        base = token_slot < 0
        assert torch.equal(out[base], out0[base]), f"{fn.__module__}: a base token changed"
        # float32: the sums' order; bfloat16: out rounded once (A and x exact in both)
        tol = dict(atol=1e-3, rtol=1e-4) if dtype == torch.float32 else \
            dict(atol=2e-2, rtol=8e-3)
        torch.testing.assert_close(out.double(), want, **tol, msg=fn.__module__)


def test_strided_rows():
    """input and out as row views of wider tensors (a fused q/k/v output)."""
    x, a, bt, token_slot, r = _case(6, 40, (24, 8), 2, 4, [4, 2], torch.float32)
    xs = torch.zeros(6, 50)
    xs[:, 3:43] = x
    wide = torch.zeros(6, 40)
    out = wide[:, 5:37]
    ops.lora_add(out, xs[:, 3:43], a, bt, token_slot, r, [0, 24, 32])
    want = _expected(torch.zeros(6, 32), x, a, bt, token_slot, r, [0, 24, 32])
    torch.testing.assert_close(out.double(), want, atol=1e-4, rtol=1e-5)
    assert not wide[:, :5].any() and not wide[:, 37:].any()


@pytest.mark.parametrize("change,match", [
    (dict(token_slot=torch.tensor([0, 2], dtype=torch.int32)), "token_slot values"),
    (dict(token_slot=torch.tensor([0, -2], dtype=torch.int32)), "token_slot values"),
    (dict(token_slot=torch.tensor([0, 1])), "token_slot must have dtype"),
    (dict(ranks=torch.tensor([4, 5], dtype=torch.int32)), "ranks"),
    (dict(bounds=[0, 8, 12]), "bounds must run"),
    (dict(bounds=[0, 12, 8, 16]), "must not decrease"),
    (dict(lora_bt=torch.zeros(2, 4, 20)), "lora_bt must be"),
    (dict(lora_a=torch.zeros(2, 1, 4, 10)), "lora_a must be"),
])
def test_refuses(change, match):
    args = dict(out=torch.zeros(2, 16), input=torch.zeros(2, 10), lora_a=torch.zeros(2, 2, 4, 10),
                lora_bt=torch.zeros(2, 4, 16), token_slot=torch.tensor([0, 1], dtype=torch.int32),
                ranks=torch.tensor([4, 2], dtype=torch.int32), bounds=[0, 8, 16])
    args.update(change)
    with pytest.raises((ValueError, TypeError, IndexError), match=match):
        ops.lora_add(*args.values())
