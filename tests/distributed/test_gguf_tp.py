"""Tensor and pipeline parallel over a GGUF file: each rank cuts its rows or
columns from the file's blocks (engine/model_executor/gguf_shard.py) and runs
the quantized kernels on them; where a column cut falls inside blocks (Q4_K's
256 values, o_proj's 128 columns a rank) that layer is dequantized and runs
in float, said in one log line. Greedy ids of two ranks equal one rank's."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from gguf_files import dequantize, quantize, write_gguf
from helpers import make_checkpoint

pytest.importorskip("gguf", reason="gguf is a runtime requirement (requirements/common.txt)")

REPO = Path(__file__).resolve().parents[2]
PROMPTS = [[1, 5, 6, 7], [1, 9, 10, 11, 12, 13], [1, 20], [1] + list(range(30, 47)) + [5]]

# One engine in a process of its own (the driver rank pins its process, which must
# not be pytest's). Prints the greedy ids as JSON, then what rank 0's layers run.
SCRIPT = """
import json, logging, sys
logging.basicConfig(level=logging.INFO)
from engine import LLM, SamplingParams
llm = LLM(sys.argv[1], "float32", tensor_parallel_size=int(sys.argv[2]),
          pipeline_parallel_size=int(sys.argv[3]), tokenizer=sys.argv[4], num_kv_blocks=16,
          max_model_len=256)
greedy = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
outs = llm.generate(json.loads(sys.argv[5]), greedy)
print(json.dumps([o.outputs[0].token_ids for o in outs]))
model = llm.core.executor.runner.model
layers = {n: getattr(model.layers[0], n) for n in ("qkv", "o_proj", "gate_up", "down")}
layers["lm_head"] = model.lm_head  # None on a first pipeline stage
print(json.dumps({n: getattr(m, "quant_method", None) is not None for n, m in layers.items()}))
"""


def run_engine(file: Path, src: Path, tp: int = 1, pp: int = 1) -> tuple[list, dict, str]:
    """(greedy ids, which of rank 0's first layer's linear layers run quantized, its log)."""
    env = {**os.environ, "PYTHONPATH": str(REPO),
           "VLLM_CPU_OMP_THREADS_BIND": "0|1" if tp * pp == 2 else "0"}
    out = subprocess.run([sys.executable, "-c", SCRIPT, str(file), str(tp), str(pp), str(src),
                          json.dumps(PROMPTS)], env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    ids, quantized = out.stdout.strip().splitlines()[-2:]
    return json.loads(ids), json.loads(quantized), out.stderr


# (family, type, KV heads, tied LM head): Q8_0 and Q4_0 cut between their
# blocks of 32 everywhere; Q4_K's o_proj (128 of 256 columns a rank) cuts inside
# a block of 256, its down_proj (256 of 512) between; one KV head is replicated
# on both ranks (its q/k rows un-permuted before the cut); tied: the LM head is
# token_embd's blocks; Qwen2: q/k/v biases split with their rows. vocab 105: the
# last rank's rows past it are padded with zero blocks.
CASES = {"q8_0-kv2": ("llama", "Q8_0", 2, False), "q4_k-kv1-tied": ("llama", "Q4_K", 1, True),
         "qwen2-q4_0": ("qwen2", "Q4_0", 2, False)}


@pytest.fixture(scope="module", params=list(CASES))
def gguf_file(request, tmp_path_factory) -> tuple[Path, Path, str]:
    arch, qtype, kv, tied = CASES[request.param]
    work = tmp_path_factory.mktemp("gguf-tp")
    src = make_checkpoint(work / "m", arch, hidden=256, inter=512, heads=4, kv_heads=kv)
    _random_biases(src / "model.safetensors")
    file = write_gguf(src, work / f"{request.param}.gguf", qtype,
                      drop=("output.weight",) if tied else ())
    return file, src, request.param


def _random_biases(path: Path) -> None:
    """Biases as large as the weights (transformers starts them at 0, which a
    rank reading another rank's rows would not show)."""
    import torch
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(path))
    g = torch.Generator().manual_seed(0)
    for k, v in tensors.items():
        if k.endswith(".bias"):
            tensors[k] = torch.randn(v.shape, generator=g)
    save_file(tensors, str(path), metadata={"format": "pt"})


@pytest.fixture(autouse=True)
def cache_root(tmp_path, monkeypatch):
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path / "cache"))


@pytest.mark.slow
def test_tp2_greedy_ids_equal_one_rank(gguf_file):
    file, src, case = gguf_file
    one, quantized, _ = run_engine(file, src)
    assert one[0] and all(quantized.values()), quantized
    two, quantized, log = run_engine(file, src, tp=2)
    assert two == one
    if case.startswith("q4_k"):  # o_proj's cut falls inside Q4_K blocks: float, logged
        assert quantized == {"qkv": True, "o_proj": False, "gate_up": True, "down": True,
                             "lm_head": True}
        assert ("o_proj (2 layers) in Q4_K dequantized to float32 at load and run unquantized: "
                "tensor parallel cuts their input columns inside Q4_K blocks of 256 values"
                ) in log
    else:
        assert all(quantized.values()), quantized
        assert "cuts their input columns" not in log


@pytest.mark.slow
@pytest.mark.parametrize("gguf_file", ["q4_k-kv1-tied"], indirect=True)
def test_pp2_greedy_ids_equal_one_rank(gguf_file):
    """Each stage reads its own tensors (the last the tied embedding too)."""
    file, src, _ = gguf_file
    assert run_engine(file, src, pp=2)[0] == run_engine(file, src)[0]


def _weights(qtype: str, rows: int = 6, cols: int = 512) -> np.ndarray:
    rng = np.random.default_rng(0)
    w = rng.standard_normal((rows, cols)).astype(np.float32)
    if qtype == "F16":
        return w.astype(np.float16)
    if qtype == "BF16":  # the reader's layout: the bytes of a row
        return (w.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8).reshape(rows, -1)
    return w if qtype == "F32" else quantize(w, qtype)


def _floats(data: np.ndarray, qtype: str):
    from engine.model_executor.gguf_loader import _float

    return _float(data, qtype)


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_K", "Q6_K", "F32", "F16", "BF16"])
def test_block_slice_equals_the_dequantized_slice(qtype):
    """Rows, and columns cut between blocks, of the file's blocks dequantize to
    the rows and columns of the whole tensor dequantized; a cut inside a block
    has no block form; zero rows pad a rank's part."""
    import torch

    from engine.model_executor.gguf_shard import block_slice, pad_rows, whole_blocks

    data = _weights(qtype)
    whole = _floats(data, qtype)
    assert whole.shape == (6, 512)
    assert torch.equal(_floats(block_slice(data, qtype, 0, 2, 5), qtype), whole[2:5])
    step = {"Q8_0": 32, "Q4_K": 256, "Q6_K": 256}.get(qtype, 1)
    for start, end in ((0, step), (step, 2 * step), (256, 512)):
        cols = block_slice(data, qtype, 1, start, end)
        assert cols is not None and torch.equal(_floats(cols, qtype), whole[:, start:end])
    if step > 1:
        assert block_slice(data, qtype, 1, 0, step // 2) is None
        assert block_slice(data, qtype, 1, step // 2, step + step // 2) is None
        assert not whole_blocks(qtype, (1, step // 2, step)) and whole_blocks(qtype, (0, 1, 3))
    padded = pad_rows(block_slice(data, qtype, 0, 4, 6), 4)
    assert torch.equal(_floats(padded, qtype), torch.cat([whole[4:6], torch.zeros(2, 512)]))


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_K", "Q5_K", "Q6_K", "Q4_1"])
def test_kernel_form_of_a_cut_equals_the_dequantized_slice(qtype):
    """What a rank's quantized layer holds (gguf_blocks.unpack of its cut of the
    blocks) is the whole tensor dequantized, sliced."""
    import torch

    from engine.model_executor.gguf_shard import block_slice
    from engine.model_executor.layers.quantization.gguf_blocks import dequantized, unpack

    data = _weights(qtype)
    whole = torch.from_numpy(dequantize(data, qtype))
    rows = unpack(qtype, block_slice(data, qtype, 0, 1, 4), 3, 512)
    assert torch.equal(dequantized(rows), whole[1:4])
    cols = unpack(qtype, block_slice(data, qtype, 1, 256, 512), 6, 256)
    assert torch.equal(dequantized(cols), whole[:, 256:])


def test_gguf_parallel_config(tmp_path):
    """A Llama GGUF file takes -tp 2 and -pp 2; an architecture tensor parallel
    does not split (Phi-3's fused tensors) is refused in one line naming -tp 1."""
    from engine import tiny_model
    from engine.engine_args import create_engine_config

    src = make_checkpoint(tmp_path / "m", "llama")
    file = write_gguf(src, tmp_path / "m.gguf", "Q8_0")
    kw = dict(num_kv_blocks=8, block_size=32, max_model_len=256, tokenizer=str(src))
    assert create_engine_config(file, tensor_parallel_size=2, **kw).tensor_parallel_size == 2
    assert create_engine_config(file, pipeline_parallel_size=2, **kw).pipeline_parallel_size == 2
    phi3 = tiny_model.make_tiny_model(tmp_path / "phi3", arch="phi3")
    with pytest.raises(ValueError, match=r"so far, not Phi3ForCausalLM; use "
                                         r"tensor_parallel_size 1$"):
        create_engine_config(write_gguf(phi3, tmp_path / "phi3.gguf", "F32"),
                             tensor_parallel_size=2, **kw)
