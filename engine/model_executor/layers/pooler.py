"""The pooling model's last step (upstream's Pooler): one vector per sequence
from the packed hidden states ([CLS], mean or last token), then the task's
head: an embedding shortened to the `dimensions` asked for (Matryoshka) and
normalized, or a classifier's logits through softmax (sigmoid for one label,
a cross-encoder's score). Computed in float32 whatever the model's dtype."""
from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from engine.pooling_params import PoolingParams

POOLING_TYPES = ("CLS", "MEAN", "LAST")


def pool(hidden: torch.Tensor, cu_seqlens: list[int], how: str) -> torch.Tensor:
    """[sequences, hidden] from [tokens, hidden] packed at cu_seqlens."""
    starts = torch.tensor(cu_seqlens[:-1], device=hidden.device)
    ends = torch.tensor(cu_seqlens[1:], device=hidden.device)
    if how == "CLS":
        return hidden[starts].float()
    if how == "LAST":
        return hidden[ends - 1].float()
    if how == "MEAN":
        lengths = ends - starts
        seq = torch.repeat_interleave(torch.arange(len(lengths), device=hidden.device), lengths)
        sums = hidden.new_zeros(len(lengths), hidden.shape[1], dtype=torch.float32)
        sums.index_add_(0, seq, hidden.float())
        return sums / lengths.unsqueeze(1)
    raise ValueError(f"pooling type {how!r} is not one of {', '.join(POOLING_TYPES)}")


class Pooler:
    """pooling: CLS, MEAN or LAST; classify: the model's head from pooled
    vectors to logits (None: an embedding model); normalize: embeddings'
    default when a request leaves it unset."""

    def __init__(self, pooling: str, normalize: bool,
                 classify: Callable[[torch.Tensor], torch.Tensor] | None = None):
        if pooling not in POOLING_TYPES:
            raise ValueError(f"pooling type {pooling!r} is not one of {', '.join(POOLING_TYPES)}")
        self.pooling, self.normalize, self.classify = pooling, normalize, classify

    def __call__(self, hidden: torch.Tensor, cu_seqlens: list[int],
                 params: list[PoolingParams]) -> list[torch.Tensor]:
        """One float32 vector per sequence, in the batch's order."""
        if self.classify is not None:
            first = hidden[torch.tensor(cu_seqlens[:-1], device=hidden.device)] \
                if self.pooling == "CLS" else pool(hidden, cu_seqlens, self.pooling).to(
                    hidden.dtype)
            logits = self.classify(first).float()
            act = torch.sigmoid(logits) if logits.shape[1] == 1 else logits.softmax(dim=-1)
            return [a if p.use_activation is not False else raw
                    for a, raw, p in zip(act, logits, params)]
        pooled = pool(hidden, cu_seqlens, self.pooling)
        if all(p.dimensions is None and p.normalize is None for p in params):  # the usual batch
            rows = F.normalize(pooled, dim=-1) if self.normalize else pooled
            return list(rows)
        out = []
        for row, p in zip(pooled, params):
            if p.dimensions is not None:
                row = row[:p.dimensions]
            if p.normalize if p.normalize is not None else self.normalize:
                row = F.normalize(row, dim=-1)
            out.append(row)
        return out
