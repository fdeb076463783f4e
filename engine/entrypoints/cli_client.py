"""`engine chat` and `engine complete`: talk to a running `engine serve` (or
any OpenAI-compatible server), as `vllm chat` / `vllm complete` do. Answers
stream to stdout; Ctrl-D or Ctrl-C ends a session."""
from __future__ import annotations

import sys

from engine import envs


def _key(args) -> str | None:
    return args.api_key or envs.client_api_key()


def _client(args):
    import openai

    client = openai.OpenAI(base_url=args.url, api_key=_key(args) or "EMPTY", max_retries=0)
    try:
        model = args.model_name or client.models.list().data[0].id
    except openai.APIConnectionError:
        raise ValueError(f"no server answers at {args.url}; start one with `engine serve MODEL` "
                         "or pass --url") from None
    except openai.APIStatusError as exc:
        raise _status_error(args, exc) from None
    return client, model


def _status_error(args, exc) -> ValueError:
    if exc.status_code == 401:
        given = "the API key sent was refused" if _key(args) else "the server wants an API key"
        names = " or ".join(envs.CLIENT_KEY_VARIABLES)
        return ValueError(f"{args.url}: 401 {given}; pass --api-key KEY or set {names} "
                          "to the key `engine serve` was started with")
    return ValueError(f"{args.url}: {exc.status_code} {_message(exc)}")


def _message(exc) -> str:
    body = getattr(exc, "body", None)
    if isinstance(body, dict):
        body = body.get("error", body)
        if isinstance(body, dict) and "message" in body:
            return body["message"]
    return str(exc)


def _print_stream(stream, chat: bool) -> str:
    out = []
    for chunk in stream:
        for choice in chunk.choices:
            piece = (choice.delta.content if chat else choice.text) or ""
            out.append(piece)
            sys.stdout.write(piece)
            sys.stdout.flush()
    sys.stdout.write("\n")
    return "".join(out)


def _lines(quick: str | None, prompt: str):
    if quick is not None:
        yield quick
        return
    while True:
        try:
            yield input(prompt)
        except EOFError:
            return


def run(args) -> int:
    import openai

    client, model = _client(args)
    chat = args.command == "chat"
    messages = [{"role": "system", "content": args.system_prompt}] \
        if chat and args.system_prompt else []
    for line in _lines(args.quick, "> " if sys.stdin.isatty() else ""):
        try:
            if chat:
                messages.append({"role": "user", "content": line})
                stream = client.chat.completions.create(model=model, messages=messages,
                                                        max_tokens=args.max_tokens, stream=True)
                messages.append({"role": "assistant", "content": _print_stream(stream, True)})
            else:
                stream = client.completions.create(model=model, prompt=line, stream=True,
                                                   max_tokens=args.max_tokens or 64)
                _print_stream(stream, False)
        except openai.APIStatusError as exc:
            raise _status_error(args, exc) from None
        except openai.APIConnectionError:
            raise ValueError(f"lost the server at {args.url}") from None
    return 0
