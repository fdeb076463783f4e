"""Verifies a request's drafts against the target model's distributions at
their positions (upstream's RejectionSampler, with the draft distribution q
one-hot, as an n-gram's is), so that the tokens come out distributed exactly
as one-at-a-time sampling would give them:

- greedy: a draft is accepted while it is the argmax; the first position
  that disagrees gives its argmax instead, and when all are accepted the
  last row gives one more (the bonus token);
- sampling: draft x at a position whose distribution is p is accepted with
  probability min(1, p(x) / q(x)) = p(x); on rejection the token is drawn
  from max(p - q, 0) renormalised, that is p without x; all accepted, the
  bonus token is drawn from the last row's p.

The draws use the request's own generator (its seed)."""
from __future__ import annotations

import logging

import torch

from engine.model_executor.layers.sampler import probabilities
from engine.sampling_params import SamplingParams

logger = logging.getLogger("engine")


def verify(logits: torch.Tensor, drafts: list[int], params: SamplingParams,
           generator: torch.Generator | None) -> tuple[int, int]:
    """(accepted drafts, the token after them). logits: [len(drafts) + 1,
    vocab], row i the distribution at draft i's position, the last one past
    the last draft."""
    logits = logits.float()
    best = torch.argmax(logits, dim=-1).tolist()
    if params.greedy:
        n = 0
        while n < len(drafts) and best[n] == drafts[n]:
            n += 1
        return n, best[n]
    for i, x in enumerate(drafts):
        p = probabilities(logits[i], params)
        u = torch.rand((), generator=generator, device=logits.device)
        if bool(u < p[x]):
            continue
        p[x] = 0.0
        return i, _multinomial(p, generator, best[i])
    return len(drafts), _multinomial(probabilities(logits[-1], params), generator, best[-1])


def _multinomial(p: torch.Tensor, generator: torch.Generator | None, fallback: int) -> int:
    try:  # multinomial renormalises p itself
        return int(torch.multinomial(p, 1, generator=generator))
    except RuntimeError:  # nan/inf logits (a model fault), as the sampler: the argmax
        logger.warning("non-finite probabilities while verifying drafts; took the argmax")
        return fallback
