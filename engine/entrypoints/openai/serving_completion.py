"""POST /v1/completions: prompts in, completions out, whole or streamed."""
from __future__ import annotations

from fastapi import Request

from engine.entrypoints.openai.logprobs import completion_logprobs
from engine.entrypoints.openai.protocol import CompletionRequest
from engine.entrypoints.openai.serving_engine import (APIError, Chunks, ServerState, admit,
                                                      StreamedText, check_request,
                                                      error_response, full_answer,
                                                      make_sequences, run, run_to_end, sse,
                                                      unless_disconnected, usage,
                                                      usage_per_chunk, wants_usage)

DEFAULT_MAX_TOKENS = 16  # the OpenAI completions API's default


async def create_completion(state: ServerState, body: CompletionRequest, request: Request):
    name = check_request(state, body)
    prompts = body.prompts()
    if not prompts:
        raise APIError(400, "prompt: give at least one prompt", "prompt")
    seqs = []
    for i, prompt in enumerate(prompts):
        seqs += make_sequences(state, body, prompt, i, body.max_tokens,
                               lambda n: DEFAULT_MAX_TOKENS)
    tok = state.llm.core.tokenizer
    # echo: the prompt as given, or its ids decoded
    echoed = [(p if isinstance(p, str) else tok.decode(p)) if body.echo else ""
              for p in prompts for _ in range(body.n)]
    admit(state, seqs, "prompt" if len(prompts) > 1 else "n")
    if body.stream:
        return sse(_stream(state, seqs, name, body, echoed), state, seqs)
    return await unless_disconnected(request, _full(state, seqs, name, echoed), state, seqs)


def _logprobs(state, ids, entries, offset):
    if entries is None:
        return None
    return completion_logprobs(state.llm.core.tokenizer, ids, entries, offset)


async def _full(state: ServerState, seqs, name: str, echoed: list[str]):
    dead = await run_to_end(state, seqs)
    if dead is not None:
        return error_response(500, dead)
    choices = [{"index": i, "text": echoed[i] + state.llm.core.output_text(s),
                "logprobs": _logprobs(state, s.output_token_ids,
                                      s.logprobs if s.params.logprobs is not None else None,
                                      len(echoed[i])),
                "finish_reason": s.finish_reason, "stop_reason": s.stop_string}
               for i, s in enumerate(seqs)]
    return full_answer("cmpl", "text_completion", name, choices, seqs)


async def _stream(state: ServerState, seqs, name: str, body, echoed: list[str]):
    chunk = Chunks("cmpl", "text_completion", name)
    live_usage = usage_per_chunk(body, seqs)
    texts = [StreamedText(state.llm.core.tokenizer, s) for s in seqs]
    offsets = [len(e) for e in echoed]
    for i, prefix in enumerate(echoed):
        if prefix:
            yield chunk([{"index": i, "text": prefix, "logprobs": None, "finish_reason": None}],
                        live_usage())
    async for i, update in run(state, seqs):
        delta = texts[i].add(update)
        lp = _logprobs(state, update.new_token_ids, update.logprobs, offsets[i])
        if lp is not None:
            offsets[i] += sum(map(len, lp["tokens"]))
        if delta or lp or update.finish_reason is not None:
            yield chunk([{"index": i, "text": delta, "logprobs": lp,
                          "finish_reason": update.finish_reason,
                          "stop_reason": update.stop_reason}], live_usage())
    if wants_usage(body):
        yield chunk([], usage(seqs))
