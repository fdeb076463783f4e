"""`engine quantize --scheme w4a16`: a compressed-tensors pack-quantized
checkpoint as llm-compressor's W4A16 preset writes it (4-bit symmetric per
group of 128, scale max|w| / 7.5), read back here with compressed-tensors'
own unpacking rule; the engine's greedy ids on it equal a fake-quant
reference's, and upstream vLLM (the peer, when installed) loads it and agrees."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch
from helpers import make_checkpoint
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from test_quant_wna16_formats import fake_quant_greedy
from test_quantization import PROMPTS, engine_greedy

from engine.cli import main as cli
from engine.model_executor.layers.quantization.rtn import quantize

PEER = Path(__file__).resolve().parents[2] / ".venvs" / "peer-vllm" / "bin" / "python"


def ct_unpack(packed: torch.Tensor, bits: int, shape) -> torch.Tensor:
    """compressed-tensors unpack_from_int32 (packed_dim 1): signed values."""
    pf, mask = 32 // bits, (1 << bits) - 1
    out = torch.zeros(packed.shape[0], packed.shape[1] * pf, dtype=torch.int32)
    for i in range(pf):
        out[:, i::pf] = (packed >> (bits * i)) & mask
    return (out[:, :int(shape[1])] - (1 << (bits - 1))).to(torch.int8)


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    root = tmp_path_factory.mktemp("w4a16")
    src = make_checkpoint(root / "float", "llama", seed=3, hidden=128, inter=256)
    return {"float": src, "w4a16": quantize(src, root / "w4a16", scheme="w4a16"),
            "g64": quantize(src, root / "g64", scheme="w4a16", group_size=64),
            "g256": quantize(src, root / "g256", scheme="w4a16", group_size=256)}


def fake_weights(path: Path) -> dict:
    fake = {}
    with safe_open(path / "model.safetensors", "pt") as f:
        for key in f.keys():
            if key.endswith(".weight_packed"):
                layer = key[:-len(".weight_packed")]
                q = ct_unpack(f.get_tensor(key), 4, f.get_tensor(f"{layer}.weight_shape"))
                s = f.get_tensor(f"{layer}.weight_scale").float()
                group = q.shape[1] // s.shape[1]
                fake[f"{layer}.weight"] = q.float() * s.repeat_interleave(group, 1)
    return fake


def test_checkpoint_is_compressed_tensors_pack_quantized(ckpts):
    qc = json.loads((ckpts["w4a16"] / "config.json").read_text())["quantization_config"]
    assert (qc["quant_method"], qc["format"], qc["ignore"]) == (
        "compressed-tensors", "pack-quantized", ["lm_head"])
    g = qc["config_groups"]["group_0"]
    assert g["input_activations"] is None and g["targets"] == ["Linear"]
    assert {k: g["weights"][k] for k in ("num_bits", "type", "symmetric", "strategy",
                                         "group_size", "dynamic")} == dict(
        num_bits=4, type="int", symmetric=True, strategy="group", group_size=128, dynamic=False)
    name = "model.layers.1.mlp.down_proj"
    with safe_open(ckpts["w4a16"] / "model.safetensors", "pt") as f, \
            safe_open(ckpts["float"] / "model.safetensors", "pt") as fl:
        packed, scale = f.get_tensor(f"{name}.weight_packed"), f.get_tensor(f"{name}.weight_scale")
        shape = f.get_tensor(f"{name}.weight_shape")
        assert f"{name}.weight" not in f.keys() and f"{name}.weight_zero_point" not in f.keys()
        orig = fl.get_tensor(f"{name}.weight")
    assert packed.dtype == torch.int32 and packed.shape == (128, 256 // 8)
    assert shape.dtype == torch.int64 and shape.tolist() == [128, 256]
    assert scale.dtype == orig.dtype and scale.shape == (128, 2)
    q = ct_unpack(packed, 4, shape)
    assert q.min() >= -8 and q.max() <= 7
    groups = orig.float().view(128, 2, 128)
    assert torch.equal(scale, (groups.abs().amax(-1) / 7.5).to(orig.dtype))
    deq = q.float().view(128, 2, 128) * scale.float()[..., None]
    assert (deq - groups).abs().max() <= scale.float().max() / 2 + 1e-6  # round to nearest


def test_layers_whose_inputs_do_not_split_go_per_channel(ckpts, tmp_path, capsys):
    """Group 256 splits down_proj's 256 inputs, not the others' 128: those are
    per channel, in a config group naming them (which outranks "Linear")."""
    assert cli(["quantize", str(ckpts["float"]), str(tmp_path / "q"), "--scheme", "w4a16",
                "--group-size", "256"]) == 0
    qc = json.loads((tmp_path / "q" / "config.json").read_text())["quantization_config"]
    g1 = qc["config_groups"]["group_1"]
    assert (g1["weights"]["strategy"], g1["weights"]["group_size"]) == ("channel", None)
    assert "model.layers.0.self_attn.q_proj" in g1["targets"]
    assert not any("down_proj" in t for t in g1["targets"])
    with safe_open(tmp_path / "q" / "model.safetensors", "pt") as f:
        assert f.get_tensor("model.layers.0.self_attn.q_proj.weight_scale").shape == (128, 1)
        assert f.get_tensor("model.layers.0.mlp.down_proj.weight_scale").shape == (128, 1)
    from engine.model_executor.layers.quantization import config_for

    cfg = config_for(tmp_path / "q")
    assert cfg.method_for(("model.layers.0.self_attn.q_proj",)).group_size is None
    assert cfg.method_for(("model.layers.0.mlp.down_proj",)).group_size == 256
    assert cli(["quantize", str(ckpts["float"]), str(tmp_path / "q2"), "--scheme", "w4a16",
                "--group-size", "12"]) == 2
    assert "positive multiple of 8" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.parametrize("name", ["w4a16", "g64", "g256"])
def test_greedy_equals_fake_quant_reference(ckpts, name):
    ours = engine_greedy(ckpts[name], PROMPTS, 16)
    assert ours == fake_quant_greedy(ckpts["float"], fake_weights(ckpts[name]), PROMPTS, 16)
    assert ours != engine_greedy(ckpts["float"], PROMPTS, 16)


_PEER_RUN = """
import json, sys
from vllm import LLM, SamplingParams
def main():
    llm = LLM(model=sys.argv[1], dtype="bfloat16", max_model_len=256, seed=0)
    outs = llm.generate([{"prompt_token_ids": p} for p in json.loads(sys.argv[2])],
                        SamplingParams(temperature=0, max_tokens=8, ignore_eos=True),
                        use_tqdm=False)
    print("IDS " + json.dumps([list(o.outputs[0].token_ids) for o in outs]))
if __name__ == "__main__":
    main()
"""


@pytest.mark.slow
@pytest.mark.skipif(not PEER.is_file(), reason="the vLLM peer is not installed: "
                    "bash ci/setup-peer.sh")
def test_vllm_loads_it_and_agrees(tmp_path):
    """In bfloat16 (vLLM's CPU W4A16 kernel has no float32): a bfloat16 copy
    of the random Llama, quantized, run by both."""
    src = make_checkpoint(tmp_path / "float", "llama", seed=3, hidden=128, inter=256)
    t = {k: v.to(torch.bfloat16) for k, v in load_file(src / "model.safetensors").items()}
    save_file(t, str(src / "model.safetensors"), metadata={"format": "pt"})
    w4 = quantize(src, tmp_path / "w4a16", scheme="w4a16")
    (tmp_path / "peer.py").write_text(_PEER_RUN)
    env = {"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1",
           "OMP_NUM_THREADS": "2", "PATH": "/usr/bin:/bin"}
    run = subprocess.run([str(PEER), str(tmp_path / "peer.py"), str(w4), json.dumps(PROMPTS)],
                         capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600)
    lines = [ln for ln in run.stdout.splitlines() if ln.startswith("IDS ")]
    assert run.returncode == 0 and lines, run.stderr[-3000:]
    from engine.entrypoints.llm import LLM
    from engine.sampling_params import SamplingParams

    llm = LLM(model=w4, dtype="bfloat16", bind_threads=False, block_size=32, num_kv_blocks=64)
    outs = llm.generate(prompt_token_ids=PROMPTS, sampling_params=SamplingParams(
        temperature=0, max_tokens=8, ignore_eos=True))
    ours = [o.outputs[0].token_ids for o in outs]
    theirs = json.loads(lines[-1][4:])
    assert sum(a[:4] == b[:4] for a, b in zip(ours, theirs)) >= len(PROMPTS) - 1, (ours, theirs)
