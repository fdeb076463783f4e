"""Output text as transformers decodes it (the separator to the prompt kept),
and stop strings checked on the new text: through the offline LLM on a
word-level checkpoint, whose decoder puts the spaces between words."""
from __future__ import annotations

from pathlib import Path

import pytest
from helpers import make_checkpoint

transformers = pytest.importorskip("transformers", reason="a dev requirement")


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    return make_checkpoint(tmp_path_factory.mktemp("m") / "words")


@pytest.fixture(scope="module")
def llm(model):
    from engine.entrypoints.llm import LLM

    return LLM(model=model, dtype="float32", block_size=32, num_kv_blocks=32,
               max_model_len=256, bind_threads=False)


def _run(llm, prompt, **kw):
    from engine.sampling_params import SamplingParams

    (out,) = llm.generate([prompt], SamplingParams(temperature=0, ignore_eos=True, **kw))
    return out.outputs[0]


def test_text_keeps_its_separator_as_transformers_decodes_it(llm, model):
    tok = transformers.AutoTokenizer.from_pretrained(model)
    prompt = "the time people water"
    out = _run(llm, prompt, max_tokens=8)
    ids = tok(prompt)["input_ids"]
    want = tok.decode(ids + out.token_ids, skip_special_tokens=True)[
        len(tok.decode(ids, skip_special_tokens=True)):]
    assert out.text == want and want.startswith(" ")


def test_stop_strings_cut_the_text_once_min_tokens_are_out(llm):
    full = _run(llm, "the time people water", max_tokens=12).text
    words = full.split()
    word = words[2]
    first = full.index(" " + word)
    cut = _run(llm, "the time people water", max_tokens=12, stop=[" " + word])
    assert cut.finish_reason == "stop" and cut.text == full[:first]
    kept = _run(llm, "the time people water", max_tokens=12, stop=[" " + word],
                include_stop_str_in_output=True)
    assert kept.text == full[:first + len(word) + 1]
    # a stop string may not end the output before min_tokens
    late = _run(llm, "the time people water", max_tokens=12, stop=[" " + words[0]],
                min_tokens=12)
    assert late.finish_reason == "length" and late.text == full
