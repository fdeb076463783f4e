"""The fused MoE kernel against engine.reference.grouped_moe on every compiled
CPU code path this CPU can run (fp32, bf16, bf16 k pairs on avx512_bf16), the
reference against a per-token loop, and the router against transformers'."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from test_ops import isa  # noqa: F401  (autouse: every test on each code path)

from engine import ops, reference
from engine.model_executor.layers.fused_moe import pack_experts, select_experts

pytestmark = pytest.mark.skipif(not ops.has_fused_moe(),
                                reason="no fused MoE kernel in this build / on this CPU")


def _case(t, h, i, e, k, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(t, h, generator=g).to(dtype)
    w13 = (torch.randn(e, 2 * i, h, generator=g) * 0.2).to(dtype)
    w2 = (torch.randn(e, h, i, generator=g) * 0.2).to(dtype)
    weights, ids = select_experts(torch.randn(t, e, generator=g), k, True)
    return x, w13, w2, weights, ids


def _kernel(x, w13, w2, weights, ids):
    kp = ops.panel_k_pack(x.dtype)
    out = torch.empty_like(x)
    ops.fused_moe(out, x, pack_experts(w13, kp), pack_experts(w2, kp), weights, ids,
                  w2.shape[2])
    return out


def _reference(x, w13, w2, weights, ids):
    ref = torch.empty_like(x)
    reference.grouped_moe(ref, x, w13, w2, weights, ids)
    return ref


# tokens: one (decode), a few rows per expert (the decode tile), more than 16
# rows per expert (the prefill tiles), past the 512-token chunk; odd hidden and
# intermediate sizes (partial panels, an odd k for the bf16 pairs)
@pytest.mark.parametrize("t,h,i,e,k", [(1, 64, 32, 4, 2), (5, 64, 48, 8, 2), (40, 96, 40, 8, 3),
                                       (600, 48, 32, 4, 2), (3, 33, 17, 5, 2), (7, 64, 64, 16, 1)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_moe_matches_reference(t, h, i, e, k, dtype):
    case = _case(t, h, i, e, k, dtype)
    out, ref = _kernel(*case), _reference(*case)
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(out.float(), ref.float(), **tol)


def test_unused_experts_are_never_read():
    """NaN weights of an expert no token picks change nothing."""
    x, w13, w2, weights, _ = _case(6, 64, 32, 6, 2, torch.float32)
    ids = torch.tensor([[0, 1], [1, 2], [2, 0], [0, 2], [1, 0], [2, 1]], dtype=torch.int32)
    want = _kernel(x, w13, w2, weights, ids)
    w13[4:], w2[4:] = float("nan"), float("nan")
    assert torch.equal(_kernel(x, w13, w2, weights, ids), want)


def test_expert_out_of_range_is_refused():
    x, w13, w2, weights, ids = _case(2, 32, 16, 4, 2, torch.float32)
    ids[1, 0] = 4
    with pytest.raises(IndexError, match=r"topk_ids \(experts\) range over \[\d, 4\] but must "
                                         r"lie in \[0, 4\)"):
        _kernel(x, w13, w2, weights, ids)


def test_misshapen_experts_are_refused():
    x, w13, w2, weights, ids = _case(2, 32, 16, 4, 2, torch.float32)
    with pytest.raises(ValueError, match="w2 must be contiguous"):
        torch.ops._C.fused_moe(torch.empty_like(x), x, pack_experts(w13, 1),
                               pack_experts(w13, 1), weights, ids, 16)


def test_reference_is_the_per_token_sum():
    """grouped_moe itself, against the plain definition token by token."""
    x, w13, w2, weights, ids = _case(9, 24, 12, 5, 2, torch.float32)
    want = torch.zeros_like(x)
    for t in range(9):
        for j in range(2):
            gate, up = (w13[ids[t, j]] @ x[t]).chunk(2)
            want[t] += weights[t, j] * (w2[ids[t, j]] @ (F.silu(gate) * up))
    torch.testing.assert_close(_reference(x, w13, w2, weights, ids), want)


@pytest.mark.parametrize("renormalize", [False, True])
def test_router_matches_transformers(renormalize):
    import transformers
    from transformers.models.qwen2_moe.modeling_qwen2_moe import Qwen2MoeTopKRouter

    cfg = transformers.Qwen2MoeConfig(hidden_size=32, num_experts=8, num_experts_per_tok=3,
                                      norm_topk_prob=renormalize)
    router = Qwen2MoeTopKRouter(cfg)
    torch.nn.init.normal_(router.weight)
    x = torch.randn(10, 32)
    _, want_w, want_ids = router(x)
    weights, ids = select_experts(F.linear(x, router.weight), 3, renormalize)
    assert torch.equal(ids.long(), want_ids)
    torch.testing.assert_close(weights, want_w.float())
