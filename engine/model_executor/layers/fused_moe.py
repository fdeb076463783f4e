"""Mixture-of-experts MLP: the router's top-k choice (select_experts) and the
experts themselves (FusedMoE), run as one op over every row of the batch,
grouped by expert (engine.ops.fused_moe, csrc/cpu/moe_impl.h)."""
from __future__ import annotations

import dataclasses

import torch
from torch import nn

from engine import ops, reference
from engine.config import ModelConfig
from engine.model_executor.layers.linear import pack_panels
from engine.platforms import cpu_features, cpu_hugepages


@dataclasses.dataclass(frozen=True)
class MoeShape:
    """A config's mixture of experts (Mixtral, Qwen2-MoE, Qwen3-MoE)."""

    MODEL_TYPES = ("mixtral", "qwen2_moe", "qwen3_moe")
    num_experts: int
    top_k: int
    intermediate: int  # each expert's, whole (before tensor parallel)
    renormalize: bool
    shared_intermediate: int  # 0: no shared expert

    @classmethod
    def of(cls, c: ModelConfig) -> MoeShape:
        hf = c.hf
        experts = hf.get("num_local_experts") or hf.get("num_experts") or 0
        if c.model_type == "mixtral":
            return cls(experts, hf["num_experts_per_tok"], hf["intermediate_size"], True, 0)
        shared = hf.get("shared_expert_intermediate_size", 0) if c.model_type == "qwen2_moe" else 0
        return cls(experts, hf["num_experts_per_tok"], hf["moe_intermediate_size"],
                   bool(hf.get("norm_topk_prob", False)), shared or 0)

    def sparse(self, c: ModelConfig, index: int) -> bool:
        """Whether layer `index` routes to experts (else a dense MLP)."""
        if c.model_type == "mixtral":
            return True
        step = c.hf.get("decoder_sparse_step", 1) or 1
        return (index not in (c.hf.get("mlp_only_layers") or []) and self.num_experts > 0
                and (index + 1) % step == 0)


def select_experts(router_logits: torch.Tensor, top_k: int,
                   renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights float32, ids int32), both [tokens, top_k]: softmax over the
    experts in float32, the top_k kept, rescaled to sum to one if asked
    (Mixtral always, Qwen MoE with norm_topk_prob), as transformers does."""
    probs = torch.softmax(router_logits, dim=-1, dtype=torch.float32)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, ids.to(torch.int32)


def pack_experts(w: torch.Tensor, k_pack: int) -> torch.Tensor:
    """[E, N, K] -> [E, ceil(N/16), ceil(K/kp), 16 * kp]: each expert's weight as
    linear.pack_panels lays it out, experts back to back."""
    first = pack_panels(w[0], k_pack)
    out = cpu_hugepages.empty((w.shape[0], *first.shape), w.dtype)  # streamed every step
    out[0] = first
    for e in range(1, w.shape[0]):
        out[e] = pack_panels(w[e], k_pack)
    return out


class FusedMoE(nn.Module):
    """num_experts gate/up/down MLPs of `intermediate` columns. Checkpoints hold
    each expert's projections apart; they load as parts of two parameters (the
    loader's shard_sizes): w13 [E * 2I, H] (expert e's gate, then its up) and
    w2 [E * H, I]."""

    def __init__(self, num_experts: int, hidden: int, intermediate: int, dtype: torch.dtype):
        super().__init__()
        self.num_experts, self.hidden, self.intermediate = num_experts, hidden, intermediate
        # None once packed (prepare); shard_sizes: an attribute of ours on the Parameter
        self.w13: nn.Parameter | None = nn.Parameter(
            torch.empty(num_experts * 2 * intermediate, hidden, dtype=dtype), requires_grad=False)
        setattr(self.w13, "shard_sizes", (intermediate,) * (2 * num_experts))
        self.w2: nn.Parameter | None = nn.Parameter(
            torch.empty(num_experts * hidden, intermediate, dtype=dtype), requires_grad=False)
        setattr(self.w2, "shard_sizes", (hidden,) * num_experts)
        self.w13_packed: torch.Tensor | None = None
        self.w2_packed: torch.Tensor | None = None

    def prepare(self, mode: str) -> None:
        """Pack the experts for the kernel where linear layers use panels and the
        code path has it; otherwise keep the plain weights for the torch path."""
        if mode != cpu_features.PANELS or not ops.has_fused_moe():
            return
        assert self.w13 is not None and self.w2 is not None, "the experts are packed once"
        kp = ops.panel_k_pack(self.w13.dtype)
        e, i, h = self.num_experts, self.intermediate, self.hidden
        self.w13_packed = pack_experts(self.w13.data.view(e, 2 * i, h), kp)
        self.w2_packed = pack_experts(self.w2.data.view(e, h, i), kp)
        del self.w13, self.w2
        self.w13 = self.w2 = None

    def forward(self, x: torch.Tensor, topk_weights: torch.Tensor,
                topk_ids: torch.Tensor) -> torch.Tensor:
        x2 = x.reshape(-1, self.hidden)
        if x2.stride(-1) != 1:
            x2 = x2.contiguous()
        out = torch.empty_like(x2)
        if self.w13_packed is not None and self.w2_packed is not None:  # packed together
            ops.fused_moe(out, x2, self.w13_packed, self.w2_packed, topk_weights, topk_ids,
                          self.intermediate)
        else:
            assert self.w13 is not None and self.w2 is not None, "unpacked: the plain weights"
            e, i, h = self.num_experts, self.intermediate, self.hidden
            reference.grouped_moe(out, x2, self.w13.view(e, 2 * i, h), self.w2.view(e, h, i),
                                  topk_weights, topk_ids)
        return out.view(x.shape)
