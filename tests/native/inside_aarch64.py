"""Run on aarch64 (in the arm64 chroot under qemu, or natively) by
tests/test_aarch64.py, in the same pytest session as test_ops.py and the greedy
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

HERE = Path(__file__).resolve().parent


def cpu_has_bf16() -> bool:
    """HWCAP2_BF16, what csrc/cpu/isa.cpp asks too (qemu's CPU has it)."""
    import ctypes

    libc = ctypes.CDLL(None)
    libc.getauxval.restype = ctypes.c_ulong
    return bool(libc.getauxval(26) & (1 << 14))  # AT_HWCAP2, HWCAP2_BF16


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
    with pytest.raises(RuntimeError, match="not compiled into this build"):
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
