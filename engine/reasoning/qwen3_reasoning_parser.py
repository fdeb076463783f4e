"""Qwen3: reasoning between <think> and </think> when the model opens it
(thinking on); an answer without <think> is all content (thinking off)."""
from __future__ import annotations

from engine.reasoning import ReasoningParser, ReasoningParserManager


@ReasoningParserManager.register_module("qwen3")
class Qwen3ReasoningParser(ReasoningParser):
    def extract(self, text: str, finished: bool = True) -> tuple[str | None, str | None]:
        lead = text.lstrip()
        if not lead.startswith(self.start_token):
            if not finished and lead and self.start_token.startswith(lead):
                return None, None  # may still be <think>
            return None, text or None
        body = lead[len(self.start_token):]
        reasoning, end, content = body.partition(self.end_token)
        if not end:
            if not finished:
                reasoning = reasoning[:len(reasoning) - self.held(reasoning, self.end_token)]
            return reasoning or None, None
        return reasoning or None, content or None
