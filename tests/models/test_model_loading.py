"""Bad checkpoints are refused in one line naming the tensor (a missing one,
one part of a fused parameter, an unexpected one, a shape that does not fit the
config), and an unsupported architecture names the supported ones."""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from helpers import make_checkpoint
from test_engine import make_llm


@pytest.fixture(scope="module")
def llama(tmp_path_factory) -> Path:
    return make_checkpoint(tmp_path_factory.mktemp("ck") / "llama", "llama")


def _rewrite(src: Path, dest: Path, edit) -> Path:
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dest)
    st = next(dest.glob("*.safetensors"))
    tensors = load_file(st)
    edit(tensors)
    save_file(tensors, st, metadata={"format": "pt"})
    return dest


def _refused(path: Path, *needles: str) -> str:
    with pytest.raises(ValueError) as e:
        make_llm(path)
    msg = str(e.value)
    assert "\n" not in msg
    for n in needles:
        assert n in msg, msg
    return msg


@pytest.mark.parametrize("key", ["model.layers.1.self_attn.k_proj.weight",  # one part of qkv
                                 "model.layers.0.mlp.up_proj.weight",  # one part of gate_up
                                 "model.layers.1.self_attn.o_proj.weight",
                                 "model.norm.weight", "lm_head.weight"])
def test_missing_weight_named(llama, tmp_path, key):
    path = _rewrite(llama, tmp_path / "ck", lambda t: t.pop(key))
    _refused(path, f"lacks {key}")


def test_unexpected_weight_named(llama, tmp_path):
    import torch

    def add(t):
        t["model.layers.0.mlp.extra.weight"] = torch.zeros(2, 2)
    _refused(_rewrite(llama, tmp_path / "ck", add), "model.layers.0.mlp.extra.weight",
             "not a weight of LlamaForCausalLM")


def test_old_rotary_tables_are_ignored(llama, tmp_path):
    import torch

    def add(t):
        t["model.layers.0.self_attn.rotary_emb.inv_freq"] = torch.zeros(8)
    make_llm(_rewrite(llama, tmp_path / "ck", add))


def test_shape_that_does_not_fit_the_config(llama, tmp_path):
    d = tmp_path / "ck"
    shutil.copytree(llama, d)
    cfg = json.loads((d / "config.json").read_text())
    cfg["intermediate_size"] = 96
    (d / "config.json").write_text(json.dumps(cfg))
    msg = _refused(d, "mlp.", "the model expects")
    assert re.search(r"model\.layers\.\d\.mlp\.\w+_proj\.weight has shape \((128, 64|64, 128)\)",
                     msg), msg


def test_phi3_fused_weight_missing(tmp_path):
    from arch_checkpoints import make_arch_checkpoint

    src = make_arch_checkpoint(tmp_path / "phi3", "phi3")
    key = "model.layers.1.self_attn.qkv_proj.weight"
    _refused(_rewrite(src, tmp_path / "ck", lambda t: t.pop(key)), f"lacks {key}")


@pytest.mark.parametrize("key", ["model.layers.1.block_sparse_moe.experts.5.w3.weight",  # up
                                 "model.layers.0.block_sparse_moe.experts.0.w2.weight",  # down
                                 "model.layers.0.block_sparse_moe.gate.weight"])  # router
def test_moe_expert_weight_missing(tmp_path, key):
    """One projection of one expert is one part of the fused expert weights."""
    from arch_checkpoints import make_arch_checkpoint

    src = make_arch_checkpoint(tmp_path / "mixtral", "mixtral")
    _refused(_rewrite(src, tmp_path / "ck", lambda t: t.pop(key)), f"lacks {key}")


def test_moe_expert_beyond_num_experts(tmp_path):
    import torch
    from arch_checkpoints import make_arch_checkpoint

    src = make_arch_checkpoint(tmp_path / "mixtral", "mixtral")
    key = "model.layers.0.block_sparse_moe.experts.8.w1.weight"

    def add(t):
        t[key] = torch.zeros(128, 64)
    _refused(_rewrite(src, tmp_path / "ck", add), key, "not a weight of MoeForCausalLM")


def test_unsupported_architecture_names_the_supported(llama, tmp_path):
    d = tmp_path / "ck"
    shutil.copytree(llama, d)
    cfg = json.loads((d / "config.json").read_text())
    cfg.update(architectures=["BloomForCausalLM"], model_type="bloom")
    (d / "config.json").write_text(json.dumps(cfg))
    msg = _refused(d, "BloomForCausalLM", "'bloom'", "is not supported")
    for arch in ("LlamaForCausalLM", "OPTForCausalLM", "Gemma3ForCausalLM", "Phi3ForCausalLM",
                 "GraniteForCausalLM", "MixtralForCausalLM", "Qwen2MoeForCausalLM",
                 "Qwen3MoeForCausalLM"):
        assert arch in msg


def test_opt_first_exports_without_model_prefix(tmp_path):
    """facebook/opt-* as first exported: decoder.* keys, no "model." prefix."""
    from arch_checkpoints import make_arch_checkpoint
    from test_engine import hf_greedy

    from engine.sampling_params import SamplingParams

    src = make_arch_checkpoint(tmp_path / "opt", "opt")

    def strip(t):
        for k in [k for k in t if k.startswith("model.")]:
            t[k.removeprefix("model.")] = t.pop(k)
    path = _rewrite(src, tmp_path / "ck", strip)
    out = make_llm(path).generate(["he was"], SamplingParams(temperature=0, max_tokens=6,
                                                             ignore_eos=True))
    assert out[0].outputs[0].token_ids == hf_greedy(src, out[0].prompt_token_ids, 6)
