"""`--stream-interval N|auto`: how often a streamed request's reader hears of
its tokens. N: every N tokens, merged into one event (upstream's flag; its
first and last tokens at once). auto (the default): every output the engine
core sends, and a reader that fell behind gets what came meanwhile as one
event, so a busy server writes fewer, larger events instead of queueing."""
from __future__ import annotations


def parse_interval(text: str) -> int | None:
    """`--stream-interval`'s value: a positive token count, or None for auto."""
    if text == "auto":
        return None
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise ValueError(f"--stream-interval must be 'auto' or a positive number of tokens, "
                         f"got {text!r}")
    return n
