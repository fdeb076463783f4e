"""POST /v1/chat/completions: messages rendered by the model's chat template,
the assistant's answer whole or streamed."""
from __future__ import annotations

from fastapi import Request

from engine.entrypoints import chat_utils
from engine.entrypoints.openai.protocol import ChatCompletionRequest
from engine.entrypoints.openai.serving_engine import (APIError, Chunks, ServerState,
                                                      StreamedText, check_request,
                                                      error_response, full_answer,
                                                      make_sequences, run, run_to_end, sse,
                                                      unless_disconnected, usage, wants_usage)


async def create_chat_completion(state: ServerState, body: ChatCompletionRequest,
                                 request: Request):
    name = check_request(state, body)
    if state.chat_template is None:
        raise APIError(400, "this model has no chat template (none in its "
                       "tokenizer_config.json or chat_template.jinja); use /v1/completions "
                       "or start the server with --chat-template FILE", "messages")
    try:
        text = chat_utils.render(state.chat_template, _messages(body),
                                 add_generation_prompt=body.add_generation_prompt,
                                 tokens=state.special_tokens, tools=None, documents=None,
                                 **(body.chat_template_kwargs or {}))
    except chat_utils.ChatTemplateError as exc:
        raise APIError(400, str(exc), "messages") from None
    # as transformers' apply_chat_template(tokenize=True): the template
    # already wrote the special tokens it wants
    ids = state.llm.core.tokenizer.encode(text, add_special_tokens=False).ids
    max_tokens = body.max_completion_tokens or body.max_tokens
    seqs = make_sequences(state, body, ids, 0,
                          max_tokens or max(state.max_model_len - len(ids), 1))
    if body.stream:
        return sse(_stream(state, seqs, name, body))
    return await unless_disconnected(request, _full(state, seqs, name))


def _messages(body: ChatCompletionRequest) -> list[dict]:
    out = []
    for i, m in enumerate(body.messages):
        d = m.model_dump(exclude_none=False)
        if isinstance(m.content, list):  # parts: the text ones, joined as upstream does
            texts = []
            for part in m.content:
                if part.get("type") != "text" or not isinstance(part.get("text"), str):
                    raise APIError(400, f"messages.{i}.content: only text parts are supported, "
                                   f"got {part.get('type')!r}", "messages")
                texts.append(part["text"])
            d["content"] = "\n".join(texts)
        out.append(d)
    return out


async def _full(state: ServerState, seqs, name: str):
    dead = await run_to_end(state, seqs)
    if dead is not None:
        return error_response(500, dead)
    choices = [{"index": i, "message": {"role": "assistant",
                                        "content": state.llm.core.output_text(s)},
                "logprobs": None, "finish_reason": s.finish_reason}
               for i, s in enumerate(seqs)]
    return full_answer("chatcmpl", "chat.completion", name, choices, seqs)


async def _stream(state: ServerState, seqs, name: str, body):
    chunk = Chunks("chatcmpl", "chat.completion.chunk", name)
    texts = [StreamedText(state.llm.core.tokenizer, s) for s in seqs]
    yield chunk([{"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                  "finish_reason": None} for i in range(len(seqs))])
    async for i, update in run(state, seqs):
        delta = texts[i].add(update)
        if delta or update.finish_reason is not None:
            yield chunk([{"index": i, "delta": {"content": delta} if delta else {},
                          "logprobs": None, "finish_reason": update.finish_reason}])
    if wants_usage(body):
        yield chunk([], usage(seqs))
