"""Prompts into checked requests (upstream V1's Processor): tokenized with
the model's tokenizer, their token ids and sampling fields checked against
the model, before anything reaches the engine core."""
from __future__ import annotations

import re

from engine.core import cpu_share
from engine.core.long_text import encode_long
from engine.core.output_processor import RequestState
from engine.pooling_params import NO_SAMPLING, PoolingParams
from engine.sampling_params import MAX_LOGPROBS, SamplingParams

# Texts longer than this are tokenized in a worker thread by encode_batch
# (long_text.encode_long), which releases the GIL (encode holds it: a 6 MB
# prompt froze the server's event loop for 9 s); shorter ones cost less than
# the thread hop.
OFFLOAD_CHARS = 16_384
# JSON's "\ud800" decodes to a lone surrogate (a pair decodes to its one
# character): not Unicode text, and the tokenizer's TypeError was a 500
_SURROGATE = re.compile("[\ud800-\udfff]")


# characters a regex search covers in one call: re's C code holds the GIL for
# a whole call (36 ms over a 10 MB prompt, the event loop frozen meanwhile),
# and a thread waiting for the GIL gets it between calls
SEARCH_CHARS = 1 << 20


def check_unicode(text: str, what: str) -> None:
    """ValueError naming `what` when text holds a lone UTF-16 surrogate."""
    bad = None
    for pos in range(0, len(text), SEARCH_CHARS):  # a surrogate is one character: no overlap
        if (bad := _SURROGATE.search(text, pos, pos + SEARCH_CHARS)) is not None:
            break
    if bad is not None:
        raise ValueError(f"{what} holds a lone UTF-16 surrogate (U+{ord(bad.group()):04X}) at "
                         f"character {bad.start()}; send valid Unicode (surrogates in pairs)")


def load_tokenizer(path):
    """The checkpoint's tokenizer.json (ValueError when it has none)."""
    from tokenizers import Tokenizer

    file = path / "tokenizer.json"
    if not file.is_file():
        raise ValueError(f"{path} has no tokenizer.json")
    return Tokenizer.from_file(str(file))


class InputProcessor:
    def __init__(self, tokenizer, vocab_size: int, max_model_len: int,
                 max_logprobs: int = MAX_LOGPROBS):
        """max_logprobs: the most alternatives a request may ask for (-1: the vocabulary)."""
        self.tokenizer, self.vocab_size, self.max_model_len = tokenizer, vocab_size, max_model_len
        self.max_logprobs = vocab_size if max_logprobs == -1 else max_logprobs

    def tokenize(self, text: str, add_special_tokens: bool = True) -> list[int]:
        check_unicode(text, "the text")
        if len(text) > OFFLOAD_CHARS:  # the GIL released, and memory bounded by a window
            return encode_long(self.tokenizer, text, add_special_tokens)
        return self.tokenizer.encode(text, add_special_tokens=add_special_tokens).ids

    async def tokenize_async(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """tokenize(), off the event loop when the text is long."""
        if len(text) <= OFFLOAD_CHARS:
            return self.tokenize(text, add_special_tokens)
        return await cpu_share.in_thread(self.tokenize, text, add_special_tokens)

    def pooling_request(self, request_id: str, prompt, params: PoolingParams, index: int = 0,
                        pair: str | None = None, token_types: bool = False,
                        add_special_tokens: bool = True) -> RequestState:
        """A checked pooling request: a text (with `pair`, a cross-encoder's
        pair, tokenized as the model's tokenizer joins two texts) or token
        ids; ValueError naming input {index} when it cannot run. token_types:
        the model reads token types (BERT's), so a pair's are sent."""
        types = None
        if isinstance(prompt, str):
            if pair is None:
                ids, text = self.tokenize(prompt, add_special_tokens), prompt
            else:
                check_unicode(prompt, f"input {index}")
                check_unicode(pair, f"input {index}")
                enc = self.tokenizer.encode(prompt, pair, add_special_tokens=add_special_tokens)
                ids, types, text = enc.ids, enc.type_ids, prompt
        else:
            ids, text = list(prompt), None
            vocab = self.vocab_size
            if any(not isinstance(t, int) or not 0 <= t < vocab for t in ids):
                raise ValueError(f"input {index}: token ids must be integers in [0, {vocab})")
        if not ids:
            raise ValueError(f"input {index} is empty")
        if len(ids) > self.max_model_len:
            raise ValueError(f"input {index} has {len(ids)} tokens; the model takes at most "
                             f"{self.max_model_len}; shorten it")
        if ids and max(ids) >= self.vocab_size:
            raise ValueError(f"input {index}: the tokenizer gave token id {max(ids)}, but the "
                             f"model's vocabulary has {self.vocab_size}")
        state = RequestState(request_id, text, ids, NO_SAMPLING, index, self.tokenizer)
        state.pooling_params = params
        state.token_type_ids = types if token_types and types and any(types) else None
        return state

    def make_request(self, request_id: str, prompt, params: SamplingParams,
                     index: int = 0) -> RequestState:
        """A checked request for a prompt: a string (tokenized with the
        model's special tokens) or a list of token ids; ValueError naming
        the prompt when it cannot run."""
        if isinstance(prompt, str):
            ids, text = self.tokenize(prompt), prompt
        else:
            ids, text = list(prompt), None
        return self.from_token_ids(request_id, ids, params, index, text)

    def from_token_ids(self, request_id: str, ids: list[int], params: SamplingParams,
                       index: int = 0, text: str | None = None) -> RequestState:
        vocab = self.vocab_size
        if text is None and any(not isinstance(t, int) or not 0 <= t < vocab for t in ids):
            raise ValueError(f"prompt {index}: token ids must be integers in [0, {vocab})")
        if text is not None and ids and max(ids) >= vocab:  # a tokenizer larger than the model
            raise ValueError(f"prompt {index}: the tokenizer gave token id {max(ids)}, but the "
                             f"model's vocabulary has {vocab}; the checkpoint's tokenizer does "
                             "not match its config.json")
        if not ids:
            raise ValueError(f"prompt {index} is empty")
        params.check_vocab(vocab)
        for name in ("logprobs", "prompt_logprobs"):
            asked = getattr(params, name)
            if asked is not None and asked > self.max_logprobs:
                raise ValueError(f"{name}: at most {self.max_logprobs} (the server's "
                                 f"--max-logprobs), got {asked}")
        if len(ids) + 1 > self.max_model_len:
            raise ValueError(f"prompt {index} has {len(ids)} tokens; the model's context is "
                             f"{self.max_model_len}")
        return RequestState(request_id, text, ids, params, index, self.tokenizer)
