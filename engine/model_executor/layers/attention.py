"""Attention over the paged KV cache: new keys/values are stored with
reshape_and_cache; prefill attends with torch's SDPA over each sequence's own
tokens, decode with the paged_attention kernel."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine import ops
from engine.forward_context import get_context


class Attention(nn.Module):
    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.scale = head_dim ** -0.5
        self.k_cache = self.v_cache = torch.empty(0)  # set by the model runner

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        ctx = get_context()
        tokens = q.shape[0]
        q = q.reshape(tokens, self.num_heads, self.head_dim)
        k = k.view(tokens, self.num_kv_heads, self.head_dim)
        v = v.view(tokens, self.num_kv_heads, self.head_dim)
        if self.k_cache.numel():
            ops.reshape_and_cache(k, v, self.k_cache, self.v_cache, ctx.slot_mapping)
        if ctx.is_prefill:
            out = torch.empty_like(q)
            gqa = self.num_heads != self.num_kv_heads
            for start, end in zip(ctx.cu_seqlens[:-1], ctx.cu_seqlens[1:]):
                o = F.scaled_dot_product_attention(
                    q[start:end].transpose(0, 1), k[start:end].transpose(0, 1),
                    v[start:end].transpose(0, 1), is_causal=True, scale=self.scale,
                    enable_gqa=gqa)
                out[start:end] = o.transpose(0, 1)
        else:
            out = torch.empty_like(q)
            ops.paged_attention(out, q.contiguous(), self.k_cache, self.v_cache,
                                ctx.block_tables, ctx.seq_lens, self.scale)
        return out.view(tokens, self.num_heads * self.head_dim)
