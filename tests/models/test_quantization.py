"""Quantized checkpoints: `engine quantize` writes compressed-tensors W8A8 as
llm-compressor does; the engine loads it (ignore lists honoured, anything
else refused in one line) and its greedy ids equal a torch fake-quant
reference's exactly."""
from __future__ import annotations

import json

import pytest
import torch
from helpers import make_checkpoint
from safetensors import safe_open
from torch import nn

from engine import reference
from engine.cli import main as cli
from engine.entrypoints.llm import LLM
from engine.model_executor.layers.quantization import config_for
from engine.model_executor.layers.quantization.rtn import quantize, quantize_weight
from engine.sampling_params import SamplingParams

PROMPTS = [[1, 5, 9, 14, 3], [1, 40, 41, 42, 43, 44, 45, 46], [1, 7], [1, 60, 61, 3, 5, 9, 70]]
IGNORED = "model.layers.0.mlp.down_proj"


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    root = tmp_path_factory.mktemp("quant")
    src = make_checkpoint(root / "float", "llama", seed=3, hidden=128, inter=256)
    return {"float": src, "w8a8": quantize(src, root / "w8a8"),
            "ignore": quantize(src, root / "ignore", ignore=(IGNORED,))}


def test_checkpoint_is_compressed_tensors_w8a8(ckpts):
    qc = json.loads((ckpts["w8a8"] / "config.json").read_text())["quantization_config"]
    assert (qc["quant_method"], qc["format"], qc["ignore"]) == (
        "compressed-tensors", "int-quantized", ["lm_head"])
    g = qc["config_groups"]["group_0"]
    assert g["targets"] == ["Linear"]
    assert {k: g["weights"][k] for k in ("num_bits", "type", "symmetric", "strategy", "dynamic")} \
        == dict(num_bits=8, type="int", symmetric=True, strategy="channel", dynamic=False)
    a = g["input_activations"]
    assert (a["num_bits"], a["strategy"], a["dynamic"], a["symmetric"]) == (8, "token", True, True)
    with safe_open(ckpts["w8a8"] / "model.safetensors", "pt") as f, \
            safe_open(ckpts["float"] / "model.safetensors", "pt") as fl:
        keys = set(f.keys())
        w = f.get_tensor("model.layers.1.self_attn.q_proj.weight")
        s = f.get_tensor("model.layers.1.self_attn.q_proj.weight_scale")
        assert w.dtype == torch.int8 and s.shape == (w.shape[0], 1)
        orig = fl.get_tensor("model.layers.1.self_attn.q_proj.weight").float()
        assert (w.float() * s - orig).abs().max() <= s.max() / 2 + 1e-7  # round to nearest
        assert f.get_tensor("lm_head.weight").dtype == orig.dtype
    assert "lm_head.weight_scale" not in keys
    assert "model.layers.0.input_layernorm.weight" in keys


def test_quantize_weight_rounds_per_channel():
    w = torch.tensor([[1.0, -0.5, 0.25], [0.0, 0.0, 0.0], [-2.0, 1.0, 0.003]])
    q, s = quantize_weight(w)
    assert torch.equal(s[:, 0], torch.tensor([1 / 127, 1.0, 2 / 127]))
    assert q.tolist() == [[127, -64, 32], [0, 0, 0], [-127, 64, 0]]


class FakeQuantLinear(nn.Module):
    """The W8A8 math in plain torch: int8 rows times the int8 weight, exact
    sums, scaled by row and channel."""

    def __init__(self, weight: torch.Tensor, scale: torch.Tensor):
        super().__init__()
        self.w, self.s = weight, scale.float().reshape(-1)

    def forward(self, x):
        q, s = reference.quant_int8_rows(x.reshape(-1, x.shape[-1]))
        acc = (q.double() @ self.w.double().T).float()
        return ((acc * s) * self.s).to(x.dtype).view(*x.shape[:-1], -1)


def fake_quant_greedy(ckpts, name: str, prompts, n: int) -> list[list[int]]:
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(ckpts["float"],
                                                              dtype=torch.float32).eval()
    with safe_open(ckpts[name] / "model.safetensors", "pt") as f:
        for key in f.keys():
            if key.endswith(".weight_scale"):
                layer = key[:-len(".weight_scale")]
                parent, attr = layer.rsplit(".", 1)
                model.get_submodule(parent).__setattr__(attr, FakeQuantLinear(
                    f.get_tensor(layer + ".weight"), f.get_tensor(key)))
    return model_greedy(model, prompts, n)


def model_greedy(model, prompts, n: int) -> list[list[int]]:
    """A transformers model's n greedy ids after each prompt (EOS ignored)."""
    outs = []
    for p in prompts:
        ids = torch.tensor([p])
        out = model.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False,
                             eos_token_id=None, pad_token_id=0)
        outs.append(out[0, ids.shape[1]:].tolist())
    return outs


def engine_greedy(path, prompts, n: int) -> list[list[int]]:
    llm = LLM(model=path, dtype="float32", bind_threads=False, block_size=32, num_kv_blocks=64)
    outs = llm.generate(prompt_token_ids=prompts, sampling_params=SamplingParams(
        temperature=0, max_tokens=n, ignore_eos=True))
    return [o.outputs[0].token_ids for o in outs]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["w8a8", "ignore"])
def test_greedy_equals_fake_quant_reference(ckpts, name):
    ours = engine_greedy(ckpts[name], PROMPTS, 16)
    assert ours == fake_quant_greedy(ckpts, name, PROMPTS, 16)
    # and quantization changed something: the float model's ids differ somewhere
    assert ours != engine_greedy(ckpts["float"], PROMPTS, 16)


def test_ignored_layer_stays_float(ckpts):
    llm = LLM(model=ckpts["ignore"], dtype="float32", bind_threads=False, block_size=32,
              num_kv_blocks=16)
    model = llm.core.executor.model
    layers = model.layers
    assert layers[0].down.quant_method is None and layers[1].down.quant_method is not None
    assert layers[0].qkv.quant_method is not None and model.lm_head.quant_method is None


def _write_qc(path, qc):
    (path / "config.json").write_text(json.dumps({"model_type": "llama",
                                                  "quantization_config": qc}))


@pytest.mark.parametrize("qc,match", [
    ({"quant_method": "bitsandbytes", "load_in_4bit": True},
     r"quantization method 'bitsandbytes' is not supported; supported: compressed-tensors "
     r".*GPTQ 4/8-bit, AWQ 4-bit GEMM"),
    ({"quant_method": "awq", "bits": 4, "version": "gemv"},
     r"AWQ version 'gemv' \(GEMM packing runs\) is not supported"),
    ({"quant_method": "gptq", "bits": 3, "group_size": 128},
     r"GPTQ with bits=3 \(4 and 8 run\) is not supported"),
    ({"quant_method": "compressed-tensors", "format": "marlin-24"},
     r"format 'marlin-24' is not supported; supported"),
    ({"quant_method": "compressed-tensors", "format": "int-quantized", "config_groups": {"g": {
        "targets": ["Linear"], "weights": {"num_bits": 4, "type": "int", "symmetric": True,
                                           "strategy": "group", "group_size": 128}}}},
     r"weight-only 4-bit int in format 'int-quantized' \(pack-quantized runs\) is not supported"),
    ({"quant_method": "compressed-tensors", "format": "pack-quantized", "config_groups": {"g": {
        "targets": ["Linear"], "weights": {"num_bits": 4, "type": "float", "symmetric": True,
                                           "strategy": "group", "group_size": 16}}}},
     r"weight-only 4-bit float is not supported"),
    ({"quant_method": "compressed-tensors", "format": "int-quantized", "config_groups": {"g": {
        "targets": ["Linear"],
        "weights": {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "channel"},
        "input_activations": {"num_bits": 8, "type": "int", "symmetric": False,
                              "strategy": "token", "dynamic": True}}}},
     r"input_activations of 8-bit int, symmetric=False is not supported"),
    ({"quant_method": "compressed-tensors", "format": "int-quantized", "config_groups": {"g": {
        "targets": ["Linear"],
        "weights": {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "channel"},
        "input_activations": {"num_bits": 8, "type": "int", "symmetric": True,
                              "strategy": "tensor", "dynamic": False}}}},
     r"input activations with strategy 'tensor', dynamic=False is not supported"),
])
def test_unsupported_quantization_is_one_line(tmp_path, qc, match):
    _write_qc(tmp_path, qc)
    with pytest.raises(ValueError, match=match) as exc:
        config_for(tmp_path)
    assert "\n" not in str(exc.value)


def test_int8_weights_without_quantization_config_are_refused(ckpts, tmp_path, capsys):
    import shutil

    bad = tmp_path / "bad"
    shutil.copytree(ckpts["w8a8"], bad)
    cfg = json.loads((bad / "config.json").read_text())
    del cfg["quantization_config"]
    (bad / "config.json").write_text(json.dumps(cfg))
    assert cli(["generate", "--model", str(bad), "--prompt", "a", "--max-tokens", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "quantization_config" in err


def test_cli_quantize(ckpts, tmp_path, capsys):
    dst = tmp_path / "q"
    assert cli(["quantize", str(ckpts["float"]), str(dst), "--scheme", "w8a8"]) == 0
    assert config_for(dst) is not None
    assert cli(["quantize", str(ckpts["float"]), str(dst)]) == 2  # not empty: refused
    assert "exists and is not empty" in capsys.readouterr().err
    assert cli(["quantize", str(dst), str(tmp_path / "q2")]) == 2  # quantized already


def test_fused_layers_must_be_quantized_alike():
    from engine.model_executor.layers.quantization.compressed_tensors import (
        CompressedTensorsConfig)
    from engine.model_executor.layers.quantization.rtn import quantization_config

    names = tuple(f"model.layers.0.self_attn.{p}_proj" for p in "qkv")
    cfg = CompressedTensorsConfig.parse(quantization_config((names[0],)), "ckpt")
    with pytest.raises(ValueError, match="treats .* differently"):
        cfg.method_for(names)
    assert cfg.method_for(("model.layers.0.mlp.down_proj",)) is not None
    assert cfg.method_for(("lm_head",)) is None
