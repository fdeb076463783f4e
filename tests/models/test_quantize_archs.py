"""`engine quantize` on every architecture `engine make-tiny-model` knows, in
each scheme it writes: the engine loads the result and generates, and every
linear layer left float (MoE routers and experts) is in the config's ignore,
since upstream reads an unlisted one as quantized. What it cannot do is
refused in one line before anything is written; a checkpoint whose config
quantizes a layer it holds float is refused naming that layer's tensor."""
from __future__ import annotations

import json
import re

import pytest
from safetensors import safe_open

from engine import LLM, SamplingParams
from engine.cli import main as cli
from engine.model_executor.layers.quantization import config_for
from engine.model_executor.layers.quantization.rtn import quantize
from engine.tiny_model import ARCHS, make_tiny_model

PROMPTS = [[1, 5, 9, 14, 3], [1, 40, 41]]
# the tiny models' layers have 48 to 176 inputs: the default group of 128
# quantizes most per channel, 16 splits every one into groups
SCHEMES = {"w8a8": ["--scheme", "w8a8"], "w4a16": ["--scheme", "w4a16"],
           "w4a16-g16": ["--scheme", "w4a16", "--group-size", "16"]}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root, made = tmp_path_factory.mktemp("tiny"), {}

    def get(arch: str):
        if arch not in made:
            made[arch] = make_tiny_model(root / arch, arch=arch)
        return made[arch]
    return get


def load(path) -> LLM:
    # the tiny models' 2048-token context would not fit a 16-block cache
    return LLM(model=str(path), dtype="float32", bind_threads=False, block_size=32,
               num_kv_blocks=16, max_model_len=128)


def greedy(llm: LLM, n: int = 4) -> list[list[int]]:
    outs = llm.generate(prompt_token_ids=PROMPTS, sampling_params=SamplingParams(
        temperature=0, max_tokens=n, ignore_eos=True))
    return [list(o.outputs[0].token_ids) for o in outs]


def stored_layers(path) -> dict[str, str]:
    """Each 2-D weight's layer -> "quantized" or its float dtype."""
    out = {}
    with safe_open(path / "model.safetensors", "pt") as f:
        for key in f.keys():
            layer, kind = key.rsplit(".", 1)
            if kind in ("weight_packed", "weight_scale"):
                out[layer] = "quantized"
            elif kind == "weight" and len(f.get_slice(key).get_shape()) == 2:
                out.setdefault(layer, f.get_slice(key).get_dtype())
    return out


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("arch", ARCHS)
def test_quantized_tiny_model_loads_and_generates(tiny, tmp_path, capsys, arch, scheme):
    dst = tmp_path / "q"
    assert cli(["quantize", str(tiny(arch)), str(dst), *SCHEMES[scheme]]) == 0, \
        capsys.readouterr().err
    config = config_for(dst)
    layers = stored_layers(dst)
    assert "quantized" in layers.values()
    for layer, state in layers.items():
        if "embed" in layer:  # embeddings are no linear layers: no config names them
            continue
        assert (config.method_for((layer,)) is not None) == (state == "quantized"), layer
    ids = greedy(load(dst))
    assert [len(i) for i in ids] == [4] * len(PROMPTS)


def test_moe_routers_stay_float_whatever_the_config_says(tiny, tmp_path):
    """What the old `engine quantize` wrote for an MoE model (ignore: lm_head
    only) loads: routers run float, as upstream runs them."""
    dst = quantize(tiny("qwen2_moe"), tmp_path / "q", scheme="w8a8")
    cfg = json.loads((dst / "config.json").read_text())
    assert "model.layers.1.mlp.gate" in cfg["quantization_config"]["ignore"]
    assert "model.layers.1.mlp.shared_expert_gate" in cfg["quantization_config"]["ignore"]
    ids = greedy(load(dst))
    cfg["quantization_config"]["ignore"] = ["lm_head"]
    (dst / "config.json").write_text(json.dumps(cfg))
    llm = load(dst)
    moe = llm.core.executor.model.layers[0].moe
    assert moe.gate.quant_method is None and moe.shared_down.quant_method is not None
    assert greedy(llm) == ids


@pytest.mark.parametrize("scheme", ["w8a8", "w4a16"])
def test_float_layer_the_config_quantizes_is_named(tiny, tmp_path, scheme):
    """A layer stored float that the config does not ignore: the error names
    the missing tensor and the float one, not a download."""
    layer = "model.layers.0.mlp.down_proj"
    dst = quantize(tiny("llama"), tmp_path / "q", scheme=scheme, ignore=(layer,))
    cfg = json.loads((dst / "config.json").read_text())
    cfg["quantization_config"]["ignore"].remove(layer)
    (dst / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError) as exc:
        load(dst)
    msg = str(exc.value)
    assert re.match(rf"tensor {layer}\.weight_\w+ is missing from the quantized checkpoint",
                    msg), msg
    assert f"{layer}.weight unquantized (F32)" in msg
    assert "download" not in msg and "\n" not in msg


def test_unsupported_architecture_is_refused_before_writing(tmp_path, capsys):
    src = make_tiny_model(tmp_path / "src")
    cfg = json.loads((src / "config.json").read_text())
    cfg.update(architectures=["FalconForCausalLM"], model_type="falcon")
    (src / "config.json").write_text(json.dumps(cfg))
    assert cli(["quantize", str(src), str(tmp_path / "q")]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "FalconForCausalLM" in err and "not supported" in err
    assert not (tmp_path / "q").exists() and not (tmp_path / "q.partial").exists()


@pytest.mark.parametrize("arch,ignore,match", [
    ("llama", ("model.layers.0.self_attn.q_proj",), "runs model.layers.0.self_attn.q_proj, "
     "model.layers.0.self_attn.k_proj, model.layers.0.self_attn.v_proj as one layer"),
    ("phi3", ("model.layers.0.self_attn.q_proj",), "not a linear layer of this "
     "Phi3ForCausalLM checkpoint"),
])
def test_ignore_the_engine_could_not_load_is_refused(tiny, tmp_path, arch, ignore, match):
    with pytest.raises(ValueError, match=match):
        quantize(tiny(arch), tmp_path / "q", ignore=ignore)
    assert not (tmp_path / "q").exists() and not (tmp_path / "q.partial").exists()


@pytest.mark.parametrize("scheme", ["w8a8", "w4a16"])
def test_opt_first_exports_without_model_prefix(tmp_path, scheme):
    """OPT's first exports name the decoder without "model.": quantize and the
    loader both take the names the checkpoint has."""
    from safetensors.torch import load_file, save_file

    src = make_tiny_model(tmp_path / "opt", arch="opt")
    tensors = load_file(src / "model.safetensors")
    save_file({k.removeprefix("model."): v for k, v in tensors.items()},
              str(src / "model.safetensors"), metadata={"format": "pt"})
    dst = quantize(src, tmp_path / "q", scheme=scheme)
    assert stored_layers(dst)["decoder.layers.0.fc1"] == "quantized"
    assert [len(i) for i in greedy(load(dst))] == [4] * len(PROMPTS)
