"""Logprobs in the OpenAI API's two shapes: the completions one (parallel
lists) and the chat one (a list of token entries). Each token's text is its
own decode, as upstream's; -inf becomes -9999.0 as upstream's (JSON has no
infinity)."""
from __future__ import annotations


def _lp(x: float) -> float:
    return max(x, -9999.0)


def _text(tokenizer, token: int) -> str:
    return tokenizer.decode([token], skip_special_tokens=False)


def completion_logprobs(tokenizer, token_ids: list[int], entries: list,
                        offset: int = 0) -> dict:
    """entries: (logprob, [(id, logprob), ...]) per token; offset: where the
    first token's text starts in the choice's text."""
    out = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for token, (lp, top) in zip(token_ids, entries):
        text = _text(tokenizer, token)
        out["tokens"].append(text)
        out["token_logprobs"].append(_lp(lp))
        alts = {text: _lp(lp)}  # upstream lists the sampled token among them; first, as
        for t, v in top:        # two ids may decode alike (keys are texts)
            alts.setdefault(_text(tokenizer, t), _lp(v))
        out["top_logprobs"].append(alts)
        out["text_offset"].append(offset)
        offset += len(text)
    return out


def _entry(tokenizer, token: int, lp: float) -> dict:
    text = _text(tokenizer, token)
    return {"token": text, "logprob": _lp(lp), "bytes": list(text.encode())}


def chat_logprobs(tokenizer, token_ids: list[int], entries: list) -> dict:
    return {"content": [{**_entry(tokenizer, token, lp),
                         "top_logprobs": [_entry(tokenizer, t, v) for t, v in top]}
                        for token, (lp, top) in zip(token_ids, entries)]}
