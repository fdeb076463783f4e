"""When a sequence is done (upstream's check_stop): an end-of-sequence token,
a stop token or string, its token budget, or the model's context. Nothing
but the budget and the context ends a sequence before its min_tokens."""
from __future__ import annotations

from engine.core.detokenizer import IncrementalDetokenizer
from engine.core.sequence import Sequence


def check_stop(seq: Sequence, token: int, eos_token_ids, max_model_len: int,
               tokenizer) -> str | None:
    """The finish reason after `token` joined `seq`, or None to go on. A stop
    string that matched cuts seq.text there (after it with
    include_stop_str_in_output) and is kept in seq.stop_string."""
    p = seq.params
    may_stop = seq.num_output_tokens >= p.min_tokens
    if may_stop and not p.ignore_eos and token in eos_token_ids:
        return "stop"
    if may_stop and token in p.stop_token_ids:
        seq.stop_string = token
        return "stop"
    if p.stop and _stop_string(seq, token, tokenizer, may_stop):
        return "stop"
    if seq.num_output_tokens >= p.max_tokens:
        return "length"
    if len(seq) >= max_model_len:
        return "length"
    return None


def _stop_string(seq: Sequence, token: int, tokenizer, may_stop: bool) -> bool:
    """Decode the new token only and look for the stop strings where they
    could end: in the new text or across its start."""
    p = seq.params
    if seq.detokenizer is None:
        seq.detokenizer = IncrementalDetokenizer(tokenizer, seq.token_ids[:seq.num_prompt_tokens])
    piece = seq.detokenizer.add([token])
    if not piece:
        return False
    start = max(0, len(seq.text) - max(len(s) for s in p.stop) + 1)
    seq.text += piece
    if not may_stop:
        return False
    found = [(at, s) for s in p.stop if (at := seq.text.find(s, start)) >= 0]
    if not found:
        return False
    at, s = min(found)
    seq.text = seq.text[:at + (len(s) if p.include_stop_str_in_output else 0)]
    seq.stop_string = s
    return True
