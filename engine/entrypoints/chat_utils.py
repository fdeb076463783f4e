"""Chat templates, rendered as transformers' apply_chat_template renders them:
the same Jinja environment (sandboxed, trim_blocks, lstrip_blocks, loop
controls, `raise_exception`, `strftime_now`, its `tojson`) and the same
variables (messages, add_generation_prompt, tools, the special tokens).

A render is bounded (engine.entrypoints.bounded_jinja): a template that loops
without end, recurses without end or writes megabytes is refused in seconds
with a ChatTemplateError, instead of holding a server thread for good."""
from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache
from pathlib import Path

# a real template renders a long chat in milliseconds and writes about as much as
# the messages hold; these are far past that, and far short of hurting the server
RENDER_TIMEOUT_S = 2.0
MAX_RENDER_CHARS = 8 * 1024 * 1024

_FIX = "fix the model's chat template or pass --chat-template FILE"


class ChatTemplateError(ValueError):
    """The model has no usable chat template, or the messages do not fit it."""


def load_template(model_dir: Path, override: str | None = None) -> str | None:
    """--chat-template FILE, else chat_template.jinja, else tokenizer_config.json's
    chat_template (a string, or a list of named templates: the `default` one)."""
    if override:
        path = Path(override)
        if not path.is_file():
            if "{" in override:  # the template itself, in one line (as upstream takes it)
                return override
            raise ChatTemplateError(f"--chat-template {override}: no such file")
        return path.read_text()
    jinja = model_dir / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text()
    cfg = _tokenizer_config(model_dir)
    tpl = cfg.get("chat_template")
    if isinstance(tpl, list):
        named = {t.get("name"): t.get("template") for t in tpl if isinstance(t, dict)}
        tpl = named.get("default")
    return tpl if isinstance(tpl, str) and tpl else None


def special_tokens(model_dir: Path) -> dict[str, str]:
    """bos_token, eos_token, ... as the template sees them (strings)."""
    out = {}
    for key, value in _tokenizer_config(model_dir).items():
        if key.endswith("_token"):
            if isinstance(value, dict):  # AddedToken, serialized
                value = value.get("content")
            if isinstance(value, str):
                out[key] = value
    return out


def _tokenizer_config(model_dir: Path) -> dict:
    path = model_dir / "tokenizer_config.json"
    try:
        return json.loads(path.read_text()) if path.is_file() else {}
    except json.JSONDecodeError as exc:
        raise ChatTemplateError(f"{path} is not valid JSON: {exc}") from None


@lru_cache(maxsize=8)
def _compile(template: str):
    import jinja2
    import jinja2.ext

    from engine.entrypoints.bounded_jinja import BoundedEnvironment

    class Generation(jinja2.ext.Extension):
        # transformers' {% generation %} marks assistant text for masks; it renders its body
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            call = jinja2.nodes.CallBlock(self.call_method("_render"), [], [], body)
            return call.set_lineno(lineno)

        def _render(self, caller):
            return caller()

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    env = BoundedEnvironment(trim_blocks=True, lstrip_blocks=True,
                             extensions=[Generation, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    try:
        return env.from_string(template)
    except jinja2.TemplateSyntaxError as exc:
        raise ChatTemplateError(f"the chat template does not parse: {exc}") from None


def render(template: str, messages: list[dict], *, add_generation_prompt: bool = True,
           tokens: dict[str, str] | None = None, timeout_s: float | None = None,
           max_chars: int | None = None, **extra) -> str:
    """The chat as the template writes it. ChatTemplateError when the template
    refuses the messages, or takes longer than timeout_s (RENDER_TIMEOUT_S) or
    writes more than max_chars (MAX_RENDER_CHARS) characters."""
    import jinja2

    from engine.entrypoints import bounded_jinja

    timeout_s = RENDER_TIMEOUT_S if timeout_s is None else timeout_s
    max_chars = MAX_RENDER_CHARS if max_chars is None else max_chars
    # dict(), as keywords: a name given twice is a TypeError, as it was for render()
    variables = dict(messages=messages, add_generation_prompt=add_generation_prompt,
                     **(tokens or {}), **extra)
    try:
        return bounded_jinja.render(_compile(template), variables, timeout_s=timeout_s,
                                    max_chars=max_chars)
    except bounded_jinja.RenderLimitError as exc:
        raise ChatTemplateError(f"the chat template {exc}: {_FIX}") from None
    except jinja2.TemplateError as exc:
        raise ChatTemplateError(f"the chat template refused these messages: {exc}") from None
    except Exception as exc:  # noqa: BLE001 - a template is code over the client's messages
        # (`'x' + message['content']` with a list, a missing key...): their shape, a 400
        raise ChatTemplateError(f"the chat template failed on these messages: "
                                f"{type(exc).__name__}: {exc}") from None
