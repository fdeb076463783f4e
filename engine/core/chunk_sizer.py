"""How long a chunk of one prompt a step of the served engine core may take:
as many tokens as the measured prefill speed runs in STEP_TARGET_S, so that
a long prompt's chunks never hold up the running streams' next tokens much
longer than that (the token budget alone, 2048 by default, is seconds of
prefill on a CPU: every stream would stall that long). /health does not
depend on it: the core runs in a process of its own. Per prompt, not per
step: a cap per step would admit many clients' prompts a few at a time, each
waiting behind the decodes of those before it (64 clients' time to first
token: p99 17 s against 2.5 s without). The cost: prompts that arrive
together share the steps and finish together. Offline generation keeps the
whole token budget."""
from __future__ import annotations

STEP_TARGET_S = 0.1
# Below this many tokens a chunk's fixed costs (every weight read once per
# step, the step's Python) would dominate its time.
MIN_TOKENS = 128
START_TOKENS = 256  # before the first measurement


class PromptChunkSizer:
    def __init__(self, budget: int):
        self.budget = budget  # max_num_batched_tokens
        self.rate: float | None = None  # prompt tokens a second, smoothed

    def cap(self) -> int:
        """Tokens of one prompt the next step may take."""
        if self.rate is None:
            return min(self.budget, START_TOKENS)
        return min(self.budget, max(MIN_TOKENS, int(self.rate * STEP_TARGET_S)))

    def stepped(self, prompt_tokens: int, seconds: float) -> None:
        """A step that ran `prompt_tokens` prompt tokens (and maybe decodes) took `seconds`."""
        if prompt_tokens < MIN_TOKENS or seconds <= 0:
            return  # too little prompt work to time it by
        rate = prompt_tokens / seconds
        self.rate = rate if self.rate is None else 0.5 * (self.rate + rate)
