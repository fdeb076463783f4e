"""generation_config.json's sampling fields fill what a request leaves unset
(offline and in the server's requests), repetition_penalty as transformers
applies it, and float16 checkpoints run."""
from __future__ import annotations

import json
import logging
import shutil

import pytest
import torch
from helpers import make_checkpoint
from test_engine import PROMPTS, make_llm

from engine.entrypoints.llm import LLM
from engine.entrypoints.openai.protocol import CompletionRequest
from engine.sampling_params import SamplingParams, with_model_defaults


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp("ck") / "llama", "llama")


def _hf_greedy(path, ids, n, **kw):
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    out = model.generate(torch.tensor([ids]), max_new_tokens=n, min_new_tokens=n,
                         do_sample=False, eos_token_id=None, pad_token_id=0, **kw)
    return out[0, len(ids):].tolist()


def test_generation_config_defaults_offline(llama, tmp_path):
    d = tmp_path / "ck"
    shutil.copytree(llama, d)
    (d / "generation_config.json").write_text(json.dumps(
        {"temperature": 0.0, "top_p": 0.9, "top_k": 0, "repetition_penalty": 1.3,
         "eos_token_id": [2, 5]}))
    llm = make_llm(d)
    p = llm.get_default_sampling_params()
    # greedy (temperature 0) resets top_p/top_k as upstream's SamplingParams does
    assert (p.temperature, p.top_p, p.top_k, p.repetition_penalty) == (0.0, 1.0, -1, 1.3)
    assert llm.core.config.eos_token_ids == (2, 5)
    # no SamplingParams: the checkpoint's (greedy, penalised) ones
    outs = llm.generate(PROMPTS[:2])
    for o in outs:
        assert o.outputs[0].token_ids == _hf_greedy(d, o.prompt_token_ids, 16,
                                                    repetition_penalty=1.3)[:len(
                                                        o.outputs[0].token_ids)]


@pytest.mark.parametrize("penalty", [1.5, 0.7])
def test_repetition_penalty_matches_transformers(llama, penalty):
    llm = make_llm(llama)
    outs = llm.generate(PROMPTS[:3], SamplingParams(temperature=0, max_tokens=16, ignore_eos=True,
                                                    repetition_penalty=penalty))
    for o in outs:
        assert o.outputs[0].token_ids == _hf_greedy(llama, o.prompt_token_ids, 16,
                                                    repetition_penalty=penalty)


def test_server_requests_take_unset_fields_from_the_model():
    defaults = {"temperature": 0.6, "top_p": 0.9, "top_k": 20, "repetition_penalty": 1.1}
    p = CompletionRequest(prompt="x").sampling_params(8, 0, defaults)
    assert (p.temperature, p.top_p, p.top_k, p.repetition_penalty) == (0.6, 0.9, 20, 1.1)
    p = CompletionRequest(prompt="x", temperature=0.5, top_k=0).sampling_params(8, 0, defaults)
    assert (p.temperature, p.top_k, p.top_p) == (0.5, -1, 0.9)  # set fields win, 0 is "all"
    p = CompletionRequest(prompt="x").sampling_params(8)
    assert (p.temperature, p.top_p, p.top_k, p.repetition_penalty) == (1.0, 1.0, -1, 1.0)
    assert with_model_defaults({"top_p": None}, {}) == {}


def test_bad_repetition_penalty():
    with pytest.raises(ValueError, match="repetition_penalty must be > 0"):
        SamplingParams(repetition_penalty=0)


def test_float16_checkpoint_runs_in_bfloat16(tmp_path, caplog):
    from arch_checkpoints import make_arch_checkpoint

    path = make_arch_checkpoint(tmp_path / "fp16", "phi3", dtype=torch.float16)
    assert json.loads((path / "config.json").read_text())["dtype"] == "float16"
    with caplog.at_level(logging.WARNING, logger="engine"):
        llm = LLM(model=path, bind_threads=False, block_size=32, num_kv_blocks=16)
    assert llm.core.dtype == torch.bfloat16
    assert sum("Falling back to torch.bfloat16" in r.message for r in caplog.records) == 1
    out = llm.generate(["he was"], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
    assert len(out[0].outputs[0].token_ids) == 4
