"""Fast checks of the aarch64 plumbing that need no emulation: precompiled
mode's choice between architectures, verify's missing-architecture report,
the ISA names, and ci/build-wheel.sh's --arch errors."""
from __future__ import annotations

import platform

import pytest
from helpers import REPO, run
from packaging.tags import cpython_tags

from engine import envs
from tools.precompiled import select
from wheel_index.maintain import architecture, missing_architectures

pytestmark = pytest.mark.aarch64

WHEELS = {"wheels": [
    {"variant": "cpu", "python_tag": "cp38", "abi_tag": "abi3", "filename": f"x-{arch}.whl",
     "path": f"vllm-engine/x-{arch}.whl", "platform_tag": f"manylinux_2_34_{arch}"}
    for arch in ("x86_64", "aarch64")]}


@pytest.mark.parametrize("machine", ["aarch64", "x86_64"])
def test_precompiled_picks_the_wheel_of_the_machine(machine, monkeypatch):
    plats = [f"manylinux_2_{m}_{machine}" for m in range(36, 16, -1)] + [f"linux_{machine}"]
    monkeypatch.setattr(select, "sys_tags",
                        lambda: cpython_tags((3, 11), ["cp311", "abi3", "none"], plats))
    wheel, url = select.pick_wheel(WHEELS, "cpu", "http://idx", "c/cpu")
    assert wheel["filename"] == f"x-{machine}.whl"
    assert url == f"http://idx/c/cpu/vllm-engine/x-{machine}.whl"


def test_architecture_of_a_platform_tag():
    assert architecture("manylinux_2_34_aarch64") == "aarch64"
    assert architecture("manylinux_2_28_x86_64") == "x86_64"
    assert architecture("manylinux2014_aarch64") == "aarch64"
    assert architecture("linux_x86_64") == "x86_64"


def test_missing_architecture_is_named_per_level():
    a, b, c, d = "a" * 40, "b" * 40, "c" * 40, "d" * 40
    problems = missing_architectures({
        f"{a}/cpu": (100, {"x86_64"}),             # before aarch64 existed: fine
        f"{b}/cpu": (200, {"x86_64", "aarch64"}),
        f"{c}/cpu": (300, {"x86_64"}),             # its aarch64 job failed
        f"{c}/cu130": (300, {"x86_64"}),
        f"{d}/cpu": (400, {"aarch64"})})
    assert problems == [f"{c}/cpu: its aarch64 wheel is missing (earlier commits of cpu have one)",
                        f"{d}/cpu: its x86_64 wheel is missing (earlier commits of cpu have one)"]
    assert missing_architectures({f"{a}/cpu": (1, {"x86_64"}), f"{b}/cpu": (2, {"x86_64"})}) == []


def test_arm_isas_are_valid_choices():
    for isa in ("neon", "neon_bf16"):
        assert envs.cpu_isa({"VLLM_CPU_ISA": isa}) == isa
    with pytest.raises(envs.EnvError, match="neon_bf16"):
        envs.cpu_isa({"VLLM_CPU_ISA": "sve"})


@pytest.mark.parametrize("args,message", [
    (["--arch", "riscv64"], "unknown --arch 'riscv64'; valid: x86_64, aarch64"),
    (["--arch"], "--arch needs a value"),
])
def test_build_wheel_arch_errors(args, message, tmp_path):
    proc = run(["bash", REPO / "ci" / "build-wheel.sh", "cpu", tmp_path, *args], check=False)
    assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.skipif(platform.machine() != "x86_64", reason="cross builds start from x86_64")
def test_cross_build_is_cpu_only(tmp_path):
    proc = run(["bash", REPO / "ci" / "build-wheel.sh", "cu130", tmp_path, "--arch", "aarch64"],
               check=False)
    assert proc.returncode == 2
    assert "cross-builds the cpu variant only (asked: cu130)" in proc.stderr
