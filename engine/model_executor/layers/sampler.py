"""Greedy, temperature, top-k and top-p sampling, with a generator per request."""
from __future__ import annotations

import torch

from engine.sampling_params import SamplingParams


def apply_repetition_penalty(logits: torch.Tensor, params: list[SamplingParams],
                             histories: list[list[int]]) -> torch.Tensor:
    """As upstream (and transformers): the logit of every token already in the
    prompt or output divided by the penalty where positive, multiplied where not."""
    for i, (p, ids) in enumerate(zip(params, histories)):
        if p.repetition_penalty != 1.0 and ids:
            idx = torch.tensor(sorted(set(ids)), device=logits.device)
            seen = logits[i, idx]
            logits[i, idx] = torch.where(seen > 0, seen / p.repetition_penalty,
                                         seen * p.repetition_penalty)
    return logits


def sample(logits: torch.Tensor, params: list[SamplingParams],
           generators: list[torch.Generator | None],
           histories: list[list[int]] | None = None) -> list[int]:
    logits = logits.float()
    if histories is not None:
        logits = apply_repetition_penalty(logits, params, histories)
    greedy = torch.argmax(logits, dim=-1).tolist()  # one call for the whole batch
    out = []
    for row, p, g, best in zip(logits, params, generators, greedy):
        if p.temperature == 0.0 or p.top_k == 1:
            out.append(best)
            continue
        row = row / p.temperature
        if 0 < p.top_k < row.numel():
            kth = torch.topk(row, p.top_k).values[-1]
            row = row.masked_fill(row < kth, float("-inf"))
        if p.top_p < 1.0:
            sorted_logits, idx = torch.sort(row, descending=True)
            probs = torch.softmax(sorted_logits, -1)
            # drop tokens once the ones before them already reach top_p
            drop = probs.cumsum(-1) - probs >= p.top_p
            row = row.scatter(0, idx[drop], float("-inf"))
        probs = torch.softmax(row, -1)
        out.append(int(torch.multinomial(probs, 1, generator=g)))
    return out
