"""`engine serve --speculative-config` with the real openai client: greedy
completions equal the offline engine's without speculation, n and seeds,
stop strings, and upstream's acceptance counters in /metrics."""
from __future__ import annotations

import json

import pytest
from test_serve import ServerProcess, client  # noqa: F401
from test_spec_decode import damp_attention

openai = pytest.importorskip("openai", reason="openai is a dev requirement (requirements/dev.txt)")

pytestmark = pytest.mark.slow  # a real server process

SPEC = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3,
        "prompt_lookup_min": 1}


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    from engine.tiny_model import make_tiny_model

    return damp_attention(make_tiny_model(tmp_path_factory.mktemp("spec") / "damped"))


@pytest.fixture(scope="module")
def server(model):
    s = ServerProcess(model, "--served-model-name", "tiny", "--speculative-config",
                      json.dumps(SPEC))
    yield s
    s.close()


@pytest.fixture(scope="module")
def offline(model):
    """The same model without speculation: the reference."""
    from engine.entrypoints.llm import LLM

    return LLM(model=model, dtype="float32", block_size=32, num_kv_blocks=64,
               max_model_len=2048, bind_threads=False)


def _prompt(offline) -> list[int]:
    """A text, then its beginning again: the model goes on repeating it."""
    from engine.sampling_params import SamplingParams

    text = offline.generate([[5]], SamplingParams(temperature=0, max_tokens=60,
                                                  ignore_eos=True))[0].outputs[0].token_ids
    return [5] + text + [7, 8, 5]


def test_greedy_equals_offline_and_metrics_count_drafts(server, offline):
    from engine.sampling_params import SamplingParams

    prompt = _prompt(offline)
    want = offline.generate([prompt], SamplingParams(temperature=0, max_tokens=64,
                                                     ignore_eos=True))[0].outputs[0]
    c = client(server, "none")
    got = c.completions.create(model="tiny", prompt=prompt, max_tokens=64, temperature=0,
                               extra_body={"ignore_eos": True})
    assert got.choices[0].text == want.text
    assert got.usage.completion_tokens == 64
    streamed = "".join(e.choices[0].text for e in c.completions.create(
        model="tiny", prompt=prompt, max_tokens=64, temperature=0, stream=True,
        extra_body={"ignore_eos": True}) if e.choices)
    assert streamed == want.text
    m = server.metrics()
    drafts = m["vllm:spec_decode_num_draft_tokens_total"]
    accepted = m["vllm:spec_decode_num_accepted_tokens_total"]
    assert m["vllm:spec_decode_num_drafts_total"] > 0 and 0 < accepted < drafts
    per_pos = [m[f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{position="{i}"}}']
               for i in range(SPEC["num_speculative_tokens"])]
    assert sum(per_pos) == accepted and per_pos == sorted(per_pos, reverse=True)


def test_n_seeds_and_stop_strings(server, offline):
    from engine.sampling_params import SamplingParams

    prompt = _prompt(offline)
    c = client(server, "none")
    kw = dict(model="tiny", prompt=prompt, max_tokens=20, temperature=0.8, seed=3,
              extra_body={"ignore_eos": True})
    first = c.completions.create(n=2, **kw)
    again = c.completions.create(n=2, **kw)
    assert [ch.text for ch in first.choices] == [ch.text for ch in again.choices]
    assert first.usage.completion_tokens == 40
    full = offline.generate([prompt], SamplingParams(temperature=0, max_tokens=30,
                                                     ignore_eos=True))[0].outputs[0].text
    # three characters from the output's middle (the tiny tokenizer's text is bytes and bits)
    stop = next(full[i:i + 3] for i in range(len(full) // 2, len(full) - 3)
                if "\ufffd" not in full[i:i + 3])
    want = offline.generate([prompt], SamplingParams(temperature=0, max_tokens=30, stop=[stop],
                                                     ignore_eos=True))[0].outputs[0]
    got = c.completions.create(model="tiny", prompt=prompt, max_tokens=30, temperature=0,
                               stop=[stop], extra_body={"ignore_eos": True}).choices[0]
    assert (got.text, got.finish_reason) == (want.text, "stop")
