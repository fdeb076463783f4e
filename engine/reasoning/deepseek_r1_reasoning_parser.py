"""DeepSeek-R1: the template opens <think> in the prompt, so the answer is
reasoning until </think> (all of it, if that never comes), content after."""
from __future__ import annotations

from engine.reasoning import ReasoningParser, ReasoningParserManager


@ReasoningParserManager.register_module("deepseek_r1")
class DeepSeekR1ReasoningParser(ReasoningParser):
    def extract(self, text: str, finished: bool = True) -> tuple[str | None, str | None]:
        start = text.find(self.start_token)
        if start >= 0 and not text[:start].strip():  # the model opened it itself
            text = text[start + len(self.start_token):]
        elif not finished and self.start_token.startswith(text.lstrip()) and text.strip():
            return None, None
        reasoning, end, content = text.partition(self.end_token)
        if not end:
            if not finished:
                reasoning = reasoning[:len(reasoning) - self.held(reasoning, self.end_token)]
            return reasoning or None, None
        return reasoning or None, content or None
