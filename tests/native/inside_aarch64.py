"""Run on aarch64 (in the arm64 chroot under qemu, or natively) by
tests/toolchain/test_aarch64.py, in the same pytest session as test_ops.py and the greedy
engine tests: one `import torch` for everything, since PyPI's aarch64 torch (a
CUDA 13 build) takes about 45 CPU-seconds to import under qemu.

Imports only engine, torch and the repository's tools (copied to ../src)."""
from __future__ import annotations

import json
import os
import platform
import sys
from pathlib import Path

import pytest
import torch

import engine
from engine import ops
from engine.cli import main as engine_main
from engine.platforms.cpu_features import CpuIsaError

HERE = Path(__file__).resolve().parent


def cpu_has_bf16() -> bool:
    """HWCAP2_BF16 and HWCAP_ASIMDDP, what csrc/cpu/isa.cpp asks too (qemu's CPU has both)."""
    import ctypes

    libc = ctypes.CDLL(None)
    libc.getauxval.restype = ctypes.c_ulong
    # AT_HWCAP2's HWCAP2_BF16, AT_HWCAP's HWCAP_ASIMDDP
    return bool(libc.getauxval(26) & (1 << 14)) and bool(libc.getauxval(16) & (1 << 20))


BEST = "neon_bf16" if cpu_has_bf16() else "neon"


def test_this_is_the_installed_aarch64_wheel():
    assert platform.machine() == "aarch64"
    assert "site-packages" in engine.__file__, engine.__file__  # not a source checkout
    info = engine.BUILD_INFO
    assert info.processor == "aarch64" and info.variant == "cpu"
    assert torch.ops._C.cpu_compiled_isas() == "neon_bf16,neon"


def test_run_time_choice_of_the_arm_code_path():
    assert ops.select_cpu_isa("auto") == BEST
    assert ops.select_cpu_isa("neon") == "neon"
    with pytest.raises(CpuIsaError, match="not compiled into this build"):
        ops.select_cpu_isa("avx2")
    ops.select_cpu_isa("auto")


def test_engine_env(capsys):
    assert engine_main(["env", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["processor"] == "aarch64"
    assert data["code_paths"] == ["cpu-neon", "cpu-neon_bf16"]
    assert data["cpu_isa_in_use"] == BEST
    assert data["variant"] == "cpu" and data["platform_class"] == "CpuPlatform"
    assert engine_main(["env"]) == 0
    text = capsys.readouterr().out
    assert "aarch64" in text and BEST in text


def test_precompiled_mode_picks_the_aarch64_wheel():
    meta = json.loads((HERE.parent / "metadata.json").read_text())
    sys.path.insert(0, str(HERE.parent / "src"))
    from tools.precompiled.select import pick_wheel

    wheel, url = pick_wheel(meta, "cpu", "http://index", "c/cpu")
    assert wheel["filename"].endswith("_aarch64.whl"), wheel["filename"]
    assert os.environ.get("VLLM_EXPECT_WHEEL", wheel["filename"]) == wheel["filename"]


def test_greedy_output_matches_transformers(tmp_path):
    """The engine on the compiled ARM kernels equals, token for token, the
    engine on the pure-torch reference ops (engine.reference), and equals
    transformers' generate() wherever torch itself agrees with transformers.
    Under qemu, torch's own aarch64 numerics (the engine with no compiled
    kernels at all, one prompt at a time) depart from transformers on the
    long prompt of this set; on x86_64 all six match (tests/engine/test_engine.py)."""
    from helpers import make_checkpoint
    from test_engine import PROMPTS, hf_greedy

    from engine import reference
    from engine.entrypoints.llm import LLM
    from engine.sampling_params import SamplingParams

    path = make_checkpoint(tmp_path / "llama", "llama", seed=0)
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)

    def generate():
        llm = LLM(model=path, dtype="float32", bind_threads=False, block_size=32, num_kv_blocks=64)
        outs = llm.generate(PROMPTS, params)
        return [o.outputs[0].token_ids for o in outs], [o.prompt_token_ids for o in outs]

    kernels, prompt_ids = generate()
    saved = {n: getattr(ops, n) for n in ("rms_norm", "fused_add_rms_norm", "silu_and_mul",
                                           "rotary_embedding", "reshape_and_cache", "paged_attention")}
    try:
        for name in saved:
            setattr(ops, name, getattr(reference, name))
        plain, _ = generate()
    finally:
        for name, fn in saved.items():
            setattr(ops, name, fn)
    assert kernels == plain
    hf = [hf_greedy(path, ids, 24) for ids in prompt_ids]
    agreeing = [i for i in range(len(PROMPTS)) if plain[i] == hf[i]]
    assert len(agreeing) >= len(PROMPTS) - 1, (plain, hf)
    for i in agreeing:
        assert kernels[i] == hf[i]


def test_gguf_layers_run_the_int8_kernel(tmp_path, monkeypatch):
    """A Q4_K GGUF file's layers on the ARM int8 kernel (not engine.reference's
    product, which unpacks the weight every call) and the engine's greedy
    output with it equal, token for token, to the same engine on that reference."""
    from unittest import mock

    from gguf_files import QUANT_SHAPE, write_gguf

    from engine import reference, tiny_model
    from engine.entrypoints.llm import LLM
    from engine.sampling_params import SamplingParams

    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path / "cache"))
    with mock.patch.dict(tiny_model.SHAPE, QUANT_SHAPE):
        src = tiny_model.make_tiny_model(tmp_path / "tiny")
    file = write_gguf(src, tmp_path / "m.gguf", "Q4_K")
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    prompts = ["The capital of France is", "1, 2, 3,"]

    def generate():
        llm = LLM(model=str(file), dtype="float32", bind_threads=False, max_model_len=128,
                  num_kv_blocks=8, block_size=32)
        layers = [m for m in llm.core.executor.runner.model.modules() if getattr(m, "gguf_int8", None)]
        assert layers and all(m.gguf_int8_rows > 0 for m in layers)
        return [o.outputs[0].token_ids for o in llm.generate(prompts, params)]

    assert ops.has_gguf_int8_linear()
    kernels = generate()
    with mock.patch.object(ops, "gguf_int8_linear", reference.gguf_int8_linear):
        plain = generate()
    assert kernels == plain and len(kernels[0]) == 16
