"""Attention over the paged KV cache: new keys/values are stored with
reshape_and_cache; prefill attends with torch's SDPA over each sequence's own
tokens, decode with the paged_attention kernel.

A sliding window (Gemma's local layers) or logit soft-capping (Gemma 2) is
computed in torch, prefill and decode alike (engine.model_executor.layers.
windowed_attention): the paged_attention kernel takes neither yet."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine import ops
from engine.forward_context import get_context
from engine.model_executor.layers import windowed_attention


class Attention(nn.Module):
    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int,
                 scale: float | None = None, sliding_window: int | None = None,
                 softcap: float | None = None):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.scale = head_dim ** -0.5 if scale is None else scale
        self.sliding_window, self.softcap = sliding_window, softcap
        self.k_cache = self.v_cache = torch.empty(0)  # set by the model runner

    def _in_torch(self, longest: int) -> bool:
        """Whether a window or cap changes the result (a window shorter than every
        sequence changes nothing: the fast path serves those)."""
        window = self.sliding_window is not None and longest > self.sliding_window
        return window or self.softcap is not None

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        ctx = get_context()
        tokens = q.shape[0]
        q = q.reshape(tokens, self.num_heads, self.head_dim)
        k = k.reshape(tokens, self.num_kv_heads, self.head_dim)
        v = v.reshape(tokens, self.num_kv_heads, self.head_dim)
        if self.k_cache.numel():
            ops.reshape_and_cache(k, v, self.k_cache, self.v_cache, ctx.slot_mapping)
        out = torch.empty_like(q)
        if ctx.is_prefill:
            gqa = self.num_heads != self.num_kv_heads
            for start, end in zip(ctx.cu_seqlens[:-1], ctx.cu_seqlens[1:]):
                if self._in_torch(end - start):
                    out[start:end] = windowed_attention.attend(
                        q[start:end], k[start:end], v[start:end], self.scale,
                        self.sliding_window, self.softcap)
                    continue
                o = F.scaled_dot_product_attention(
                    q[start:end].transpose(0, 1), k[start:end].transpose(0, 1),
                    v[start:end].transpose(0, 1), is_causal=True, scale=self.scale,
                    enable_gqa=gqa)
                out[start:end] = o.transpose(0, 1)
        elif self._in_torch(int(ctx.seq_lens.max())):
            windowed_attention.decode(out, q, self.k_cache, self.v_cache, ctx.block_tables,
                                      ctx.seq_lens, self.scale, self.sliding_window, self.softcap)
        else:
            ops.paged_attention(out, q.contiguous(), self.k_cache, self.v_cache,
                                ctx.block_tables, ctx.seq_lens, self.scale)
        return out.view(tokens, self.num_heads * self.head_dim)
