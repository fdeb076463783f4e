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
    return _decode_after(tokenizer, prompt_context(tokenizer, prompt_ids), output_ids)


def _decode_after(tokenizer, context: list[int], output_ids: list[int],
                  skip_special_tokens: bool = True) -> str:
    before = tokenizer.decode(context, skip_special_tokens=skip_special_tokens)
    full = tokenizer.decode(context + list(output_ids), skip_special_tokens=skip_special_tokens)
    if full.startswith(before):
        return full[len(before):]
    same = 0  # the output changed the context's last character (a merged byte sequence)
    while same < min(len(full), len(before)) and full[same] == before[same]:
        same += 1
    return full[same:]


class IncrementalDetokenizer:
    """One request's output as text, token by token (the tokenizer's
    DecodeStream, primed with the prompt's context: each token decodes a
    window of the last few tokens in Rust, not the whole output again). The
    one detokenizer of a request: it finds the stop strings, hands out the
    streamed text (never a partial character or the start of a stop string)
    and says the final text."""

    def __init__(self, tokenizer, prompt_ids: list[int], stop: list[str] | tuple[str, ...] = (),
                 include_stop_str_in_output: bool = False, min_tokens: int = 0,
                 skip_special_tokens: bool = True):
        from tokenizers.decoders import DecodeStream

        self.tokenizer = tokenizer
        self.skip_special = skip_special_tokens
        self.stream = DecodeStream(skip_special_tokens=skip_special_tokens)
        self.context = prompt_context(tokenizer, prompt_ids)
        for t in self.context:
            self.stream.step(tokenizer, t)
        self.stop, self.include_stop, self.min_tokens = list(stop), include_stop_str_in_output, \
            min_tokens
        self.longest_stop = max(map(len, self.stop), default=0)
        # held back from a stream until no stop string can start in it
        self.hold = 0 if include_stop_str_in_output else max(self.longest_stop - 1, 0)
        self.text = ""  # decoded so far; cut at the stop string once one matched
        self.sent = 0  # of text, handed out
        self.num_tokens = 0
        self.stop_string: str | None = None

    def add(self, token_ids) -> int | None:
        """Decode the output's next tokens; the count of them that stand
        before a stop string's end when one matched (the rest are dropped),
        else None."""
        for i, t in enumerate(token_ids):
            self.num_tokens += 1
            piece = self.stream.step(self.tokenizer, t)
            if not piece:
                continue
            start = max(0, len(self.text) - self.longest_stop + 1)
            self.text += piece
            if self.stop and self.num_tokens >= self.min_tokens and self._stopped(start):
                return i + 1
        return None

    def _stopped(self, start: int) -> bool:
        """A stop string ending in the new text (or across its start)."""
        found = [(at, s) for s in self.stop if (at := self.text.find(s, start)) >= 0]
        if not found:
            return False
        at, s = min(found)
        self.text = self.text[:at + (len(s) if self.include_stop else 0)]
        self.stop_string = s
        return True

    def delta(self, final_text: str | None = None) -> str:
        """The streamed text not handed out yet; final_text: the request
        ended with that text, hand out the rest of it."""
        text = self.text if final_text is None else final_text
        end = len(text) if final_text is not None else len(text) - self.hold
        out = text[self.sent:end] if end > self.sent else ""
        self.sent = max(self.sent, end)
        return out

    def final_text(self, output_ids: list[int]) -> str:
        """As transformers decodes the whole output (joined to the prompt);
        cut at the stop string when one matched. Bytes at the end that make
        no whole character yet are left out, as upstream's stream holds them
        back, rather than each written as U+FFFD."""
        if self.stop_string is not None:
            return self.text
        text = _decode_after(self.tokenizer, self.context, output_ids, self.skip_special)
        # the decode stream never hands out a trailing U+FFFD (it waits for more bytes)
        return text.rstrip("\ufffd")
