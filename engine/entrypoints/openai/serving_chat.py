"""POST /v1/chat/completions: messages rendered by the model's chat template,
the assistant's answer whole or streamed."""
from __future__ import annotations

import asyncio

from fastapi import Request

from engine.core.input_processor import check_unicode
from engine.entrypoints import chat_utils
from engine.entrypoints.openai.logprobs import chat_logprobs, vllm_prompt_logprobs
from engine.entrypoints.openai.protocol import ChatCompletionRequest
from engine.entrypoints.openai.serving_engine import (APIError, Chunks, ServerState, admit,
                                                      check_prompt_fits,
                                                      check_request,
                                                      failure_response, full_answer,
                                                      make_sequences, output_constraint,
                                                      run, run_to_end, sse,
                                                      unless_disconnected, usage,
                                                      usage_per_chunk, wants_usage)

# the template's own arguments: chat_template_kwargs may not name them
RESERVED_KWARGS = {"messages", "add_generation_prompt", "tools", "documents"}


async def create_chat_completion(state: ServerState, body: ChatCompletionRequest,
                                 request: Request):
    name, seqs = await chat_sequences(state, body)
    admit(state, seqs, "n")
    if body.stream:
        return sse(_stream(state, seqs, name, body), state, seqs)
    return await unless_disconnected(request, _full(state, seqs, name), state, seqs)


async def chat_sequences(state: ServerState, body: ChatCompletionRequest):
    """(the served model's name, the checked sequences of the rendered chat)."""
    name = check_request(state, body)
    if state.chat_template is None:
        raise APIError(400, "this model has no chat template (none in its "
                       "tokenizer_config.json or chat_template.jinja); use /v1/completions "
                       "or start the server with --chat-template FILE", "messages")
    kwargs = body.chat_template_kwargs or {}
    clash = sorted(RESERVED_KWARGS & set(kwargs))
    if clash:
        raise APIError(400, f"chat_template_kwargs may not set {', '.join(clash)}: give them "
                       f"as the request's own fields", "chat_template_kwargs")
    messages, template = _messages(body), state.chat_template
    try:  # in a worker thread, bounded in time and size (chat_utils): templates are code
        text = await asyncio.get_running_loop().run_in_executor(None, lambda: chat_utils.render(
            template, messages, add_generation_prompt=body.add_generation_prompt,
            tokens={**state.special_tokens, **kwargs}, tools=None, documents=None))
    except chat_utils.ChatTemplateError as exc:
        raise APIError(400, str(exc), "messages") from None
    check_prompt_fits(state, text, "messages")
    # as transformers' apply_chat_template(tokenize=True): the template
    # already wrote the special tokens it wants
    ids = await state.llm.tokenize(text, add_special_tokens=False)
    constraint = await output_constraint(body)
    return name, await make_sequences(state, body, ids, 0, body.max_new_tokens(),
                                      lambda n: state.max_model_len - n, constraint)


def _messages(body: ChatCompletionRequest) -> list[dict]:
    out = []
    for i, m in enumerate(body.messages):
        d = m.model_dump(exclude_none=False)
        if m.content is None:  # an assistant's tool-call turn: no text, as upstream reads it
            d["content"] = ""
        if isinstance(m.content, list):  # parts: the text ones, joined as upstream does
            texts = []
            for part in m.content:
                if part.get("type") != "text" or not isinstance(part.get("text"), str):
                    raise APIError(400, f"messages.{i}.content: only text parts are supported, "
                                   f"got {part.get('type')!r}", "messages")
                texts.append(part["text"])
            d["content"] = "\n".join(texts)
        try:
            check_unicode(d["content"], f"messages.{i}.content")
        except ValueError as exc:
            raise APIError(400, str(exc), "messages") from None
        out.append(d)
    return out


def _logprobs(state, ids, entries):
    return None if entries is None else chat_logprobs(state.llm.tokenizer, ids, entries)


async def _full(state: ServerState, seqs, name: str):
    dead = await run_to_end(state, seqs)
    if dead is not None:
        return failure_response(dead)
    choices = [{"index": i, "message": {"role": "assistant",
                                        "content": s.text},
                "logprobs": _logprobs(state, s.output_token_ids,
                                      s.logprobs if s.params.logprobs is not None else None),
                "finish_reason": s.finish_reason, "stop_reason": s.stop_reason}
               for i, s in enumerate(seqs)]
    out = full_answer("chatcmpl", "chat.completion", name, choices, seqs)
    if seqs[0].params.prompt_logprobs is not None:  # vLLM's field, of the rendered prompt
        out["prompt_logprobs"] = vllm_prompt_logprobs(state.llm.tokenizer, seqs[0])
    return out


async def _stream(state: ServerState, seqs, name: str, body):
    chunk = Chunks("chatcmpl", "chat.completion.chunk", name)
    live_usage = usage_per_chunk(body, seqs)
    yield chunk([{"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                  "finish_reason": None} for i in range(len(seqs))], live_usage())
    async for i, update in run(state, seqs):
        delta = update.text
        lp = _logprobs(state, update.new_token_ids, update.logprobs)
        if delta or lp or update.finish_reason is not None:
            yield chunk([{"index": i, "delta": {"content": delta} if delta else {},
                          "logprobs": lp, "finish_reason": update.finish_reason,
                          "stop_reason": update.stop_reason}], live_usage())
    if wants_usage(body):
        yield chunk([], usage(seqs))
