"""Reasoning parsers on fixed text (upstream's test strings), whole and
streamed a few characters at a time; the core's structured output waiting
for the reasoning's end; and `engine serve --reasoning-parser` answering
reasoning_content beside content."""
from __future__ import annotations

import re

import pytest
from test_serve import ServerProcess, client, tiny_model  # noqa: F401

from engine.reasoning import ReasoningStream, get_reasoning_parser

R, C = "This is a reasoning section", "This is the rest"
CASES = {
    "deepseek_r1": [(f"{R}</think>{C}", R, C), (f"<think>{R}</think>{C}", R, C),
                    (R, R, None), (f"<think>{R}</think>", R, None),
                    (f"<think>{R}\n</think>\n\n{C}", R + "\n", "\n\n" + C)],
    "qwen3": [(f"<think>{R}</think>{C}", R, C), (C, None, C), (f"<think>{R}", R, None),
              (f"<think>{R}</think>", R, None), (f"<thin {C}", None, f"<thin {C}")],
}


@pytest.mark.parametrize("name,text,reasoning,content",
                         [(n, *c) for n, cases in CASES.items() for c in cases])
def test_parsers_whole_and_streamed(name, text, reasoning, content):
    parser = get_reasoning_parser(name)()
    assert parser.extract(text) == (reasoning, content)
    stream, got_r, got_c = ReasoningStream(parser), "", ""
    for i in range(0, len(text), 3):
        r, c = stream.feed(text[i:i + 3], i + 3 >= len(text))
        got_r, got_c = got_r + r, got_c + c
    assert (got_r or None, got_c or None) == (reasoning, content)


def test_unknown_parser():
    with pytest.raises(ValueError, match="'nope' is not known; use one of deepseek_r1, qwen3"):
        get_reasoning_parser("nope")


class _Seq:
    def __init__(self, params, prompt):
        self.params, self.token_ids, self.num_prompt_tokens = params, list(prompt), len(prompt)
        self.grammar = self.grammar_pending = None
        self.reasoning_ended, self.request_id = True, "r"

    @property
    def output_token_ids(self):
        return self.token_ids[self.num_prompt_tokens:]


def test_the_core_constrains_only_after_the_reasoning_ends(tiny_model):  # noqa: F811
    import time

    pytest.importorskip("xgrammar")
    from engine.sampling_params import SamplingParams, StructuredOutputsParams
    from engine.structured_output import StructuredOutputManager

    manager = StructuredOutputManager(tiny_model, 512, [1, 3])
    end = [40, 41]
    seq = _Seq(SamplingParams(structured_outputs=StructuredOutputsParams(
        regex="[0-9]+", reasoning_end=end)), [0, 5, 6])
    manager.grammar_init(seq)
    while manager.ready(seq) is False:
        time.sleep(0.01)
    assert seq.grammar is not None and not seq.reasoning_ended
    for token in (9, 40, 41):  # the model thinks, then writes the end tag
        assert manager.grammar_bitmask([seq]) is None  # free while reasoning
        seq.token_ids.append(token)
        assert manager.accept(seq, token)
    assert seq.reasoning_ended
    mask, rows = manager.grammar_bitmask([seq]).result()
    assert rows == [0]
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tiny_model / "tokenizer.json"))
    allowed = [t for t in range(512) if (int(mask[0, t // 32]) >> (t % 32)) & 1]
    assert allowed and all(re.fullmatch("[0-9]+", tok.decode([t])) for t in allowed)
    # a prompt whose template closed the think block: constrained from the first token
    seq2 = _Seq(seq.params, [0, 5, 40, 41, 7])
    manager.grammar_init(seq2)
    assert seq2.reasoning_ended


@pytest.mark.slow
def test_serve_splits_reasoning_whole_and_streamed(tiny_model):  # noqa: F811
    s = ServerProcess(tiny_model, "--served-model-name", "tiny", "--reasoning-parser",
                      "deepseek_r1")
    try:
        c = client(s)
        # a user turn ending in </think> puts the end tag in the prompt's tail, so
        # the regex holds from the first token: the random model writes a think block
        ask = [{"role": "user", "content": "Think first.</think>"}]
        regex = r"<think>[a-z]{1,12}</think>[a-z]{1,12}"
        kw = dict(model="tiny", messages=ask, max_tokens=60, temperature=1.0, seed=2,
                  extra_body={"structured_outputs": {"regex": regex}})
        r = c.chat.completions.create(**kw)
        msg = r.choices[0].message
        thought = msg.model_extra["reasoning_content"]
        assert re.fullmatch("[a-z]{1,12}", thought) and re.fullmatch("[a-z]{1,12}", msg.content)
        got_r = got_c = ""
        for chunk in c.chat.completions.create(stream=True, **kw):
            d = chunk.choices[0].delta
            got_r += (d.model_extra or {}).get("reasoning_content") or ""
            got_c += d.content or ""
        assert (got_r, got_c) == (thought, msg.content)
        plain = c.chat.completions.create(model="tiny", messages=[{"role": "user",
                                                                   "content": "hi"}],
                                          max_tokens=5, temperature=0)
        assert plain.choices[0].message.content is None  # no </think>: all reasoning
        assert plain.choices[0].message.model_extra["reasoning_content"]
    finally:
        s.close()
