"""Attention over the paged KV cache: new keys/values are stored with
reshape_and_cache first; prefill then attends with the paged_prefill_attention
kernel over the cache (so a prompt whose prefix is already cached, or one run
in chunks, reads the same blocks), sliding windows included; decode with
paged_attention. VLLM_PREFILL_ATTENTION=sdpa keeps the old prefill: torch's
SDPA over each prompt's own keys.

A sliding window in decode runs on the prefill kernel too (one query a
sequence). Logit soft-capping (Gemma 2) is computed in torch
(engine.model_executor.layers.windowed_attention): no kernel takes it yet."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine import envs, ops
from engine.forward_context import ForwardContext, get_context
from engine.model_executor.layers import encoder_attention, windowed_attention


class Attention(nn.Module):
    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int,
                 scale: float | None = None, sliding_window: int | None = None,
                 softcap: float | None = None):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.scale = head_dim ** -0.5 if scale is None else scale
        self.sliding_window, self.softcap = sliding_window, softcap
        self.k_cache = self.v_cache = torch.empty(0)  # set by the model runner
        self.sdpa_prefill = envs.prefill_attention() == "sdpa"

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
        cached = self.k_cache.numel() > 0
        if cached:
            ops.reshape_and_cache(k, v, self.k_cache, self.v_cache, ctx.slot_mapping)
        out = torch.empty_like(q)
        if ctx.is_prefill and (self.sdpa_prefill or not cached or self.softcap is not None):
            self._torch_prefill(out, q, k, v, ctx)
        elif ctx.is_prefill:
            assert ctx.query_start_loc is not None, "the runner sets it for every prefill"
            window = -1 if self.sliding_window is None else self.sliding_window
            ops.paged_prefill_attention(out, q.contiguous(), self.k_cache, self.v_cache,
                                        ctx.block_tables, ctx.query_start_loc, ctx.seq_lens,
                                        self.scale, window)
        elif self.sliding_window is None and self.softcap is None:
            # the plain decode: nothing to look up per layer (a step's lengths read
            # back here cost each of a deep model's layers a max and a sync)
            ops.paged_attention(out, q, self.k_cache, self.v_cache,
                                ctx.block_tables, ctx.seq_lens, self.scale)
        elif (self.softcap is None and self.sliding_window is not None
              and self._in_torch(int(ctx.seq_lens.max()))):
            # a window alone: the prefill kernel takes it, one query a sequence
            one_each = torch.arange(tokens + 1, dtype=torch.int32, device=q.device)
            ops.paged_prefill_attention(out, q.contiguous(), self.k_cache, self.v_cache,
                                        ctx.block_tables, one_each, ctx.seq_lens,
                                        self.scale, self.sliding_window)
        elif self._in_torch(int(ctx.seq_lens.max())):
            windowed_attention.decode(out, q, self.k_cache, self.v_cache, ctx.block_tables,
                                      ctx.seq_lens, self.scale, self.sliding_window, self.softcap)
        else:
            ops.paged_attention(out, q, self.k_cache, self.v_cache,
                                ctx.block_tables, ctx.seq_lens, self.scale)
        return out.view(tokens, self.num_heads * self.head_dim)

    def _torch_prefill(self, out: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
                       v: torch.Tensor, ctx: ForwardContext) -> None:
        """Each prompt over its own keys (whole prompts only: no cached prefix)."""
        assert ctx.cu_seqlens is not None, "the runner sets it for every prefill"
        if ctx.length_groups is not None and self.softcap is None and not self._in_torch(
                max(n for _, _, n in ctx.length_groups)):  # a pooling batch: by length
            encoder_attention.attend_by_length(out, q, k, v, ctx.length_groups, self.scale,
                                               causal=True)
            return
        gqa = self.num_heads != self.num_kv_heads
        for start, end in zip(ctx.cu_seqlens[:-1], ctx.cu_seqlens[1:]):
            if self._in_torch(end - start):
                out[start:end] = windowed_attention.attend(
                    q[start:end], k[start:end], v[start:end], self.scale,
                    self.sliding_window, self.softcap)
                continue
            o = F.scaled_dot_product_attention(
                q[start:end].transpose(0, 1), k[start:end].transpose(0, 1),
                v[start:end].transpose(0, 1), is_causal=True, scale=self.scale, enable_gqa=gqa)
            out[start:end] = o.transpose(0, 1)
