"""Causal attention with a sliding window and/or logit soft-capping, in torch
(correct before fast): the window keeps the keys within `window` positions of
the query, itself included, as transformers' sliding_window_overlay does."""
from __future__ import annotations

import torch


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
           window: int | None, softcap: float | None, q_start: int | None = None) -> torch.Tensor:
    """q [n, heads, d] at positions q_start.. (default: the last n of k's),
    k/v [m, kv_heads, d] at positions 0..m-1 -> [n, heads, d]."""
    n, heads, _ = q.shape
    m, kv_heads, _ = k.shape
    q_start = m - n if q_start is None else q_start
    rep = heads // kv_heads
    kf = k.float().repeat_interleave(rep, 1).transpose(0, 1)  # [heads, m, d]
    vf = v.float().repeat_interleave(rep, 1).transpose(0, 1)
    scores = q.float().transpose(0, 1) @ kf.transpose(1, 2) * scale  # [heads, n, m]
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    qpos = torch.arange(q_start, q_start + n)[:, None]
    kpos = torch.arange(m)[None, :]
    keep = kpos <= qpos
    if window is not None:
        keep &= kpos > qpos - window
    scores = scores.masked_fill(~keep.to(scores.device), float("-inf"))
    return (torch.softmax(scores, -1) @ vf).transpose(0, 1).to(q.dtype)


def decode(out: torch.Tensor, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
           block_tables: torch.Tensor, seq_lens: torch.Tensor, scale: float,
           window: int | None, softcap: float | None) -> None:
    """One query token per sequence over its cached blocks
    (cache [blocks, kv_heads, block_size, d])."""
    block_size = k_cache.shape[2]
    for i, n in enumerate(seq_lens.tolist()):
        first = 0 if window is None else max(n - window, 0)  # blocks wholly out of the window
        b0, b1 = first // block_size, -(-n // block_size)
        blocks = block_tables[i, b0:b1].long()
        k = k_cache[blocks].permute(0, 2, 1, 3).reshape(-1, *k_cache.shape[1:2], k_cache.shape[3])
        v = v_cache[blocks].permute(0, 2, 1, 3).reshape(-1, *v_cache.shape[1:2], v_cache.shape[3])
        lo = first - b0 * block_size
        k, v = k[lo:n - b0 * block_size], v[lo:n - b0 * block_size]
        out[i] = attend(q[i:i + 1], k, v, scale, window, softcap, q_start=k.shape[0] - 1)[0]
