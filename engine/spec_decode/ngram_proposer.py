"""Prompt-lookup drafts (upstream's NgramProposer): the tokens that followed
the first earlier occurrence of the context's longest ending n-gram
(prompt_lookup_max down to prompt_lookup_min tokens), over the request's
prompt and output so far. Costs no model: on a task whose
output repeats its prompt (editing, summarizing, code) the drafts are often
right, and one forward then gives several tokens."""
from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from engine.core.sequence import Sequence
from engine.spec_decode.config import SpeculativeConfig


def find_draft(context: np.ndarray, lookup_min: int, lookup_max: int, k: int) -> list[int]:
    """Up to k tokens that followed the first earlier occurrence of the
    longest n-gram (lookup_max >= n >= lookup_min) ending the context."""
    # where the last token occurred before (each leaves a token to propose),
    # then how far back each of those matches the context's end
    ends = np.flatnonzero(context[:-1] == context[-1])
    if ends.size == 0:
        return []
    length = np.ones(ends.size, dtype=np.int64)
    alive = np.ones(ends.size, dtype=bool)
    for d in range(1, min(lookup_max, len(context) - 1)):
        back = ends - d
        alive &= back >= 0
        alive[alive] &= context[back[alive]] == context[-1 - d]
        if not alive.any():
            break
        length += alive
    best = int(length.max())
    if best < lookup_min:
        return []
    start = int(ends[np.argmax(length == best)]) + 1  # the first of the longest
    return context[start:start + k].tolist()


def speculable(seq: Sequence) -> bool:
    """Whether the speculative path handles the request's sampling: logprobs,
    prompt logprobs, penalties, logit_bias and min_tokens are not verified
    over drafts yet; such a request decodes one token a step (in the same
    batch)."""
    p = seq.params
    return (p.logprobs is None and p.prompt_logprobs is None and not p.logit_bias
            and not p.min_tokens and not p.presence_penalty and not p.frequency_penalty
            and p.repetition_penalty == 1.0)


def draft_budget(seq: Sequence, k: int, max_model_len: int) -> int:
    """How many drafts the sequence's next step may verify: none unless it
    decodes (all its tokens but the last computed) and its sampling is
    speculable; never past its max_tokens or the model's context."""
    if seq.num_computed_tokens != len(seq) - 1 or not speculable(seq):
        return 0
    return min(k, seq.params.max_tokens - seq.num_output_tokens - 1, max_model_len - len(seq))


class NgramProposer:
    def __init__(self, config: SpeculativeConfig, max_model_len: int):
        self.k, self.max_model_len = config.num_speculative_tokens, max_model_len
        self.lookup_min, self.lookup_max = config.prompt_lookup_min, config.prompt_lookup_max
        # per running request: its tokens as an array, extended step by step
        # (converting a 1000-token list each step cost more than the search)
        self._tokens: dict[str, tuple[np.ndarray, int]] = {}

    def _context(self, seq: Sequence) -> np.ndarray:
        buf, filled = self._tokens.get(seq.request_id, (np.empty(0, np.int64), 0))
        if len(buf) < len(seq):
            grown = np.empty(max(2 * len(seq), 256), np.int64)
            grown[:filled] = buf[:filled]
            buf = grown
        buf[filled:len(seq)] = seq.token_ids[filled:]
        self._tokens[seq.request_id] = (buf, len(seq))
        return buf[:len(seq)]

    def propose(self, seq: Sequence) -> list[int]:
        """The drafts for the sequence's next step (draft_budget's count at most)."""
        k = draft_budget(seq, self.k, self.max_model_len)
        if k <= 0:
            return []
        return find_draft(self._context(seq), self.lookup_min, self.lookup_max, k)

    def propose_for(self, seqs: Iterable[Sequence]) -> None:
        """Set each running sequence's drafts for the step about to be
        scheduled (and forget the arrays of the requests that left)."""
        running = set()
        for seq in seqs:
            seq.spec_token_ids = self.propose(seq)
            running.add(seq.request_id)
        if len(self._tokens) > len(running):
            self._tokens = {r: t for r, t in self._tokens.items() if r in running}
