"""Rotary position embeddings over the first rot_dim of each head (neox style,
as Llama/Qwen/Phi/Gemma checkpoints use), applied in place by the
rotary_embedding op from a precomputed cos|sin cache. The frequencies follow
transformers' ROPE_INIT_FUNCTIONS for each rope type (engine.config.ROPE_TYPES)."""
from __future__ import annotations

import math

import torch
from torch import nn

from engine import ops


def _default(dim: int, base: float) -> torch.Tensor:
    # the same float32 arithmetic as transformers
    return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))


def _llama3(inv_freq: torch.Tensor, p: dict) -> torch.Tensor:
    factor, low, high = p["factor"], p["low_freq_factor"], p["high_freq_factor"]
    old = p["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > old / low, inv_freq / factor, inv_freq)
    smooth = (old / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < old / high) * ~(wavelen > old / low)
    return torch.where(medium, smoothed, scaled)


def _yarn(dim: int, base: float, p: dict, max_position: int) -> tuple[torch.Tensor, float]:
    orig = p["original_max_position_embeddings"]
    factor = p.get("factor") or max_position / orig

    def mscale(scale, m=1.0):
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attn = p.get("attention_factor")
    if attn is None:
        m, m_all = p.get("mscale"), p.get("mscale_all_dim")
        attn = float(mscale(factor, m) / mscale(factor, m_all)) if m and m_all else mscale(factor)

    def corr(rot):
        return dim * math.log(orig / (rot * 2 * math.pi)) / (2 * math.log(base))

    low, high = corr(p.get("beta_fast") or 32), corr(p.get("beta_slow") or 1)
    if p.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    pos = base ** (torch.arange(0, dim, 2).float() / dim)
    extra = 1 - ramp
    return (1.0 / (factor * pos)) * (1 - extra) + (1.0 / pos) * extra, attn


def rope_tables(head_dim: int, p: dict, max_position: int,
                max_model_len: int | None = None) -> tuple[int, torch.Tensor, float]:
    """(rot_dim, inv_freq, attention_factor). longrope: its long factors where
    the engine's max_model_len passes original_max_position_embeddings, as
    upstream does (chosen once, so that no cached key is ever rotated with the
    other table; transformers switches per step and recomputes the cache)."""
    base, kind = p.get("rope_theta", 10000.0), p.get("rope_type", "default")
    dim = int(head_dim * p.get("partial_rotary_factor", 1.0))
    inv = _default(dim, base)
    if kind == "linear":
        return dim, inv / p["factor"], 1.0
    if kind == "llama3":
        return dim, _llama3(inv, p), 1.0
    if kind == "yarn":
        return (dim, *_yarn(dim, base, p, max_position))
    if kind == "longrope":
        orig = p["original_max_position_embeddings"]
        factor = p.get("factor") or max_position / orig
        attn = p.get("attention_factor")
        if attn is None:
            attn = 1.0 if factor <= 1 else math.sqrt(1 + math.log(factor) / math.log(orig))
        shape = torch.arange(0, dim, 2, dtype=torch.int64).float() / dim
        long = (max_model_len or max_position) > orig
        ext = torch.tensor(p["long_factor" if long else "short_factor"], dtype=torch.float32)
        return dim, 1.0 / (ext * base ** shape), attn
    return dim, inv, 1.0


class RotaryEmbedding(nn.Module):
    cos_sin_cache: torch.Tensor  # a buffer (register_buffer)

    def __init__(self, head_dim: int, max_position: int, params: dict | float,
                 dtype: torch.dtype, max_model_len: int | None = None):
        super().__init__()
        if not isinstance(params, dict):  # a plain base
            params = {"rope_type": "default", "rope_theta": params}
        self.head_dim = head_dim
        self.rot_dim, inv_freq, attn = rope_tables(head_dim, params, max_position, max_model_len)
        freqs = torch.outer(torch.arange(max_position, dtype=torch.float32), inv_freq)
        self.register_buffer("cos_sin_cache",
                             torch.cat([freqs.cos() * attn, freqs.sin() * attn], -1).to(dtype),
                             persistent=False)

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> None:
        ops.rotary_embedding(positions, q, k, self.head_dim, self.cos_sin_cache, True)
