"""`engine make-tiny-model --arch NAME` for every supported architecture: a
checkpoint transformers loads as the same model (greedy ids equal in float32)
and `engine serve` serves."""
from __future__ import annotations

import subprocess
import sys

import pytest
from test_engine import hf_greedy, make_llm

from engine.model_executor.models.registry import SUPPORTED_ARCHITECTURES
from engine.sampling_params import SamplingParams
from engine.tiny_model import ARCHS

PROMPTS = ["Hello, my name is", "The capital of France is", "Once upon a time there was"]
FAST = ("llama", "qwen3_moe")


def test_every_supported_architecture_has_a_tiny_model():
    """The generative ones here; the pooling ones (encoders, rerankers) in
    tests/engine/test_pooling.py, against sentence-transformers."""
    from engine.model_executor.models.registry import POOLING_ARCHITECTURES
    from engine.tiny_pooling_model import POOLING_ARCHS

    assert sorted(a for cfg in ARCHS.values() for a in cfg["architectures"]) == sorted(
        set(SUPPORTED_ARCHITECTURES) - set(POOLING_ARCHITECTURES))
    assert {a for cfg, _, _ in POOLING_ARCHS.values() for a in cfg["architectures"]} >= set(
        POOLING_ARCHITECTURES)


@pytest.mark.parametrize("arch", [a if a in FAST else pytest.param(a, marks=pytest.mark.slow)
                                  for a in ARCHS])
def test_tiny_model_is_the_transformers_model(tmp_path, arch):
    out = subprocess.run([sys.executable, "-m", "engine.cli", "make-tiny-model",
                          str(tmp_path / arch), "--arch", arch],
                         capture_output=True, text=True, check=True)
    assert f"wrote a tiny random {arch} model" in out.stdout
    path = tmp_path / arch
    outs = make_llm(path).generate(PROMPTS, SamplingParams(temperature=0, max_tokens=12,
                                                           ignore_eos=True))
    got = [o.outputs[0].token_ids for o in outs]
    assert got == [hf_greedy(path, o.prompt_token_ids, 12) for o in outs]
    assert len({tuple(g) for g in got}) > 1


def test_unknown_arch_is_one_line(tmp_path):
    out = subprocess.run([sys.executable, "-m", "engine.cli", "make-tiny-model",
                          str(tmp_path / "x"), "--arch", "bloom"], capture_output=True, text=True)
    assert out.returncode == 2
    assert "invalid choice: 'bloom'" in out.stderr and "Traceback" not in out.stderr
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("arch", [a if a in FAST else pytest.param(a, marks=pytest.mark.slow)
                                  for a in ARCHS])
def test_engine_serve_serves_every_architecture(tmp_path, arch):
    """Completions and chat (the tiny models carry a chat template) over the
    OpenAI SDK; the completion equals the offline greedy text."""
    import openai
    from test_serve import ServerProcess

    from engine.cli import main

    path = tmp_path / arch
    assert main(["make-tiny-model", str(path), "--arch", arch]) == 0
    want = make_llm(path).generate([PROMPTS[0]], SamplingParams(
        temperature=0, max_tokens=8, ignore_eos=True))[0].outputs[0].text
    server = ServerProcess(path)
    try:
        c = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
        done = c.completions.create(model=str(path), prompt=PROMPTS[0], max_tokens=8,
                                    temperature=0, extra_body={"ignore_eos": True})
        assert done.choices[0].text == want
        chat = c.chat.completions.create(model=str(path), max_tokens=4,
                                         messages=[{"role": "user", "content": "Hello"}])
        assert chat.usage.completion_tokens >= 1
    finally:
        server.close()
