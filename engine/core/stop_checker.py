"""When a sequence is done (upstream's check_stop): an end-of-sequence token,
a stop token or string, its token budget, or the model's context."""
from __future__ import annotations

from engine.core.sequence import Sequence


def check_stop(seq: Sequence, token: int, eos_token_ids, max_model_len: int,
               tokenizer) -> str | None:
    """The finish reason after `token` joined `seq`, or None to go on. A stop
    string that matched cuts seq.text there."""
    p = seq.params
    if not p.ignore_eos and token in eos_token_ids:
        return "stop"
    if token in p.stop_token_ids:
        return "stop"
    if p.stop:
        seq.text = tokenizer.decode(seq.output_token_ids)
        for s in p.stop:
            at = seq.text.find(s)
            if at >= 0:
                seq.text = seq.text[:at]
                return "stop"
    if seq.num_output_tokens >= p.max_tokens:
        return "length"
    if len(seq) >= max_model_len:
        return "length"
    return None
