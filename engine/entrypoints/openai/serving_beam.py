"""Beam search (`use_beam_search`), as upstream's OpenAIServing.beam_search:
on top of the engine, not inside it. Each step asks the engine for one token
of every live beam with its 2 x beam_width best alternatives (logprobs), and
keeps the beam_width best continuations by score, cumulative logprob over
length ** length_penalty (the prompt counted, as upstream's); a beam that
meets end-of-sequence is complete. The answer: the beam_width (n) best of
the complete and live beams. Each step's requests read the beams' prompts
from the prefix cache, so a step costs a beam's new tokens, not its prompt."""
from __future__ import annotations

from dataclasses import dataclass, field

from engine.entrypoints.openai.serving_engine import APIError, ServerState, admit, release, run
from engine.sampling_params import SamplingParams


@dataclass
class Beam:
    tokens: list[int]
    cum_logprob: float = 0.0
    logprobs: list = field(default_factory=list)  # per new token (logprob, top), as the engine's
    finish_reason: str | None = None
    stop_reason: int | None = None


def score(beam: Beam, eos: tuple[int, ...], length_penalty: float) -> float:
    n = len(beam.tokens) - (1 if beam.tokens and beam.tokens[-1] in eos else 0)
    return beam.cum_logprob / (max(n, 1) ** length_penalty)


def check_beam_request(state: ServerState, body, constrained: bool = False) -> None:
    """What beam search cannot be combined with (400 naming the field);
    constrained: the request has a structured output (response_format,
    structured_outputs, guided_*, a required or named tool_choice), which
    beams are not drafted under."""
    width = body.n
    bound = state.options.max_logprobs
    if constrained:
        raise APIError(400, "use_beam_search: not with a structured output (response_format, "
                       "structured_outputs, guided_*, tool_choice required or named)",
                       "use_beam_search")
    if bound != -1 and 2 * width > bound:
        raise APIError(400, f"n: beam search asks the engine for 2 x n alternatives per step; "
                       f"at most n={bound // 2} with --max-logprobs {bound}", "n")


async def beam_search(state: ServerState, prompt: list[int], width: int, max_tokens: int,
                      body, live: list) -> list[Beam]:
    """The `width` best beams after `prompt` (token ids); live: the
    engine requests in flight, for the caller to release on a disconnect."""
    llm = state.llm
    eos = tuple(llm.model_config.eos_token_ids)
    ignore_eos = bool(body.ignore_eos)
    penalty = float(getattr(body, "length_penalty", 1.0) or 1.0)
    temperature = body.temperature or 0.0
    beams, done = [Beam(list(prompt))], []
    room = state.max_model_len - len(prompt)
    for _ in range(max(min(max_tokens, room), 0)):
        params = SamplingParams(temperature=temperature, max_tokens=1, logprobs=2 * width)
        try:
            seqs = [await llm.make_request(b.tokens, params) for b in beams]
        except ValueError as exc:
            raise APIError(400, str(exc), "prompt") from None
        live[:] = seqs
        admit(state, seqs, "n")
        try:
            async for _ in run(state, seqs):
                pass
        finally:
            release(state, seqs)
        grown = []
        for beam, seq in zip(beams, seqs):
            _, top = seq.logprobs[0]
            for token, lp in top:
                new = Beam(beam.tokens + [token], beam.cum_logprob + lp,
                           beam.logprobs + [(lp, top)])
                if token in eos and not ignore_eos:
                    new.finish_reason, new.stop_reason = "stop", None
                    done.append(new)
                else:
                    grown.append(new)
        beams = sorted(grown, key=lambda b: score(b, eos, penalty), reverse=True)[:width]
        if not beams:
            break
    for b in beams:
        b.finish_reason = "length"
    best = sorted(done + beams, key=lambda b: score(b, eos, penalty), reverse=True)[:width]
    return best


async def beam_answer(state: ServerState, body, request, name: str, prompts: list[list[int]],
                      chat: bool, constraint=None):
    """A completion (or chat completion) of the best n beams of each prompt,
    streamed with stream=true (as chunks once the search ends: _chunks);
    constraint: the request's structured output, refused (check_beam_request)."""
    from engine.entrypoints.openai.logprobs import chat_logprobs, completion_logprobs
    from engine.entrypoints.openai.serving_engine import full_answer, sse, unless_disconnected

    check_beam_request(state, body, constraint is not None)
    tok = state.llm.tokenizer
    eos = tuple(state.llm.model_config.eos_token_ids)
    live: list = []
    asked = body.max_new_tokens() if chat else body.max_tokens

    async def work() -> dict:
        choices: list[dict] = []
        prompt_tokens = completion_tokens = 0
        for ids in prompts:
            max_tokens = asked or (state.max_model_len - len(ids) if chat else 16)
            beams = await beam_search(state, ids, body.n, max_tokens, body, live)
            prompt_tokens += len(ids)
            for b in beams:
                out = b.tokens[len(ids):]
                shown = out[:-1] if out and out[-1] in eos else out
                completion_tokens += len(out)
                k = body.num_logprobs()
                entries = [(lp, top[:k]) for lp, top in b.logprobs] if k is not None else None
                choice: dict = {"index": len(choices), "finish_reason": b.finish_reason,
                                "stop_reason": b.stop_reason}
                if chat:
                    choice["message"] = {"role": state.options.response_role,
                                         "content": tok.decode(shown)}
                    choice["logprobs"] = (chat_logprobs(tok, out, entries)
                                          if entries is not None else None)
                else:
                    choice["text"] = tok.decode(shown)
                    choice["logprobs"] = (completion_logprobs(tok, out, entries)
                                          if entries is not None else None)
                if body.return_token_ids:
                    choice["token_ids"] = out
                choices.append(choice)
        answer = full_answer("chatcmpl" if chat else "cmpl",
                             "chat.completion" if chat else "text_completion", name, choices, [])
        answer["usage"] = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                           "total_tokens": prompt_tokens + completion_tokens}
        return answer

    if body.stream:
        return sse(_chunks(work(), body, chat), state, live)
    return await unless_disconnected(request, work(), state, live)


async def _chunks(work, body, chat: bool):
    """The answer as upstream's stream generator sends a finished output: for
    chat, a role chunk per choice, then each choice's whole text with its
    finish_reason; for completions, each choice's chunk; then the usage chunk
    when stream_options asks (on every chunk with continuous_usage_stats).
    Upstream streams chat's beams so; its completions answer a JSON body,
    which the SDK's stream reads as no chunks: here they stream too."""
    from engine.entrypoints.openai.serving_engine import wants_usage

    answer = await work
    head = {k: answer[k] for k in ("id", "object", "created", "model")}
    head["object"] = "chat.completion.chunk" if chat else "text_completion"
    o = body.stream_options
    every = answer["usage"] if o is not None and o.include_usage and o.continuous_usage_stats \
        else None
    chunks = []
    for ch in answer["choices"]:
        if chat:
            message = ch.pop("message")
            chunks.append({"index": ch["index"], "delta": {"role": message["role"],
                                                           "content": ""},
                           "logprobs": None, "finish_reason": None})
            ch["delta"] = {"content": message["content"]}
    chunks += answer["choices"]
    for c in chunks:
        yield {**head, "choices": [c], **({"usage": every} if every else {})}
    if wants_usage(body):
        yield {**head, "choices": [], "usage": answer["usage"]}
