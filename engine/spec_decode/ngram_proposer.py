"""Prompt-lookup drafts (upstream's NgramProposer): the tokens that followed
the first earlier occurrence of the context's longest ending n-gram
(prompt_lookup_max down to prompt_lookup_min tokens), over the request's
prompt and output so far. Costs no model: on a task whose
output repeats its prompt (editing, summarizing, code) the drafts are often
right, and one forward then gives several tokens."""
from __future__ import annotations

from typing import Iterable

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from engine.core.sequence import Sequence
from engine.spec_decode.config import SpeculativeConfig


def find_draft(context: np.ndarray, lookup_min: int, lookup_max: int, k: int) -> list[int]:
    """Up to k tokens that followed the first earlier occurrence of the
    longest n-gram (lookup_max >= n >= lookup_min) ending the context."""
    size = len(context)
    for n in range(min(lookup_max, size - 1), lookup_min - 1, -1):
        # windows ending before the last token: each leaves a token to propose
        windows = sliding_window_view(context[:-1], n)
        hits = np.flatnonzero((windows == context[-n:]).all(axis=1))
        if hits.size:
            start = int(hits[0]) + n
            return context[start:start + k].tolist()
    return []


def speculable(seq: Sequence) -> bool:
    """Whether the speculative path handles the request's sampling: logprobs,
    prompt logprobs, penalties, logit_bias and min_tokens are not verified
    over drafts yet; such a request decodes one token a step (in the same
    batch)."""
    p = seq.params
    return (p.logprobs is None and p.prompt_logprobs is None and not p.logit_bias
            and not p.min_tokens and not p.presence_penalty and not p.frequency_penalty
            and p.repetition_penalty == 1.0)


class NgramProposer:
    def __init__(self, config: SpeculativeConfig, max_model_len: int):
        self.k, self.max_model_len = config.num_speculative_tokens, max_model_len
        self.lookup_min, self.lookup_max = config.prompt_lookup_min, config.prompt_lookup_max

    def propose(self, seq: Sequence) -> list[int]:
        """The drafts for the sequence's next step: none unless it decodes
        (all its tokens but the last computed); never past its max_tokens
        or the model's context."""
        if seq.num_computed_tokens != len(seq) - 1 or not speculable(seq):
            return []
        k = min(self.k, seq.params.max_tokens - seq.num_output_tokens - 1,
                self.max_model_len - len(seq))
        if k <= 0:
            return []
        return find_draft(np.asarray(seq.token_ids), self.lookup_min, self.lookup_max, k)

    def propose_for(self, seqs: Iterable[Sequence]) -> None:
        """Set each running sequence's drafts for the step about to be scheduled."""
        for seq in seqs:
            seq.spec_token_ids = self.propose(seq)
