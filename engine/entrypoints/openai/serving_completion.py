"""POST /v1/completions: prompts in, completions out, whole or streamed."""
from __future__ import annotations

from fastapi import Request

from engine.entrypoints.openai.protocol import CompletionRequest
from engine.entrypoints.openai.serving_engine import (APIError, Chunks, ServerState,
                                                      StreamedText, check_request,
                                                      error_response, full_answer,
                                                      make_sequences, run, run_to_end, sse,
                                                      unless_disconnected, usage, wants_usage)


async def create_completion(state: ServerState, body: CompletionRequest, request: Request):
    name = check_request(state, body)
    prompts = body.prompts()
    if not prompts:
        raise APIError(400, "prompt: give at least one prompt", "prompt")
    seqs = []
    for i, prompt in enumerate(prompts):
        seqs += make_sequences(state, body, prompt, i, body.max_tokens or 16)
    echoed = [p if isinstance(p, str) and body.echo else "" for p in prompts
              for _ in range(body.n)]
    if body.stream:
        return sse(_stream(state, seqs, name, body, echoed))
    return await unless_disconnected(request, _full(state, seqs, name, echoed))


async def _full(state: ServerState, seqs, name: str, echoed: list[str]):
    dead = await run_to_end(state, seqs)
    if dead is not None:
        return error_response(500, dead)
    choices = [{"index": i, "text": echoed[i] + state.llm.core.output_text(s), "logprobs": None,
                "finish_reason": s.finish_reason} for i, s in enumerate(seqs)]
    return full_answer("cmpl", "text_completion", name, choices, seqs)


async def _stream(state: ServerState, seqs, name: str, body, echoed: list[str]):
    chunk = Chunks("cmpl", "text_completion", name)
    texts = [StreamedText(state.llm.core.tokenizer, s) for s in seqs]
    for i, prefix in enumerate(echoed):
        if prefix:
            yield chunk([{"index": i, "text": prefix, "logprobs": None, "finish_reason": None}])
    async for i, update in run(state, seqs):
        delta = texts[i].add(update)
        if delta or update.finish_reason is not None:
            yield chunk([{"index": i, "text": delta, "logprobs": None,
                          "finish_reason": update.finish_reason}])
    if wants_usage(body):
        yield chunk([], usage(seqs))
