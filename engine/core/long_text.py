"""Token ids of a long text in bounded memory.

A tokenizers Encoding keeps ~260 bytes per token (offsets, token strings,
masks), and the allocator keeps the pages: a 10 MB /tokenize took the API
server from 0.27 to 2.3 GB and left it there. So a long text is encoded in
windows of WINDOW characters, each freed before the next, and stitched.

Stitching is exact, not a guess at where the pre-tokenizer splits: two
windows overlap by OVERLAP characters, and they are joined at a character
offset where both encodings end one token and start the next, with the
same tokens on either side for MATCH tokens. Tokenization is local (a token
depends on the text around it, not on text thousands of characters away),
so a boundary both windows agree on well inside their overlap is one the
whole text has too. A text where no such boundary turns up (one enormous
word, a tokenizer that swallows whole runs) is encoded whole.
"""
from __future__ import annotations

WINDOW = 1 << 16  # characters
OVERLAP = 1 << 12
MATCH = 8  # tokens either side of the join that both windows must share


def encode_long(tokenizer, text: str, add_special_tokens: bool = True) -> list[int]:
    """tokenizer.encode(text).ids, computed window by window. encode_batch
    releases the GIL, for the threads (an event loop) beside this one; the
    stitching asks each encoding for a few tokens, never for all its offsets
    (Python work here holds the GIL, and the event loop waits for it)."""
    def enc(part: str, special: bool = False):
        return tokenizer.encode_batch([part], add_special_tokens=special)[0]

    if len(text) <= WINDOW + OVERLAP:
        return enc(text, add_special_tokens).ids
    head, tail = _specials(tokenizer) if add_special_tokens else ([], [])
    ids: list[int] = list(head)
    start, taken_from = 0, 0  # the window's first character; the first token it adds
    window = enc(text[:WINDOW])
    window_ids = window.ids
    while True:
        end = start + WINDOW
        if end >= len(text):
            ids += window_ids[taken_from:]
            break
        nxt_start = end - OVERLAP
        nxt = enc(text[nxt_start:nxt_start + WINDOW])
        nxt_ids = nxt.ids
        join = _join(window, window_ids, start, nxt, nxt_ids, nxt_start)
        if join is None:
            return enc(text, add_special_tokens).ids
        upto, resume = join
        ids += window_ids[taken_from:upto]
        window, window_ids, start, taken_from = nxt, nxt_ids, nxt_start, resume
    return ids + tail


def _join(a, a_ids: list[int], a_start: int, b, b_ids: list[int],
          b_start: int) -> tuple[int, int] | None:
    """(tokens of a to keep, first token of b to take) at a token start both
    encodings share inside their overlap, away from its edges, with the same
    MATCH tokens either side."""
    lo, hi = b_start + OVERLAP // 4, a_start + WINDOW - OVERLAP // 4
    i = None
    for c in range(lo, hi):  # characters no token covers (spaces a pre-tokenizer drops)
        if (i := a.char_to_token(c - a_start)) is not None:
            break
    while i is not None and i < len(a_ids) - MATCH:
        s, _ = a.token_to_chars(i)
        if a_start + s > hi:
            return None
        j = b.char_to_token(a_start + s - b_start)
        if (j is not None and i >= MATCH and j >= MATCH
                and b.token_to_chars(j)[0] == a_start + s - b_start
                and a_ids[i - MATCH:i + MATCH] == b_ids[j - MATCH:j + MATCH]):
            return i, j
        i += 1
    return None


def _specials(tokenizer) -> tuple[list[int], list[int]]:
    """The special tokens the tokenizer's post-processor puts before and after
    one sequence (BOS, EOS...), learnt from a probe text."""
    bare = tokenizer.encode("a", add_special_tokens=False).ids
    full = tokenizer.encode("a", add_special_tokens=True).ids
    for i in range(len(full) - len(bare) + 1):
        if full[i:i + len(bare)] == bare:
            return full[:i], full[i + len(bare):]
    raise ValueError("the tokenizer's special tokens cannot be told apart from its text")
