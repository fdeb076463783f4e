"""The xgrammar backend (upstream's backend_xgrammar.py): a request's
constraint checked (check_spec, no tokenizer needed: the front end's 400s),
compiled for the model's tokenizer (one cached compiler per tokenizer), and a
matcher per request that fills its row of the batch's token bitmask and
accepts each sampled token."""
from __future__ import annotations

import json
import re
from functools import lru_cache
from pathlib import Path
from typing import Any

from engine.sampling_params import StructuredOutputsParams

BACKENDS = ("xgrammar",)  # --structured-outputs-config's backend (upstream's default)
NAMES = {"json": "JSON schema", "regex": "regex", "choice": "choice", "grammar": "grammar",
         "json_object": "JSON object", "structural_tag": "structural tag"}
_WHERE = re.compile(r"^\[[0-9:]+\] \S+:\d+: (Check failed: .*? is false: )?")


def error_line(exc: Exception) -> str:
    """xgrammar's message without its time stamp and C++ source line."""
    text = str(exc).strip()
    return _WHERE.sub("", text.splitlines()[0]) if text else type(exc).__name__


def check_spec(p: StructuredOutputsParams, field: str) -> None:
    """ValueError naming `field` when the constraint cannot be built (a bad
    schema, regex, grammar or tag): the grammar is built and thrown away."""
    kind, text = p.kind()
    error = _build_error(kind, text, p.disable_any_whitespace)
    if error is not None:
        raise ValueError(f"{field}: the {NAMES[kind]} is not valid: {error}")


@lru_cache(maxsize=256)
def _build_error(kind: str, text: str, disable_any_whitespace: bool) -> str | None:
    """Why the constraint does not build (None: it does); a client's schema is
    usually the same request after request, and is built once."""
    try:
        _grammar(kind, text, disable_any_whitespace)
    except Exception as exc:  # noqa: BLE001 - xgrammar raises RuntimeError/ValueError/its own
        return error_line(exc)
    return None


def _grammar(kind: str, text: str, disable_any_whitespace: bool):
    import xgrammar as xgr

    if kind == "json":
        return xgr.Grammar.from_json_schema(text, any_whitespace=not disable_any_whitespace)
    if kind == "json_object":
        return xgr.Grammar.builtin_json_grammar()
    if kind == "regex":
        return xgr.Grammar.from_regex(text)
    if kind == "choice":
        return xgr.Grammar.from_ebnf(choice_ebnf(json.loads(text)))
    if kind == "grammar":
        return xgr.Grammar.from_ebnf(text)
    return xgr.Grammar.from_structural_tag(structural_tag_format(text))


def structural_tag_format(text: str) -> str:
    """The tag as xgrammar reads it: the older {"structures", "triggers"} form
    that vLLM still takes, as its {"format": triggered_tags} equivalent."""
    tag = json.loads(text)
    if not isinstance(tag, dict) or "structures" not in tag:
        return text
    tags = [{"begin": s["begin"], "end": s["end"],
             "content": {"type": "json_schema", "json_schema": s.get("schema", {})}}
            for s in tag["structures"]]
    return json.dumps({"type": "structural_tag", "format": {
        "type": "triggered_tags", "triggers": tag.get("triggers", []), "tags": tags}})


def choice_ebnf(choices: list[str]) -> str:
    """One of the strings exactly (upstream's choice_as_grammar)."""
    if not choices:
        raise ValueError("choice must list at least one string")
    return "root ::= " + " | ".join(json.dumps(c) for c in choices)


class XgrammarBackend:
    """The model's tokenizer as xgrammar sees it, and its compiler (whose
    cache holds each schema's compiled grammar)."""

    def __init__(self, tokenizer_dir: Path, vocab_size: int, stop_token_ids: list[int]):
        import xgrammar as xgr

        self.vocab_size = vocab_size
        self.stop_token_ids = list(stop_token_ids)
        self.compiler = xgr.GrammarCompiler(_tokenizer_info(tokenizer_dir, vocab_size,
                                                            tuple(stop_token_ids)),
                                            max_threads=2)

    def compile(self, p: StructuredOutputsParams):
        kind, text = p.kind()
        c = self.compiler
        if kind == "json":
            return c.compile_json_schema(text, any_whitespace=not p.disable_any_whitespace)
        if kind == "json_object":
            return c.compile_builtin_json_grammar()
        if kind == "regex":
            return c.compile_regex(text)
        return c.compile_grammar(_grammar(kind, text, p.disable_any_whitespace))

    def matcher(self, compiled) -> XgrammarGrammar:
        return XgrammarGrammar(compiled, self.stop_token_ids)

    def bitmask(self, rows: int, grammars: list[tuple[int, XgrammarGrammar]]):
        """(the batch's bitmask, the rows the sampler must apply it to), or None
        when no row needs it: a row whose grammar allows every token (xgrammar's
        need_apply false) is left out. A row at a time: xgrammar's batch matcher
        filled the same rows 2x slower here (16 rows of a JSON schema, the step's
        forward running beside, its threads competing with the forward's)."""
        import xgrammar as xgr

        bitmask = xgr.allocate_token_bitmask(rows, self.vocab_size)
        apply = [i for i, g in grammars if g.matcher.fill_next_token_bitmask(bitmask, i)]
        return (bitmask, apply) if apply else None


class XgrammarGrammar:
    """One request's place in its grammar."""

    def __init__(self, compiled, stop_token_ids: list[int]):
        import xgrammar as xgr

        self.matcher = xgr.GrammarMatcher(compiled, override_stop_tokens=stop_token_ids)

    def accept_token(self, token: int) -> bool:
        return bool(self.matcher.accept_token(token))

    def is_terminated(self) -> bool:
        return bool(self.matcher.is_terminated())


@lru_cache(maxsize=4)
def _tokenizer_info(tokenizer_dir: Path, vocab_size: int, stop_token_ids: tuple[int, ...]):
    """The tokenizer.json's vocabulary, by id, with how its tokens encode bytes."""
    import xgrammar as xgr

    text = (tokenizer_dir / "tokenizer.json").read_text()
    vocab: dict[str, int] = {}
    data: Any = json.loads(text)
    vocab.update(data.get("model", {}).get("vocab", {}) or {})
    special = set()
    for added in data.get("added_tokens", []) or []:
        vocab[added["content"]] = added["id"]
        if added.get("special"):
            special.add(added["id"])
    encoded = [""] * min(vocab_size, max(vocab.values(), default=-1) + 1)
    for token, i in vocab.items():
        if i < len(encoded) and i not in special:  # "": xgrammar never allows it in text
            encoded[i] = token
    meta = xgr.TokenizerInfo._detect_metadata_from_hf(text)
    return xgr.TokenizerInfo(encoded, meta["vocab_type"], vocab_size=vocab_size,
                             stop_token_ids=list(stop_token_ids),
                             add_prefix_space=meta["add_prefix_space"])
