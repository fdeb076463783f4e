"""POST /v1/chat/completions: messages rendered by the model's chat template,
the assistant's answer whole or streamed."""
from __future__ import annotations

import json

from fastapi import Request

from engine.core import cpu_share
from engine.core.input_processor import check_unicode
from engine.entrypoints import chat_utils
from engine.entrypoints.openai.chat_tools import ToolError, ToolMode, ToolStream, check_tools
from engine.entrypoints.openai.logprobs import AsTokenIds, chat_logprobs, vllm_prompt_logprobs
from engine.entrypoints.openai.protocol import ChatCompletionRequest
from engine.entrypoints.openai.serving_beam import beam_answer
from engine.entrypoints.openai.serving_engine import (
    APIError,
    Chunks,
    ServerState,
    admit,
    check_prompt_fits,
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
from engine.entrypoints.openai.serving_inputs import make_sequences, request_id
from engine.reasoning import ReasoningParser, ReasoningStream, get_reasoning_parser

# the template's own arguments: chat_template_kwargs may not name them
RESERVED_KWARGS = {"messages", "add_generation_prompt", "tools", "documents"}


async def create_chat_completion(state: ServerState, body: ChatCompletionRequest,
                                 request: Request):
    if body.use_beam_search:
        return await _beams(state, body, request)
    rid = request_id(request, body)
    name, seqs, tools = await chat_sequences(state, body, rid)
    admit(state, seqs, "n")
    as_ids = body.return_tokens_as_token_ids
    how = _Shape(state, body, state.options.tokens_as_ids if as_ids is None else as_ids)
    if body.stream:
        return sse(_stream(state, seqs, name, body, tools, how, rid), state, seqs)
    return await unless_disconnected(request, _full(state, seqs, name, tools, how, rid),
                                     state, seqs)


async def _beams(state: ServerState, body: ChatCompletionRequest, request: Request):
    """use_beam_search: the best n beams of the rendered chat (serving_beam);
    a structured output or tool calling is refused by name there and here."""
    name = check_request(state, body)
    tools = _tool_mode(state, body)
    if tools.choice == "auto":
        raise APIError(400, "use_beam_search: not with tool calling (tools with tool_choice "
                       "auto); set tool_choice to none", "use_beam_search")
    constraint = await output_constraint(body, tools.constraint())
    text = await render_chat(state, body.messages, body.add_generation_prompt,
                             body.continue_final_message, body.chat_template_kwargs or {},
                             body.tools or None)
    ids = await state.llm.tokenize(text, add_special_tokens=body.add_special_tokens)
    return await beam_answer(state, body, request, name, [ids], chat=True,
                             constraint=constraint)


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

    def message(self, message: dict) -> dict:
        """A whole answer's message (chat_tools' ToolMode.message) in this role,
        after the echo."""
        message = {**message, "role": self.role}
        if self.echo:
            message["content"] = self.echo + (message.get("content") or "")
        return message


def _tool_mode(state: ServerState, body: ChatCompletionRequest) -> ToolMode:
    try:
        return check_tools(body, state.tool_call_parser, state.enable_auto_tool_choice)
    except (ToolError, ValueError) as exc:
        raise APIError(400, str(exc), getattr(exc, "field", "tool_choice")) from None


async def render_chat(state: ServerState, messages: list, add_generation_prompt: bool,
                      continue_final_message: bool, kwargs: dict,
                      tools: list[dict] | None = None) -> str:
    """The chat template's text of the messages (ChatMessage models); tools:
    the request's, for the template."""
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
            tokens={**state.special_tokens, **kwargs}, tools=tools, documents=None))
    except chat_utils.ChatTemplateError as exc:
        raise APIError(400, str(exc), "messages") from None
    if continue_final_message:  # as transformers': cut after the last message's text
        if not dicts:
            raise APIError(400, "continue_final_message: give a last message to continue",
                           "messages")
        final = dicts[-1]["content"].strip()
        at = text.rfind(final)  # "": the whole text, as transformers' rindex gives
        if at < 0:
            raise APIError(400, "continue_final_message: the template does not write the last "
                           "message's text; leave continue_final_message unset", "messages")
        text = text[:at + len(final)]
    check_prompt_fits(state, text, "messages")
    return text


async def chat_sequences(state: ServerState, body: ChatCompletionRequest, rid: str | None = None):
    """(the served model's name, the checked sequences of the rendered chat,
    what its tools ask of the answer)."""
    name = check_request(state, body)
    tools = _tool_mode(state, body)
    text = await render_chat(state, body.messages, body.add_generation_prompt,
                             body.continue_final_message, body.chat_template_kwargs or {},
                             body.tools or None)
    # as transformers' apply_chat_template(tokenize=True): the template
    # already wrote the special tokens it wants (add_special_tokens: more)
    ids = await state.llm.tokenize(text, add_special_tokens=body.add_special_tokens)
    constraint = await output_constraint(body, tools.constraint())
    reasoner = _reasoner(state)
    if constraint is not None and reasoner is not None:  # the core constrains after it
        constraint.reasoning_end = await state.llm.tokenize(reasoner.end_token,
                                                            add_special_tokens=False)
    return name, await make_sequences(state, body, ids, 0, body.max_new_tokens(),
                                      lambda n: state.max_model_len - n, rid,
                                      constraint=constraint), tools


def _messages(messages: list) -> list[dict]:
    out = []
    for i, m in enumerate(messages):
        d = m.model_dump(exclude_none=False)
        if m.content is None:  # an assistant's tool-call turn: no text, as upstream reads it
            d["content"] = ""
        if isinstance(d.get("tool_calls"), list):  # templates index the arguments (upstream)
            d["tool_calls"] = [_with_dict_arguments(c, i) for c in d["tool_calls"]]
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


def _reasoner(state: ServerState) -> ReasoningParser | None:
    return get_reasoning_parser(state.reasoning_parser)() if state.reasoning_parser else None


def _with_reasoning(message: dict, reasoning: str | None, content: str | None) -> dict:
    """vLLM's reasoning_content (and its newer name, reasoning) beside the content."""
    if content is None and not message.get("tool_calls"):
        message["content"] = None
    return {**message, "reasoning_content": reasoning, "reasoning": reasoning}


def _with_dict_arguments(call, i: int):
    f = call.get("function") if isinstance(call, dict) else None
    if not isinstance(f, dict) or not isinstance(f.get("arguments"), str):
        return call
    try:
        args = json.loads(f["arguments"])
    except json.JSONDecodeError:
        raise APIError(400, f"messages.{i}.tool_calls: function.arguments must be a JSON "
                       "object", "messages") from None
    return {**call, "function": {**f, "arguments": args}}


def _logprobs(how: _Shape, ids, entries):
    return None if entries is None else chat_logprobs(how.tokenizer, ids, entries)


async def _full(state: ServerState, seqs, name: str, tools: ToolMode, how: _Shape, rid: str):
    dead = await run_to_end(state, seqs)
    if dead is not None:
        return failure_response(dead)
    choices, reasoner = [], _reasoner(state)
    for i, s in enumerate(seqs):
        reasoning, content = reasoner.extract(s.text) if reasoner else (None, s.text)
        message, finish = tools.message(content or "", s.finish_reason)
        if reasoner is not None:
            message = _with_reasoning(message, reasoning, content)
        choice = {"index": i, "message": how.message(message),
                  "logprobs": _logprobs(how, s.output_token_ids, s.logprobs
                                        if s.params.logprobs is not None else None),
                  "finish_reason": finish, "stop_reason": s.stop_reason}
        if how.token_ids:
            choice["token_ids"] = s.output_token_ids
        choices.append(choice)
    out = full_answer("chatcmpl", "chat.completion", name, choices, seqs, rid)
    if seqs[0].params.prompt_logprobs is not None:  # vLLM's field, of the rendered prompt
        out["prompt_logprobs"] = vllm_prompt_logprobs(state.llm.tokenizer, seqs[0])
    if how.token_ids:
        out["prompt_token_ids"] = seqs[0].token_ids[:seqs[0].num_prompt_tokens]
    return out


async def _stream(state: ServerState, seqs, name: str, body, tools: ToolMode, how: _Shape,
                  rid: str):
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
    streams = [ToolStream(tools) for _ in seqs]
    reasoner = _reasoner(state)
    thoughts = [ReasoningStream(reasoner) for _ in seqs] if reasoner is not None else None
    called = [False] * len(seqs)
    async for i, update in run(state, seqs):
        finish = update.finish_reason
        thought, text = "", update.text
        if thoughts is not None:
            thought, text = thoughts[i].feed(update.text, finish is not None)
        deltas = streams[i].deltas(text, finish is not None)
        if thought:
            deltas.insert(0, {"reasoning_content": thought, "reasoning": thought})
        called[i] = called[i] or any("tool_calls" in d for d in deltas)
        if finish is not None:
            _, finish = tools.message(streams[i].text, finish) if called[i] else (None, finish)
        lp = _logprobs(how, update.new_token_ids, update.logprobs)
        for d in deltas[:-1]:
            yield chunk([{"index": i, "delta": d, "logprobs": None, "finish_reason": None}],
                        live_usage())
        last = deltas[-1] if deltas else {}
        # return_token_ids: a chunk for each update's tokens, also those whose text waits
        ids = ({"token_ids": update.new_token_ids}
               if how.token_ids and update.new_token_ids else {})
        if last or lp or ids or finish is not None:
            yield chunk([{"index": i, "delta": last, "logprobs": lp, "finish_reason": finish,
                          "stop_reason": update.stop_reason, **ids}], live_usage())
    if wants_usage(body):
        yield chunk([], usage(seqs))
