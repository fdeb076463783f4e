"""A request's output as text, as transformers decodes it: the decoded
(prompt + output) minus the decoded prompt, so the separator that joins the
output to the prompt (a leading space) survives. Only the prompt's last few
tokens are decoded with the output, as upstream's detokenizer does: enough
context for the separator, without decoding a long prompt again."""
from __future__ import annotations

MIN_CONTEXT, MAX_CONTEXT = 4, 24  # prompt tokens; upstream's bounds


def prompt_context(tokenizer, prompt_ids: list[int]) -> list[int]:
    """The shortest tail of the prompt (at least MIN_CONTEXT tokens) that
    decodes without a broken character."""
    if len(prompt_ids) <= MIN_CONTEXT:
        return list(prompt_ids)
    for n in range(MIN_CONTEXT, min(len(prompt_ids), MAX_CONTEXT) + 1):
        tail = prompt_ids[-n:]
        if "\ufffd" not in tokenizer.decode(tail):
            return list(tail)
    return list(prompt_ids[-MAX_CONTEXT:])


def output_text(tokenizer, prompt_ids: list[int], output_ids: list[int]) -> str:
    context = prompt_context(tokenizer, prompt_ids)
    before = tokenizer.decode(context)
    full = tokenizer.decode(context + list(output_ids))
    if full.startswith(before):
        return full[len(before):]
    same = 0  # the output changed the context's last character (a merged byte sequence)
    while same < min(len(full), len(before)) and full[same] == before[same]:
        same += 1
    return full[same:]


class IncrementalDetokenizer:
    """The output's text token by token (the tokenizer's DecodeStream, primed
    with the prompt's context): each token decodes a window of the last few
    tokens in Rust, not the whole output again. A piece is "" while a
    character is incomplete."""

    def __init__(self, tokenizer, prompt_ids: list[int]):
        from tokenizers.decoders import DecodeStream

        self.tokenizer = tokenizer
        self.stream = DecodeStream(skip_special_tokens=True)  # as Tokenizer.decode
        for t in prompt_context(tokenizer, prompt_ids):
            self.stream.step(tokenizer, t)

    def add(self, token_ids) -> str:
        pieces = [self.stream.step(self.tokenizer, t) for t in token_ids]
        return "".join(p for p in pieces if p)
