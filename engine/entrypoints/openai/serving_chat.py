"""POST /v1/chat/completions: messages rendered by the model's chat template,
the assistant's answer whole or streamed."""
from __future__ import annotations


from fastapi import Request

from engine.core import cpu_share
from engine.core.input_processor import check_unicode
from engine.entrypoints import chat_utils
from engine.entrypoints.openai.logprobs import AsTokenIds, chat_logprobs, vllm_prompt_logprobs
from engine.entrypoints.openai.protocol import ChatCompletionRequest
from engine.entrypoints.openai.serving_beam import beam_answer
from engine.entrypoints.openai.serving_inputs import make_sequences, request_id
from engine.entrypoints.openai.serving_engine import (APIError, Chunks, ServerState, admit,
                                                      check_prompt_fits,
                                                      check_request,
                                                      error_response, full_answer,
                                                      run, run_to_end, sse,
                                                      unless_disconnected, usage,
                                                      usage_per_chunk, wants_usage)

# the template's own arguments: chat_template_kwargs may not name them
RESERVED_KWARGS = {"messages", "add_generation_prompt", "tools", "documents"}


async def create_chat_completion(state: ServerState, body: ChatCompletionRequest,
                                 request: Request):
    if body.use_beam_search:
        name = check_request(state, body)
        text = await render_chat(state, body.messages, body.add_generation_prompt,
                                 body.continue_final_message, body.chat_template_kwargs or {})
        ids = await state.llm.tokenize(text, add_special_tokens=body.add_special_tokens)
        return await beam_answer(state, body, request, name, [ids], chat=True)
    rid = request_id(request, body)
    name, seqs = await chat_sequences(state, body, rid)
    admit(state, seqs, "n")
    as_ids = body.return_tokens_as_token_ids
    how = _Shape(state, body, state.options.tokens_as_ids if as_ids is None else as_ids)
    if body.stream:
        return sse(_stream(state, seqs, name, body, how, rid), state, seqs)
    return await unless_disconnected(request, _full(state, seqs, name, how, rid), state, seqs)


class _Shape:
    """What of the answer the request asks for besides the text: the role
    (--response-role, or the last message's when continuing it), the echo
    of the last message, token ids, logprobs' token names."""

    def __init__(self, state: ServerState, body: ChatCompletionRequest, tokens_as_ids: bool):
        last = body.messages[-1]
        self.role = state.options.response_role if body.add_generation_prompt else last.role
        self.echo = last.content if (body.echo and isinstance(last.content, str)
                                     and last.role == self.role) else ""
        self.token_ids = bool(body.return_token_ids)
        self.tokenizer = AsTokenIds() if tokens_as_ids else state.llm.tokenizer


async def render_chat(state: ServerState, messages: list, add_generation_prompt: bool,
                      continue_final_message: bool, kwargs: dict) -> str:
    """The chat template's text of the messages (ChatMessage models)."""
    if state.chat_template is None:
        raise APIError(400, "this model has no chat template (none in its "
                       "tokenizer_config.json or chat_template.jinja); use /v1/completions "
                       "or start the server with --chat-template FILE", "messages")
    clash = sorted(RESERVED_KWARGS & set(kwargs))
    if clash:
        raise APIError(400, f"chat_template_kwargs may not set {', '.join(clash)}: give them "
                       f"as the request's own fields", "chat_template_kwargs")
    dicts, template = _messages(messages), state.chat_template
    try:  # in a worker thread, bounded in time and size (chat_utils): templates are code
        text = await cpu_share.in_thread(lambda: chat_utils.render(
            template, dicts, add_generation_prompt=add_generation_prompt,
            tokens={**state.special_tokens, **kwargs}, tools=None, documents=None))
    except chat_utils.ChatTemplateError as exc:
        raise APIError(400, str(exc), "messages") from None
    if continue_final_message:  # as transformers': cut after the last message's text
        final = dicts[-1]["content"].strip()
        at = text.rfind(final) if final else -1
        if at < 0:
            raise APIError(400, "continue_final_message: the template does not write the last "
                           "message's text; leave continue_final_message unset", "messages")
        text = text[:at + len(final)]
    check_prompt_fits(state, text, "messages")
    return text


async def chat_sequences(state: ServerState, body: ChatCompletionRequest, rid: str | None = None):
    """(the served model's name, the checked sequences of the rendered chat)."""
    name = check_request(state, body)
    text = await render_chat(state, body.messages, body.add_generation_prompt,
                             body.continue_final_message, body.chat_template_kwargs or {})
    # as transformers' apply_chat_template(tokenize=True): the template
    # already wrote the special tokens it wants (add_special_tokens: more)
    ids = await state.llm.tokenize(text, add_special_tokens=body.add_special_tokens)
    return name, await make_sequences(state, body, ids, 0, body.max_new_tokens(),
                                      lambda n: state.max_model_len - n, rid)


def _messages(messages: list) -> list[dict]:
    out = []
    for i, m in enumerate(messages):
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


def _logprobs(how: _Shape, ids, entries):
    return None if entries is None else chat_logprobs(how.tokenizer, ids, entries)


async def _full(state: ServerState, seqs, name: str, how: _Shape, rid: str):
    dead = await run_to_end(state, seqs)
    if dead is not None:
        return error_response(500, dead)
    ids = (lambda s: {"token_ids": s.output_token_ids}) if how.token_ids else (lambda s: {})
    choices = [{"index": i, "message": {"role": how.role, "content": how.echo + (s.text or "")},
                "logprobs": _logprobs(how, s.output_token_ids,
                                      s.logprobs if s.params.logprobs is not None else None),
                "finish_reason": s.finish_reason, "stop_reason": s.stop_reason, **ids(s)}
               for i, s in enumerate(seqs)]
    out = full_answer("chatcmpl", "chat.completion", name, choices, seqs, rid)
    if seqs[0].params.prompt_logprobs is not None:  # vLLM's field, of the rendered prompt
        out["prompt_logprobs"] = vllm_prompt_logprobs(state.llm.tokenizer, seqs[0])
    if how.token_ids:
        out["prompt_token_ids"] = seqs[0].token_ids[:seqs[0].num_prompt_tokens]
    return out


async def _stream(state: ServerState, seqs, name: str, body, how: _Shape, rid: str):
    chunk = Chunks("chatcmpl", "chat.completion.chunk", name, rid)
    live_usage = usage_per_chunk(body, seqs)
    first = chunk([{"index": i, "delta": {"role": how.role, "content": ""}, "logprobs": None,
                    "finish_reason": None} for i in range(len(seqs))], live_usage())
    if how.token_ids:
        first["prompt_token_ids"] = seqs[0].token_ids[:seqs[0].num_prompt_tokens]
    yield first
    if how.echo:
        yield chunk([{"index": i, "delta": {"content": how.echo}, "logprobs": None,
                      "finish_reason": None} for i in range(len(seqs))], live_usage())
    async for i, update in run(state, seqs):
        delta = update.text
        lp = _logprobs(how, update.new_token_ids, update.logprobs)
        if delta or lp or update.finish_reason is not None:
            ids = {"token_ids": update.new_token_ids} if how.token_ids else {}
            yield chunk([{"index": i, "delta": {"content": delta} if delta else {},
                          "logprobs": lp, "finish_reason": update.finish_reason,
                          "stop_reason": update.stop_reason, **ids}], live_usage())
    if wants_usage(body):
        yield chunk([], usage(seqs))
