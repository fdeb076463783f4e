"""Logprobs in the OpenAI API's two shapes: the completions one (parallel
lists) and the chat one (a list of token entries), and vLLM's own
`prompt_logprobs` field. Each token's text is its own decode, as upstream's;
-inf becomes -9999.0 as upstream's (JSON has no infinity)."""
from __future__ import annotations


class AsTokenIds:
    """Stands for the tokenizer where return_tokens_as_token_ids asks that
    logprobs name each token 'token_id:N' (upstream's form), not its text."""

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        return "".join(f"token_id:{t}" for t in ids)


def _lp(x: float) -> float:
    return max(x, -9999.0)


def _text(tokenizer, token: int) -> str:
    return tokenizer.decode([token], skip_special_tokens=False)


def completion_logprobs(tokenizer, token_ids: list[int], entries: list,
                        offset: int = 0) -> dict:
    """entries: (logprob, [(id, logprob), ...]) per token, or None (the
    prompt's first token: nothing before it to score it); offset: where the
    first token's text starts in the choice's text."""
    out: dict[str, list] = {"tokens": [], "token_logprobs": [], "top_logprobs": [],
                            "text_offset": []}
    for token, entry in zip(token_ids, entries):
        text = _text(tokenizer, token)
        out["tokens"].append(text)
        out["text_offset"].append(offset)
        offset += len(text)
        if entry is None:
            out["token_logprobs"].append(None)
            out["top_logprobs"].append(None)
            continue
        lp, top = entry
        out["token_logprobs"].append(_lp(lp))
        alts = {text: _lp(lp)}  # upstream lists the sampled token among them; first, as
        for t, v in top:        # two ids may decode alike (keys are texts)
            alts.setdefault(_text(tokenizer, t), _lp(v))
        out["top_logprobs"].append(alts)
    return out


def prompt_entries(seq) -> list:
    """The prompt tokens' entries for completion_logprobs (echo): None for
    the first, then each scored token's (logprob, top)."""
    return [None] + [(lp, top) for lp, _, top in seq.prompt_logprobs]


def vllm_prompt_logprobs(tokenizer, seq) -> list:
    """vLLM's `prompt_logprobs` field: None for the first prompt token, then
    per token {id: {logprob, rank, decoded_token}}, the prompt's token first
    and then the top ones."""
    out: list[dict | None] = [None]
    for token, (lp, rank, top) in zip(seq.token_ids[1:seq.num_prompt_tokens],
                                      seq.prompt_logprobs):
        entry = {str(token): {"logprob": _lp(lp), "rank": rank,
                              "decoded_token": _text(tokenizer, token)}}
        for r, (t, v) in enumerate(top, 1):
            entry.setdefault(str(t), {"logprob": _lp(v), "rank": r,
                                      "decoded_token": _text(tokenizer, t)})
        out.append(entry)
    return out


def _entry(tokenizer, token: int, lp: float) -> dict:
    text = _text(tokenizer, token)
    return {"token": text, "logprob": _lp(lp), "bytes": list(text.encode())}


def chat_logprobs(tokenizer, token_ids: list[int], entries: list) -> dict:
    return {"content": [{**_entry(tokenizer, token, lp),
                         "top_logprobs": [_entry(tokenizer, t, v) for t, v in top]}
                        for token, (lp, top) in zip(token_ids, entries)]}
