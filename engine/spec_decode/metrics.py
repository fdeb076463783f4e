"""Acceptance counts of speculative decoding (upstream's SpecDecodingStats),
kept by the scheduler as totals since start and sent with each step's
scheduler stats; the server's /metrics shows them under upstream's names
(vllm:spec_decode_*)."""
from __future__ import annotations

import msgspec


class SpecDecodingStats(msgspec.Struct, array_like=True, gc=False):
    num_drafts: int = 0  # verifications: steps of a request that carried drafts
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    # [i]: drafts accepted at position i (0: the first draft of a step)
    num_accepted_tokens_per_pos: list[int] = []

    @classmethod
    def for_tokens(cls, num_speculative_tokens: int) -> SpecDecodingStats:
        return cls(num_accepted_tokens_per_pos=[0] * num_speculative_tokens)

    def observe(self, num_draft_tokens: int, num_accepted: int) -> None:
        self.num_drafts += 1
        self.num_draft_tokens += num_draft_tokens
        self.num_accepted_tokens += num_accepted
        for i in range(num_accepted):
            self.num_accepted_tokens_per_pos[i] += 1


def summed(stats: list[SpecDecodingStats | None]) -> SpecDecodingStats | None:
    """Several engines' totals (data-parallel replicas) as one; None when
    none speculates."""
    given = [s for s in stats if s is not None]
    if not given:
        return None
    per_pos = [0] * max(len(s.num_accepted_tokens_per_pos) for s in given)
    for s in given:
        for i, n in enumerate(s.num_accepted_tokens_per_pos):
            per_pos[i] += n
    return SpecDecodingStats(sum(s.num_drafts for s in given),
                             sum(s.num_draft_tokens for s in given),
                             sum(s.num_accepted_tokens for s in given), per_pos)
