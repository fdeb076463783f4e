"""A request's prompts into the engine's sequences (upstream's renderer and
input preprocessing): the request's id, the prompt's tokens as the request
asks for them (add_special_tokens, truncate_prompt_tokens), its bad words'
tokens, and n checked sequences with their max_tokens capped at the context."""
from __future__ import annotations

import secrets

from fastapi import Request

from engine.entrypoints.openai.protocol import _Sampling
from engine.entrypoints.openai.request_id import header_id
from engine.entrypoints.openai.serving_engine import (
    APIError,
    ServerState,
    check_prompt_fits,
    lora_request,
)
from engine.sampling_params import StructuredOutputsParams


def request_id(request: Request, body: _Sampling) -> str:
    """The request's id as upstream names it: the body's request_id, else
    the X-Request-Id header's, else a random one."""
    return body.request_id or header_id(request.headers) or secrets.token_hex(16)


async def prompt_ids(state: ServerState, body: _Sampling, prompt, add_special_tokens: bool
                     ) -> list[int] | str:
    """A prompt as the engine will take it: the text itself when nothing
    changes its tokens, else its ids, truncated to the last
    truncate_prompt_tokens (the tokenizer's special tokens kept, as
    transformers truncates from the left)."""
    k = body.truncate_prompt_tokens
    if isinstance(prompt, str) and not prompt:
        raise APIError(400, "prompt: Either prompt or prompt_embeds must be provided and "
                       "non-empty.", "prompt")
    if k == -1:
        k = state.max_model_len
    if k is not None and k > state.max_model_len:
        raise APIError(400, f"truncate_prompt_tokens: at most max_model_len "
                       f"({state.max_model_len}), got {k}", "truncate_prompt_tokens")
    if not isinstance(prompt, str):  # token ids: no special tokens to add
        return list(prompt) if k is None else list(prompt)[-k:] if k else []
    if k is None:
        return prompt if add_special_tokens else await _tokenize(state, prompt, False)
    plain = await _tokenize(state, prompt, False)
    full = await _tokenize(state, prompt, True) if add_special_tokens else plain
    at = next((i for i in range(len(full) - len(plain) + 1)
               if full[i:i + len(plain)] == plain), 0)
    head, tail = full[:at], full[at + len(plain):]
    keep = max(k - len(head) - len(tail), 0)
    return head + (plain[len(plain) - keep:] if keep else []) + tail


async def _tokenize(state: ServerState, text: str, add_special_tokens: bool) -> list[int]:
    check_prompt_fits(state, text, "prompt")
    try:
        return await state.llm.tokenize(text, add_special_tokens)
    except ValueError as exc:
        raise APIError(400, f"prompt: {exc}", "prompt") from None


def bad_words_ids(state: ServerState, words: list[str] | None) -> list[list[int]] | None:
    """Each bad word's token ids, alone and after a space (as upstream's)."""
    if not words:
        return None
    tok, out = state.llm.tokenizer, []
    for word in words:
        for text in (word.lstrip(), " " + word.lstrip()):
            ids = tok.encode(text, add_special_tokens=False).ids
            if ids and ids not in out:
                out.append(ids)
    return out


async def make_sequences(state: ServerState, body: _Sampling, prompt, prompt_index: int,
                         max_tokens: int | None, default_max_tokens, rid: str | None = None,
                         add_special_tokens: bool = True,
                         constraint: StructuredOutputsParams | None = None) -> list:
    """body.n requests of one prompt. max_tokens: what the request asked
    for, None for default_max_tokens(prompt length) (or the model's
    generation config's); either is capped at the context left after the
    prompt, as upstream's. rid: the request's id (request_id()); constraint:
    the output's (serving_engine.output_constraint)."""
    llm = state.llm
    if max_tokens is not None and max_tokens > state.max_model_len:  # upstream's one 400
        raise APIError(400, f"max_tokens={max_tokens} cannot be greater than max_model_len="
                       f"{state.max_model_len}. Please request fewer output tokens.",
                       "max_tokens")
    prompt = await prompt_ids(state, body, prompt, add_special_tokens)
    if isinstance(prompt, str):
        check_prompt_fits(state, prompt, "prompt")
    defaults = llm.model_config.generation_defaults
    try:
        params = [body.sampling_params(max_tokens or max(body.min_tokens, 1), j, defaults)
                  for j in range(body.n)]
    except ValueError as exc:
        raise APIError(400, str(exc), str(exc).split(" ")[0].rstrip(":")) from None
    for p in params:
        p.bad_words_token_ids = bad_words_ids(state, body.bad_words)
        p.structured_outputs = constraint
    base = f"{rid}-{prompt_index}-" if rid else None
    try:
        first = await llm.make_request(prompt, params[0], prompt_index, request_id=base)
        ids = first.token_ids  # the prompt tokenized once for all n
        seqs = [first] + [await llm.make_request(ids, p, prompt_index, request_id=base)
                          for p in params[1:]]
    except ValueError as exc:
        raise APIError(400, str(exc), "prompt") from None
    lora = lora_request(state, body.model)
    for s in seqs:
        s.lora_request = lora
    for s in seqs[1:]:
        s.prompt = first.prompt
    n = seqs[0].num_prompt_tokens
    room = state.max_model_len - n
    if max_tokens is None:
        max_tokens = default_max_tokens(n)
        if "max_tokens" in defaults:
            max_tokens = min(max_tokens, defaults["max_tokens"])
    if max_tokens > room or seqs[0].params.max_tokens != max_tokens:
        max_tokens = max(1, min(max_tokens, room))
        for s in seqs:
            s.params.max_tokens = max_tokens
            s.params.min_tokens = min(s.params.min_tokens, max_tokens)
    return seqs
