from __future__ import annotations

import torch
from torch import nn

from engine import ops


class RotaryEmbedding(nn.Module):
    """Neox-style rotary embeddings (as Llama/Qwen checkpoints use), applied in
    place by the rotary_embedding op from a precomputed cos|sin cache."""

    def __init__(self, head_dim: int, max_position: int, base: float, dtype: torch.dtype):
        super().__init__()
        self.head_dim = head_dim
        # The same float32 arithmetic as transformers' LlamaRotaryEmbedding.
        inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
        freqs = torch.outer(torch.arange(max_position, dtype=torch.float32), inv_freq)
        self.register_buffer("cos_sin_cache", torch.cat([freqs.cos(), freqs.sin()], -1).to(dtype),
                             persistent=False)

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> None:
        ops.rotary_embedding(positions, q, k, self.head_dim, self.cos_sin_cache, True)
