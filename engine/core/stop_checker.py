"""When the core ends a sequence (upstream's check_stop): an end-of-sequence
token, a stop token, its token budget, or the model's context. Nothing but the
budget and the context ends a sequence before its min_tokens. Stop strings
are text: the front end's detokenizer finds them (engine/core/detokenizer.py)
and aborts the request in the core."""
from __future__ import annotations

from engine.core.sequence import RequestStatus, Sequence


def check_stop(seq: Sequence, token: int, eos_token_ids, max_model_len: int
               ) -> RequestStatus | None:
    """The finished status after `token` joined `seq`, or None to go on; a stop
    token is kept in seq.stop_reason."""
    p = seq.params
    may_stop = seq.num_output_tokens >= p.min_tokens
    if may_stop and not p.ignore_eos and token in eos_token_ids:
        return RequestStatus.FINISHED_STOPPED
    if may_stop and token in p.stop_token_ids:
        seq.stop_reason = token
        return RequestStatus.FINISHED_STOPPED
    if seq.num_output_tokens >= p.max_tokens or len(seq) >= max_model_len:
        return RequestStatus.FINISHED_LENGTH_CAPPED
    return None
