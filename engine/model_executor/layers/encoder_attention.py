"""Attention over a packed batch without a KV cache (upstream's
EncoderOnlyAttention): BERT-family encoders attend both ways, a decoder run
for its embeddings causally.

Varlen without padding: the pooling runner packs the batch sorted by length,
so the sequences of one length lie back to back and each length's are one
[B, L] block of the packed tokens, a view handed to torch's SDPA whole. A
batch of short texts has few distinct lengths, so few calls; a padded
[B, max_len] batch with a key mask would compute every pad, and a
block-diagonal mask over the whole batch would compute (and allocate)
B times the scores it needs."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.forward_context import get_context

#: (first token, sequences, length) of each run of equal-length sequences
LengthGroups = list[tuple[int, int, int]]


def length_groups(lengths: list[int]) -> LengthGroups:
    """The runs of equal lengths in packed order (sorted, for few runs)."""
    groups: LengthGroups = []
    start = 0
    for n in lengths:
        if groups and groups[-1][2] == n and groups[-1][0] + groups[-1][1] * n == start:
            first, count, _ = groups[-1]
            groups[-1] = (first, count + 1, n)
        else:
            groups.append((start, 1, n))
        start += n
    return groups


def attend_by_length(out: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     groups: LengthGroups, scale: float, causal: bool) -> None:
    """out[t] = attention of token t over its own sequence; q/out are
    [tokens, heads, head_dim], k/v [tokens, kv_heads, head_dim]."""
    gqa = q.shape[1] != k.shape[1]
    for start, count, n in groups:
        o = F.scaled_dot_product_attention(
            _block(q, start, count, n), _block(k, start, count, n), _block(v, start, count, n),
            is_causal=causal, scale=scale, enable_gqa=gqa)
        _block(out, start, count, n).copy_(o)


def _block(x: torch.Tensor, start: int, count: int, n: int) -> torch.Tensor:
    """The [count, heads, n, head_dim] view of `count` sequences of n tokens from start."""
    return x[start:start + count * n].view(count, n, x.shape[1], x.shape[2]).transpose(1, 2)


class EncoderOnlyAttention(nn.Module):
    """Bidirectional attention within each sequence of the packed batch."""

    def __init__(self, num_heads: int, head_dim: int):
        super().__init__()
        self.num_heads, self.head_dim = num_heads, head_dim
        self.scale = head_dim ** -0.5

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        groups = get_context().length_groups
        assert groups is not None, "the pooling runner groups every batch"
        tokens = q.shape[0]
        shape = (tokens, self.num_heads, self.head_dim)
        out = q.new_empty(shape)
        attend_by_length(out, q.reshape(shape), k.reshape(shape), v.reshape(shape), groups,
                         self.scale, causal=False)
        return out.view(tokens, self.num_heads * self.head_dim)
