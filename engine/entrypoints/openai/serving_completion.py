"""POST /v1/completions: prompts in, completions out, whole or streamed.

echo puts the prompt before the answer; with logprobs the prompt's tokens
come first in them, the first one's null (nothing before it scores it), as
upstream's. max_tokens 0 (with echo) scores the prompt alone: the engine
samples one token, which the answer leaves out."""
from __future__ import annotations

from fastapi import Request

from engine.entrypoints.openai.logprobs import (
    AsTokenIds,
    completion_logprobs,
    prompt_entries,
    vllm_prompt_logprobs,
)
from engine.entrypoints.openai.protocol import CompletionRequest
from engine.entrypoints.openai.serving_beam import beam_answer
from engine.entrypoints.openai.serving_engine import (
    APIError,
    Chunks,
    ServerState,
    admit,
    check_fan_out,
    check_request,
    failure_response,
    full_answer,
    output_constraint,
    run,
    run_to_end,
    sse,
    unless_disconnected,
    usage,
    usage_per_chunk,
    wants_usage,
)
from engine.entrypoints.openai.serving_inputs import make_sequences, prompt_ids, request_id

DEFAULT_MAX_TOKENS = 16  # the OpenAI completions API's default


async def create_completion(state: ServerState, body: CompletionRequest, request: Request):
    name = check_request(state, body)
    prompts = body.prompts()
    if not prompts:
        raise APIError(400, "prompt: give at least one prompt", "prompt")
    score_only = body.max_tokens == 0
    param = "prompt" if len(prompts) > 1 else "n"
    check_fan_out(state, len(prompts) * body.n, param)  # before tokenizing 100,000 prompts
    constraint = await output_constraint(body)
    if body.use_beam_search:
        ids = [await prompt_ids(state, body, p, body.add_special_tokens) for p in prompts]
        return await beam_answer(state, body, request, name,
                                 [await _ids(state, p) for p in ids], chat=False,
                                 constraint=constraint)
    seqs = []
    rid = request_id(request, body)
    for i, prompt in enumerate(prompts):
        seqs += await make_sequences(state, body, prompt, i,
                                     1 if score_only else body.max_tokens,
                                     lambda n: DEFAULT_MAX_TOKENS, rid, body.add_special_tokens,
                                     constraint)
    tok = state.llm.tokenizer
    # echo: the prompt as given, or its ids decoded
    echoed = [(p if isinstance(p, str) else tok.decode(p)) if body.echo else ""
              for p in prompts for _ in range(body.n)]
    as_ids = body.return_tokens_as_token_ids
    answer = _Answer(state, bool(body.echo), score_only,
                     state.options.tokens_as_ids if as_ids is None else as_ids,
                     bool(body.return_token_ids))
    admit(state, seqs, param)
    if body.stream:
        return sse(_stream(state, seqs, name, body, echoed, answer, rid), state, seqs)
    return await unless_disconnected(request, _full(state, seqs, name, echoed, answer, rid),
                                     state, seqs)


async def _ids(state: ServerState, prompt) -> list[int]:
    """A prompt's token ids, as the engine would tokenize it (beam search
    works on ids)."""
    if not isinstance(prompt, str):
        return list(prompt)
    try:
        return await state.llm.tokenize(prompt)
    except ValueError as exc:
        raise APIError(400, f"prompt: {exc}", "prompt") from None


class _Answer:
    """What of a sequence's tokens an answer shows: the prompt's first when
    echoed, the output's unless the prompt is scored alone."""

    def __init__(self, state: ServerState, echo: bool, score_only: bool,
                 tokens_as_ids: bool = False, token_ids: bool = False):
        # return_tokens_as_token_ids: logprobs name tokens "token_id:N"
        self.tokenizer = AsTokenIds() if tokens_as_ids else state.llm.tokenizer
        self.echo, self.score_only, self.token_ids = echo, score_only, token_ids

    def ids(self, seq, new_ids: list[int], first: bool) -> dict:
        """return_token_ids: the prompt's ids (once) and the output's."""
        if not self.token_ids:
            return {}
        out = {"token_ids": list(new_ids)}
        if first:
            out["prompt_token_ids"] = seq.token_ids[:seq.num_prompt_tokens]
        return out

    def logprobs(self, seq, new_ids: list[int], new_entries, with_prompt: bool, offset: int):
        if seq.params.logprobs is None:
            return None
        ids, entries = [], []
        if with_prompt and self.echo:
            ids, entries = seq.token_ids[:seq.num_prompt_tokens], prompt_entries(seq)
        if not self.score_only:
            ids, entries = ids + new_ids, entries + new_entries
        return completion_logprobs(self.tokenizer, ids, entries, offset)

    def text(self, text: str) -> str:
        return "" if self.score_only else text

    def prompt_logprobs(self, seq):
        if seq.params.prompt_logprobs is None:
            return None
        return vllm_prompt_logprobs(self.tokenizer, seq)


async def _full(state: ServerState, seqs, name: str, echoed: list[str], answer: _Answer,
                rid: str):
    dead = await run_to_end(state, seqs)
    if dead is not None:
        return failure_response(dead)
    choices = [{"index": i, "text": echoed[i] + answer.text(s.text),
                "logprobs": answer.logprobs(s, s.output_token_ids, s.logprobs, True, 0),
                "finish_reason": s.finish_reason, "stop_reason": s.stop_reason,
                "prompt_logprobs": answer.prompt_logprobs(s),
                **answer.ids(s, s.output_token_ids, True)}
               for i, s in enumerate(seqs)]
    return full_answer("cmpl", "text_completion", name, choices, seqs, rid)


async def _stream(state: ServerState, seqs, name: str, body, echoed: list[str],
                  answer: _Answer, rid: str):
    chunk = Chunks("cmpl", "text_completion", name, rid)
    live_usage = usage_per_chunk(body, seqs)
    offsets = [0] * len(seqs)
    started = [False] * len(seqs)  # the echo goes with a choice's first tokens, as upstream
    async for i, update in run(state, seqs):
        delta = answer.text(update.text)
        first, started[i] = not started[i], True
        if first:
            delta = echoed[i] + delta
        lp = answer.logprobs(seqs[i], update.new_token_ids, update.logprobs or [], first,
                             offsets[i])
        if lp is not None:
            offsets[i] += sum(map(len, lp["tokens"]))
        if delta or lp or update.finish_reason is not None:
            yield chunk([{"index": i, "text": delta, "logprobs": lp,
                          "finish_reason": update.finish_reason,
                          "stop_reason": update.stop_reason,
                          **answer.ids(seqs[i], update.new_token_ids, first)}], live_usage())
    if wants_usage(body):
        yield chunk([], usage(seqs))
