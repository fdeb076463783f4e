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
    releases the GIL, for the threads (an event loop) beside this one."""
    def enc(part: str, special: bool = False):
        return tokenizer.encode_batch([part], add_special_tokens=special)[0]

    if len(text) <= WINDOW + OVERLAP:
        return enc(text, add_special_tokens).ids
    ids: list[int] = []
    start, taken_from = 0, 0  # the window's first character; the first token it adds
    window = enc(text[:WINDOW])
    while True:
        end = start + WINDOW
        if end >= len(text):
            ids += window.ids[taken_from:]
            break
        nxt_start = end - OVERLAP
        nxt = enc(text[nxt_start:nxt_start + WINDOW])
        join = _join(window, start, nxt, nxt_start)
        if join is None:
            return enc(text, add_special_tokens).ids
        upto, resume = join
        ids += window.ids[taken_from:upto]
        window, start, taken_from = nxt, nxt_start, resume
    return _with_specials(tokenizer, ids) if add_special_tokens else ids


def _join(a, a_start: int, b, b_start: int) -> tuple[int, int] | None:
    """(tokens of a to keep, first token of b to take) at a boundary both
    encodings share inside their overlap, away from its edges."""
    a_end = a_start + WINDOW
    lo, hi = b_start + OVERLAP // 4, a_end - OVERLAP // 4
    starts_b = {b_start + s: i for i, (s, _) in enumerate(b.offsets)
                if lo <= b_start + s <= hi}
    a_ids, b_ids = a.ids, b.ids
    for i, (s, _) in enumerate(a.offsets):
        j = starts_b.get(a_start + s)
        if j is None or i < MATCH or j < MATCH:
            continue
        if (a_ids[i - MATCH:i + MATCH] == b_ids[j - MATCH:j + MATCH]
                and len(a_ids) >= i + MATCH and len(b_ids) >= j + MATCH):
            return i, j
    return None


def _with_specials(tokenizer, ids: list[int]) -> list[int]:
    """ids with the special tokens the tokenizer's post-processor adds around
    one sequence (BOS, EOS...), learnt from a probe text."""
    bare = tokenizer.encode("a", add_special_tokens=False).ids
    full = tokenizer.encode("a", add_special_tokens=True).ids
    for i in range(len(full) - len(bare) + 1):
        if full[i:i + len(bare)] == bare:
            return full[:i] + ids + full[i + len(bare):]
    raise ValueError("the tokenizer's special tokens cannot be told apart from its text")
