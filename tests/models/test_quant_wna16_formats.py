"""Weight-only 4/8-bit checkpoints written here in the exact layouts of their
makers (the packers below follow compressed-tensors' pack_to_int32, AutoGPTQ's
QuantLinear.pack and AutoAWQ's WQLinear_GEMM.from_linear): the engine reads
each into the same q, zeros and scales, and its greedy ids equal a torch
fake-quant reference's (the dequantised weights in plain nn.Linear) exactly."""
from __future__ import annotations

import json
import re
import shutil

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from helpers import make_checkpoint
from safetensors.torch import load_file, save_file
from test_quantization import PROMPTS, engine_greedy, model_greedy

from engine.model_executor.layers.quantization import config_for, wna16_formats

_LINEAR = re.compile(r"model\.layers\.(\d+)\.(self_attn\.[qkvo]_proj|mlp\.(gate|up|down)_proj)"
                     r"\.weight$")
LONG = [1] + [3 + i % 50 for i in range(79)]  # 80 tokens: the large-M (dequantised) path


# ---- the makers' packing, as their code does it ------------------------------

def ct_pack(value: torch.Tensor, bits: int, packed_dim: int = 1) -> torch.Tensor:
    """compressed-tensors pack_to_int32: signed values + 2**(bits-1), 32/bits an
    int32 along packed_dim, value i at bits i*bits, zero-padded."""
    value = (value + (1 << (bits - 1))).to(torch.uint8)
    pf = 32 // bits
    if packed_dim == 0:
        value = value.transpose(0, 1)
    rows, cols = value.shape
    value = F.pad(value, (0, -(-cols // pf) * pf - cols))
    packed = (value.view(rows, -1, pf).to(torch.int32)
              << torch.arange(pf, dtype=torch.int32) * bits).sum(dim=2, dtype=torch.int32)
    return packed.transpose(0, 1) if packed_dim == 0 else packed


def gptq_pack(intweight: torch.Tensor, zeros: torch.Tensor, bits: int):
    """AutoGPTQ QuantLinear.pack: intweight [N, K] and zeros [N, groups],
    unsigned -> qweight [K*bits/32, N] packed along K, qzeros [groups,
    N*bits/32] of zeros - 1 packed along N."""
    pf = 32 // bits
    iw = intweight.t().contiguous().numpy().astype(np.uint32)
    qweight = np.zeros((iw.shape[0] // 32 * bits, iw.shape[1]), dtype=np.uint32)
    i = row = 0
    while row < qweight.shape[0]:
        for j in range(i, i + pf):
            qweight[row] |= iw[j] << (bits * (j - i))
        i += pf
        row += 1
    z = (zeros.t().contiguous() - 1).numpy().astype(np.uint32)
    qzeros = np.zeros((z.shape[0], z.shape[1] // 32 * bits), dtype=np.uint32)
    i = col = 0
    while col < qzeros.shape[1]:
        for j in range(i, i + pf):
            qzeros[:, col] |= z[:, j] << (bits * (j - i))
        i += pf
        col += 1
    return torch.from_numpy(qweight.astype(np.int32)), torch.from_numpy(qzeros.astype(np.int32))


def awq_pack(intweight: torch.Tensor, zeros: torch.Tensor):
    """AutoAWQ WQLinear_GEMM.from_linear (4-bit): intweight [N, K], zeros [N,
    groups] -> qweight [K, N/8], qzeros [groups, N/8], both packed along N
    with value i of an int32 being column order_map[i] of its 8."""
    order_map = [0, 2, 4, 6, 1, 3, 5, 7]

    def pack(t):  # [rows, N] -> [rows, N/8]
        t = t.to(torch.int32)
        out = torch.zeros((t.shape[0], t.shape[1] // 8), dtype=torch.int32)
        for col in range(t.shape[1] // 8):
            for i in range(8):
                out[:, col] |= t[:, col * 8 + order_map[i]] << (i * 4)
        return out

    return pack(intweight.t().contiguous()), pack(zeros.t().contiguous())


# ---- a round-to-nearest quantizer and the checkpoints ------------------------

def rtn(w: torch.Tensor, bits: int, group: int, sym: bool, g_idx: torch.Tensor):
    """q [N, K], zeros [N, groups] unsigned, scales [N, groups] (float16-rounded)."""
    n, k = w.shape
    groups = int(g_idx.max()) + 1
    hi = torch.stack([w[:, g_idx == g].amax(1) for g in range(groups)], 1)
    lo = torch.stack([w[:, g_idx == g].amin(1) for g in range(groups)], 1)
    top = (1 << bits) - 1
    if sym:
        s = torch.maximum(hi.abs(), lo.abs()) / ((top + 1) / 2 - 0.5)
        z = torch.full_like(s, (top + 1) // 2, dtype=torch.int64)
    else:
        s = (hi - lo) / top
        z = torch.round(-lo / s.half().float()).clamp(1, top).long()
    s = s.half().float()
    q = torch.clamp(torch.round(w / s[:, g_idx]) + z[:, g_idx], 0, top).long()
    return q, z, s


def dequant(q, z, s, g_idx):
    return (q - z[:, g_idx]).float() * s[:, g_idx]


def write(src, dst, fmt: str, bits: int, group: int, sym: bool, act_order: bool) -> dict:
    """`src` quantized into `dst` in format fmt (ct, gptq, awq); returns the
    fake-quant weights by checkpoint key."""
    dst.mkdir()
    for f in src.iterdir():
        if f.suffix != ".safetensors":
            shutil.copy2(f, dst / f.name)
    tensors, fake = load_file(src / "model.safetensors"), {}
    for key in sorted(tensors):
        m = _LINEAR.match(key)
        if not m:
            continue
        w, name = tensors.pop(key).float(), key[:-len(".weight")]
        n, k = w.shape
        g = k if group == -1 else group
        g_idx = torch.arange(k) // g
        if act_order:  # one order per input: the fused parts (q/k/v, gate/up) share it
            seed = int(m.group(1)) * 10 + {"q": 0, "k": 0, "v": 0, "o": 1, "g": 2, "u": 2,
                                           "d": 3}[name.split(".")[-1][0]]
            g_idx = g_idx[torch.randperm(k, generator=torch.Generator().manual_seed(seed))]
        q, z, s = rtn(w, bits, g, sym, g_idx)
        fake[key] = dequant(q, z, s, g_idx)
        if fmt == "gptq":
            tensors[f"{name}.qweight"], tensors[f"{name}.qzeros"] = gptq_pack(q, z, bits)
            tensors[f"{name}.scales"] = s.t().contiguous().half()
            tensors[f"{name}.g_idx"] = g_idx.int()
        elif fmt == "awq":
            tensors[f"{name}.qweight"], tensors[f"{name}.qzeros"] = awq_pack(q, z)
            tensors[f"{name}.scales"] = s.t().contiguous().half()
        else:
            off = 1 << (bits - 1)
            tensors[f"{name}.weight_packed"] = ct_pack((q - off).to(torch.int8), bits)
            tensors[f"{name}.weight_scale"] = s.half()
            tensors[f"{name}.weight_shape"] = torch.tensor([n, k])
            if not sym:
                zp = ct_pack((z - off).to(torch.int8), bits, packed_dim=0)
                tensors[f"{name}.weight_zero_point"] = zp.contiguous()
            if act_order:
                tensors[f"{name}.weight_g_idx"] = g_idx.int()
    save_file(tensors, str(dst / "model.safetensors"), metadata={"format": "pt"})
    cfg = json.loads((src / "config.json").read_text())
    cfg["quantization_config"] = quant_config(fmt, bits, group, sym, act_order)
    (dst / "config.json").write_text(json.dumps(cfg))
    return fake


def quant_config(fmt, bits, group, sym, act_order) -> dict:
    if fmt == "gptq":
        return {"quant_method": "gptq", "bits": bits, "group_size": group, "desc_act": act_order,
                "sym": sym, "checkpoint_format": "gptq", "static_groups": False,
                "true_sequential": True, "damp_percent": 0.01, "lm_head": False}
    if fmt == "awq":
        return {"quant_method": "awq", "bits": bits, "group_size": group, "zero_point": not sym,
                "version": "gemm", "modules_to_not_convert": None}
    weights = {"num_bits": bits, "type": "int", "symmetric": sym, "dynamic": False,
               "strategy": "channel" if group == -1 else "group",
               "group_size": None if group == -1 else group,
               "actorder": "group" if act_order else None, "observer": "minmax"}
    return {"quant_method": "compressed-tensors", "format": "pack-quantized",
            "quantization_status": "compressed", "ignore": ["lm_head"], "config_groups": {
                "group_0": {"targets": ["Linear"], "weights": weights,
                            "input_activations": None, "format": "pack-quantized"}}}


CASES = {  # fmt, bits, group, sym, act_order
    "gptq-4-sym": ("gptq", 4, 32, True, False),
    "gptq-4-asym-desc": ("gptq", 4, 64, False, True),
    "gptq-8-asym-desc": ("gptq", 8, 32, False, True),
    "gptq-4-channel": ("gptq", 4, -1, True, False),
    "awq-4": ("awq", 4, 32, False, False),
    "awq-4-nozero": ("awq", 4, 64, True, False),
    "ct-4-asym-actorder": ("ct", 4, 32, False, True),
    "ct-8-channel": ("ct", 8, -1, True, False),
}


@pytest.fixture(scope="module")
def float_ckpt(tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp("wna16") / "float", "llama", seed=3,
                           hidden=128, inter=256)


@pytest.mark.parametrize("case", list(CASES))
def test_reader_gets_back_what_the_maker_packed(float_ckpt, tmp_path, case):
    """Tensor by tensor: the layer's weight as the engine unpacks and orders it
    is the one quantized here."""
    fake = write(float_ckpt, tmp_path / case, *CASES[case])
    config = config_for(tmp_path / case)
    name = "model.layers.1.self_attn.q_proj"
    method = config.method_for((name,))
    got = config.read_layer(wna16_formats.Reader(tmp_path / case), name, method, 128)
    g_idx = got["g_idx"].long() if got["g_idx"] is not None else torch.arange(128) // got["group"]
    w = (got["q"].long() - got["zeros"].long()[:, g_idx]).float() * got["scales"].float()[:, g_idx]
    assert torch.equal(w, fake[f"{name}.weight"])


def fake_quant_greedy(src, fake: dict, prompts, n: int) -> list[list[int]]:
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32).eval()
    for key, w in fake.items():
        model.get_submodule(key[:-len(".weight")]).weight.data.copy_(w)
    return model_greedy(model, prompts, n)


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_greedy_equals_fake_quant_reference(float_ckpt, tmp_path, case):
    fake = write(float_ckpt, tmp_path / case, *CASES[case])
    prompts = [*PROMPTS, LONG]
    ours = engine_greedy(tmp_path / case, prompts, 12)
    assert ours == fake_quant_greedy(float_ckpt, fake, prompts, 12)
    assert ours != engine_greedy(float_ckpt, prompts, 12)  # quantization changed something


# One engine in a process of its own (the driver rank pins its process, which must not be
# pytest's): the greedy ids as JSON, or the error line.
TP_SCRIPT = """
import json, sys
from engine import LLM, SamplingParams
try:
    llm = LLM(sys.argv[1], "float32", tensor_parallel_size=int(sys.argv[2]), block_size=32,
              num_kv_blocks=64)
    outs = llm.generate(prompt_token_ids=json.loads(sys.argv[3]), sampling_params=SamplingParams(
        temperature=0, max_tokens=12, ignore_eos=True))
except ValueError as exc:
    print("ERROR", exc)
else:
    print(json.dumps([o.outputs[0].token_ids for o in outs]))
"""


def tp_greedy(path, tp: int, prompts) -> str:
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2]),
           "VLLM_CPU_OMP_THREADS_BIND": "0|1" if tp == 2 else "0"}
    out = subprocess.run([sys.executable, "-c", TP_SCRIPT, str(path), str(tp),
                          json.dumps(prompts)], env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout.strip().splitlines()[-1]


@pytest.mark.slow
@pytest.mark.parametrize("case", ["gptq-4-sym", "awq-4-nozero", "ct-8-channel"])
def test_tp2_greedy_equals_one_rank(float_ckpt, tmp_path, case):
    """Each rank keeps its rows (q/k/v, gate/up) or its columns and their
    groups (o_proj, down_proj) of the layers it read whole."""
    write(float_ckpt, tmp_path / case, *CASES[case])
    prompts = [*PROMPTS, LONG]
    one = tp_greedy(tmp_path / case, 1, prompts)
    assert json.loads(one)[0]
    assert tp_greedy(tmp_path / case, 2, prompts) == one


@pytest.mark.slow
def test_tp2_refuses_act_order_groups_split_over_ranks(float_ckpt, tmp_path):
    write(float_ckpt, tmp_path / "desc", *CASES["gptq-4-asym-desc"])
    line = tp_greedy(tmp_path / "desc", 2, PROMPTS)
    assert line.startswith("ERROR") and "act-order" in line and "tensor_parallel_size 1" in line
