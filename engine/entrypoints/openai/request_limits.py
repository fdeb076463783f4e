"""Limits that refuse a request before the server does real work on it: a body
too large to read (413, before it is read), and a prompt too long to fit the
model's context however it tokenizes (before it is tokenized).

Neither needs the engine: BodySizeLimit wraps any ASGI app, and the prompt
bound is a byte count against a number taken from the tokenizer once."""
from __future__ import annotations

import asyncio
import json
from collections import deque
from contextlib import nullcontext

from engine.core import cpu_share

MIB = 1 << 20
# A body this large keeps the API server busy for a while (parsing, validation,
# tokenization): marked for the engine core as such (engine/core/cpu_share.py),
# from its first byte: a step that began beside its 35 ms of reading and parsing
# on a full team waited for a descheduled thread (a one-token completion 150-270 ms)
HEAVY_BODY_BYTES = MIB

# A prompt of max_model_len tokens sent as JSON text: ~4 bytes a token for English,
# up to ~12 for CJK or emoji once a client escapes it as \uXXXX (Python's json does
# by default), and a run-of-spaces or code token can be 16+ bytes; 64 a token is
# room for the worst of these across a whole context.
JSON_BYTES_PER_TOKEN = 64
# the rest of a request: chat roles and JSON structure, stop strings, logit_bias
BODY_HEADROOM_BYTES = MIB

FLAG = "--max-request-body-bytes"


def default_max_body_bytes(max_model_len: int) -> int:
    """The body limit when none is given: a context-filling prompt, escaped, and
    the rest of the request. A batch of prompts (/v1/completions with a list)
    may need more: FLAG raises it."""
    return BODY_HEADROOM_BYTES + max_model_len * JSON_BYTES_PER_TOKEN


DRAIN_BYTES = 64 << 20
DRAIN_S = 5.0


class BodySizeLimit:
    """ASGI middleware: 413, OpenAI-shaped, for a request body over max_bytes.
    A declared Content-Length over it is refused before a byte of the body is
    read; a body without one (chunked) is read here, up to max_bytes, before the
    app sees any of it, and refused once it passes them.

    Pure ASGI, not Starlette's BaseHTTPMiddleware: that one hides a client's
    disconnect from the endpoints, which stop generating on it."""

    def __init__(self, app, max_bytes: int):
        if max_bytes < 1:
            raise ValueError(f"{FLAG} must be at least 1, got {max_bytes}")
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":  # websocket, lifespan
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope["headers"])
        if declared is not None:
            if declared > self.max_bytes:
                await self._refuse(send, f"the request body is {declared} bytes", receive)
                return
            # the server ends the body at Content-Length: nothing to count. A large
            # one is parsed, validated and tokenized at length, whichever thread does it
            with cpu_share.heavy(True) if declared > HEAVY_BODY_BYTES else nullcontext():
                await self.app(scope, receive, send)
            return
        held: deque = deque()
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # http.disconnect: nobody to answer
                return
            size += len(message.get("body", b""))
            if size > self.max_bytes:
                await self._refuse(send, f"the request body is at least {size} bytes",
                                   receive if message.get("more_body", False) else None)
                return
            held.append(message)
            if not message.get("more_body", False):
                break

        async def replay():
            # the body as it came, then the server's own messages (a disconnect)
            return held.popleft() if held else await receive()

        with cpu_share.heavy(True) if size > HEAVY_BODY_BYTES else nullcontext():
            await self.app(scope, replay, send)

    async def _refuse(self, send, what: str, receive=None) -> None:
        message = f"{what}; this server takes at most {self.max_bytes} ({FLAG})"
        body = json.dumps({"error": {"message": message, "type": "RequestEntityTooLarge",
                                     "param": None, "code": 413}}).encode()
        # Connection: close: the connection cannot carry another request
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(body)).encode()),
                                (b"connection", b"close")]})
        if receive is not None:
            await _drain(receive)
        await send({"type": "http.response.body", "body": body})


async def _drain(receive) -> None:
    """Read and drop what is left of a refused body, within DRAIN_BYTES and
    DRAIN_S (nginx's lingering close): a client sends its whole body before it
    reads the answer (httpx, requests, the OpenAI SDK), and closing on unread
    bytes makes the kernel reset the connection, the 413 with it."""
    async def drop() -> None:
        left = DRAIN_BYTES
        while left > 0:
            message = await receive()
            if message["type"] != "http.request" or not message.get("more_body", False):
                return
            left -= len(message.get("body", b""))

    try:
        await asyncio.wait_for(drop(), DRAIN_S)
    except asyncio.TimeoutError:
        pass


def _content_length(headers) -> int | None:
    for name, value in headers:
        if name.lower() == b"content-length":
            try:
                return int(value)
            except ValueError:  # the server refuses a malformed one itself
                return None
    return None


# ---- prompts too long to tokenize -------------------------------------------

# Unicode normalization and case mapping can leave a quarter of the bytes ("𝐀",
# 4 bytes, is NFKC's "A"; the Kelvin sign, 3, lowercases to "k"), so each one in a
# tokenizer's normalizer divides the bytes a token can stand for by 4
_SHRINKS = {"NFC", "NFD", "NFKC", "NFKD", "Lowercase"}
_GROWS = {"Prepend", "ByteLevel"}
# pre-tokenizers that split text without dropping any (Whitespace, WhitespaceSplit,
# BertPreTokenizer and CharDelimiterSplit drop what they split on)
_KEEPS_TEXT = {"ByteLevel", "Metaspace", "Split", "Digits", "Punctuation",
               "UnicodeScripts", "Sequence"}
# a lone token's decode may lose a leading space or "▁" that its text had
# (Metaspace, Strip, BPEDecoder's suffix); a few bytes of slack cover them
_DECODE_SLACK = 4


def max_token_bytes(tokenizer) -> int | None:
    """The most UTF-8 bytes of prompt text one token can stand for, for a
    `tokenizers.Tokenizer`; None when no such bound exists (an unknown-token
    model that swallows any run of text, a normalizer or pre-tokenizer that
    drops text). Decodes every id (byte-level "Ġ" tokens are bytes, not their
    vocabulary spelling): call it once, at start-up."""
    shrink = _shrink_factor(tokenizer)
    if shrink is None:
        return None
    ids = sorted(set(tokenizer.get_vocab(with_added_tokens=True).values()))
    texts = tokenizer.decode_batch([[i] for i in ids], skip_special_tokens=False)
    longest = max((len(t.encode("utf-8", "surrogatepass")) for t in texts), default=0)
    return (longest + _DECODE_SLACK) * shrink


def prompt_surely_too_long(text: str, max_model_len: int, max_tok_bytes: int | None) -> bool:
    """True when text is more tokens than max_model_len however it tokenizes: it
    has more UTF-8 bytes than max_model_len tokens of max_tok_bytes each. Never
    encodes more than a slice of text at a time."""
    if max_tok_bytes is None:
        return False
    limit = max_model_len * max_tok_bytes
    chars = len(text)
    if chars > limit:  # a character is at least one byte
        return True
    if chars * 4 <= limit or text.isascii():  # and at most four; ASCII exactly one
        return False
    total, step = 0, MIB
    for start in range(0, chars, step):
        total += len(text[start:start + step].encode("utf-8", "surrogatepass"))
        if total > limit:
            return True
    return False


def _shrink_factor(tokenizer) -> int | None:
    """How many times fewer bytes the model can see than the text had (1 when
    none), or None when text can vanish or hide in an unknown token."""
    factor = _normalizer_shrink(_state(tokenizer.normalizer))
    pre = _state(tokenizer.pre_tokenizer)
    if factor is None or not _keeps_text(pre):
        return None
    model = tokenizer.model
    kind = type(model).__name__
    if kind == "BPE":
        # byte-level BPE has every byte in its alphabet; byte_fallback spells an
        # unknown character in byte tokens; any other BPE drops or <unk>s it
        byte_level = "ByteLevel" in _types(pre) or "ByteLevel" in _types(
            _state(tokenizer.normalizer))
        return factor if model.byte_fallback or byte_level else None
    if kind == "Unigram":
        return factor if json.loads(model.__getstate__()).get("byte_fallback") else None
    return None  # WordPiece, WordLevel: a word past the vocabulary is one [UNK]


def _state(component) -> dict | None:
    return None if component is None else json.loads(component.__getstate__())


def _types(state: dict | None) -> list[str]:
    if state is None:
        return []
    children = state.get("normalizers") or state.get("pretokenizers") or []
    return [state["type"]] + [t for child in children for t in _types(child)]


def _normalizer_shrink(state: dict | None) -> int | None:
    if state is None:
        return 1
    kind = state["type"]
    if kind == "Sequence":
        factor = 1
        for child in state["normalizers"]:
            step = _normalizer_shrink(child)
            if step is None:
                return None
            factor *= step
        return factor
    if kind in _SHRINKS:
        return 4
    if kind in _GROWS:
        return 1
    if kind == "Replace":  # a fixed string by one at least as long never shrinks text
        pattern = state["pattern"].get("String")
        content = state["content"]
        return 1 if pattern is not None and len(content.encode()) >= len(
            pattern.encode()) else None
    return None  # Strip, StripAccents, BertNormalizer, Precompiled, ...: drop text


def _keeps_text(state: dict | None) -> bool:
    if state is None:
        return True
    if state["type"] not in _KEEPS_TEXT or state.get("behavior") == "Removed":
        return False
    return all(_keeps_text(child) for child in state.get("pretokenizers", []))
