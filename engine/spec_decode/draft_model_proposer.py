"""Drafts from a smaller model (upstream's draft_model method): the draft,
an engine core of its own in this process with its own KV cache, continues
each decoding request greedily for up to k tokens; the target verifies them
in one forward (the rejection sampler keeps the output exactly the target's).

Each step the draft gets each request's tokens so far as a prompt: its prefix
cache holds what it computed the steps before, so it computes the tokens the
target accepted since and its k drafts, and forgets nothing it must undo when
the target rejects some (they are past the prompt it gets next)."""
from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from engine.core.messages import EngineCoreRequest
from engine.core.sequence import Sequence
from engine.model_executor.layers.linear import dtype_name
from engine.sampling_params import SamplingParams
from engine.spec_decode.config import SpeculativeConfig
from engine.spec_decode.ngram_proposer import draft_budget

DRAFT_BLOCK = 32


class DraftModelProposer:
    def __init__(self, config: SpeculativeConfig, target, engine_core: Callable[..., Any]):
        """target: the target's EngineConfig (its dtype, context and KV cache
        shape are the draft's too); engine_core: the EngineCore class (the
        draft is one too; the core imports this module, not the reverse)."""
        assert config.model is not None, "the draft_model method names its model"
        self.k = config.num_speculative_tokens
        # the smallest blocks: each step the draft recomputes its prompt's last, partial one
        blocks = target.num_blocks * target.block_size // DRAFT_BLOCK
        self.core = engine_core(config.model, dtype_name(target.dtype),
                                block_size=DRAFT_BLOCK, num_kv_blocks=blocks,
                                max_model_len=target.max_model_len,
                                max_num_seqs=target.max_num_seqs, bind_threads=False,
                                enable_prefix_caching=True, seed=target.seed,
                                tokenizer=str(target.tokenizer),
                                enforce_eager=target.enforce_eager)
        vocab, want = self.core.config.vocab_size, target.model.vocab_size
        if vocab != want:
            raise ValueError(f"speculative_config 'model' {config.model}: its vocabulary has "
                             f"{vocab} tokens, the target's {want}; a draft model shares the "
                             "target's tokenizer")
        self.max_model_len = min(target.max_model_len, self.core.max_model_len)
        self._greedy = {k: SamplingParams(temperature=0.0, max_tokens=k, ignore_eos=True)
                        for k in range(1, self.k + 1)}

    def propose_for(self, seqs: Iterable[Sequence]) -> None:
        """Set each running sequence's drafts for the step about to be scheduled."""
        asks: list[tuple[Sequence, int]] = []
        for seq in seqs:
            seq.spec_token_ids = []
            k = draft_budget(seq, self.k, self.max_model_len)
            if k > 0:
                asks.append((seq, k))
        if not asks:
            return
        drafts: dict[str, list[int]] = {}
        for i, (seq, k) in enumerate(asks):
            drafts[str(i)] = []
            self.core.add_request(EngineCoreRequest(str(i), list(seq.token_ids),
                                                    self._greedy[k]))
        while self.core.has_unfinished():
            for o in self.core.step().outputs:
                drafts[o.request_id] += o.new_token_ids
        for i, (seq, k) in enumerate(asks):
            seq.spec_token_ids = drafts[str(i)][:k]
