"""Architectures beyond the Llama family (OPT, Granite, Phi-3, Gemma 2/3, the
MoE families Mixtral, Qwen2-MoE and Qwen3-MoE):
greedy ids equal transformers' token for token in float32, with prompts longer
than the sliding windows; rope parameters as transformers computes them."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from arch_checkpoints import make_arch_checkpoint
from test_engine import PROMPTS, hf_greedy, make_llm

from engine.config import rope_parameters
from engine.model_executor.layers.rotary import rope_tables
from engine.sampling_params import SamplingParams

LONG = [p for p in PROMPTS if len(p.split()) > 16] + [" ".join(PROMPTS)]


def _check(path: Path, prompts: list[str], n: int = 16, **llm_kw) -> None:
    llm = make_llm(path, **llm_kw)
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=n, ignore_eos=True))
    got = [o.outputs[0].token_ids for o in outs]
    want = [hf_greedy(path, o.prompt_token_ids, n) for o in outs]
    assert got == want
    assert len({tuple(g) for g in got}) > 1  # the prompts take different greedy paths


def test_opt_matches_transformers(tmp_path):
    _check(make_arch_checkpoint(tmp_path / "opt", "opt"), PROMPTS)


def test_qwen2_moe_matches_transformers(tmp_path):
    """Routed experts without renormalised weights, a shared expert behind its
    sigmoid gate, and a dense layer (mlp_only_layers)."""
    _check(make_arch_checkpoint(tmp_path / "qwen2_moe", "qwen2_moe"), PROMPTS)


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["opt-proj", "opt-post-ln", "granite", "phi3", "gemma2",
                                  "gemma3", "mixtral", "qwen3_moe"])
def test_architecture_matches_transformers(tmp_path, arch):
    kw = {"seed": 3} if arch == "opt-proj" else {}
    _check(make_arch_checkpoint(tmp_path / arch, arch, **kw), PROMPTS)


@pytest.mark.slow
def test_phi3_longrope_tables(tmp_path):
    """Long factors where max_model_len passes original_max_position_embeddings
    (16 here), as upstream; short ones below it."""
    path = make_arch_checkpoint(tmp_path / "lr", "phi3-longrope")
    _check(path, LONG)
    llm = make_llm(path, max_model_len=16)
    for o in llm.generate(["he was", "water"], SamplingParams(temperature=0, max_tokens=10,
                                                              ignore_eos=True)):
        assert o.outputs[0].token_ids == hf_greedy(path, o.prompt_token_ids, 10)


_ROPES = {
    "linear": {"rope_type": "linear", "factor": 4.0},
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128},
    "longrope": {"rope_type": "longrope", "short_factor": [1.0, 1.2, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0],
                 "long_factor": [2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0],
                 "original_max_position_embeddings": 128},
}


@pytest.mark.parametrize("kind", list(_ROPES))
@pytest.mark.parametrize("form", ["rope_parameters", "rope_scaling"])
def test_rope_tables_match_transformers(kind, form):
    import transformers
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    hf = transformers.LlamaConfig(hidden_size=64, num_attention_heads=4, head_dim=16,
                                  max_position_embeddings=1024,
                                  rope_parameters={**_ROPES[kind], "rope_theta": 50000.0})
    want_inv, want_attn = ROPE_INIT_FUNCTIONS[kind](hf, None, seq_len=1024)
    scaling = dict(_ROPES[kind])
    if form == "rope_scaling":  # the older spelling: type, theta beside it
        scaling["type"] = scaling.pop("rope_type")
        cfg = {"rope_scaling": scaling, "rope_theta": 50000.0}
    else:
        cfg = {"rope_parameters": {**scaling, "rope_theta": 50000.0}}
    params = rope_parameters(cfg, 1024)
    dim, inv, attn = rope_tables(16, params, 1024, max_model_len=1024)
    assert dim == 16 and attn == pytest.approx(want_attn)
    torch.testing.assert_close(inv, want_inv.float(), rtol=1e-6, atol=0)


def test_per_layer_type_rope_parameters():
    """Gemma 3: a dict per layer type, from transformers 5's form and from the
    older rope_scaling + rope_local_base_freq."""
    new = rope_parameters({"rope_parameters": {
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6}}}, 512)
    old = rope_parameters({"model_type": "gemma3_text", "rope_theta": 1e6,
                           "rope_local_base_freq": 10000.0,
                           "rope_scaling": {"rope_type": "linear", "factor": 8.0}}, 512)
    assert new == old
    assert old["full_attention"]["factor"] == 8.0
    assert old["sliding_attention"]["rope_theta"] == 10000.0


def test_unsupported_rope_type_is_one_line():
    with pytest.raises(ValueError, match=r"rope type 'dynamic' is not supported; supported: "
                                         r"default, linear") as e:
        rope_parameters({"rope_scaling": {"type": "dynamic", "factor": 2.0}}, 512)
    assert "\n" not in str(e.value)
