"""Target detection: fake machines (Machine values and small fake roots), no real GPU."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.version import Version

from tools import accelerator, target
from tools.accelerator import Machine, probe
from tools.errors import UserError
from tools.target import choose

REPO = Path(__file__).resolve().parents[2]
V = Version

CASES = [
    # (id, machine, env, device, variant)
    ("no-gpu", Machine("Linux"), {}, "cpu", "cpu"),
    ("driver-550", Machine("Linux", nvidia_gpu=True, nvidia_driver=V("550.54.14")), {}, "cuda", "cu129"),
    ("driver-580", Machine("Linux", nvidia_gpu=True, nvidia_driver=V("580.65.06")), {}, "cuda", "cu130"),
    ("driver-525.60.13", Machine("Linux", nvidia_gpu=True, nvidia_driver=V("525.60.13")), {}, "cuda", "cu129"),
    ("torch-cuda-12.9", Machine("Linux", nvidia_gpu=True, nvidia_driver=V("580.1"), torch_cuda="12.9"),
     {}, "cuda", "cu129"),
    ("torch-cuda-no-driver", Machine("Linux", torch_cuda="13.0"), {}, "cuda", "cu130"),
    ("rocm-7.0", Machine("Linux", rocm=V("7.0.0"), amd_gpu=True), {}, "rocm", "rocm700"),
    ("rocm-7.2.1", Machine("Linux", rocm=V("7.2.1"), amd_gpu=True), {}, "rocm", "rocm721"),
    ("torch-hip", Machine("Linux", torch_hip="7.2.26015", rocm=V("7.0.0")), {}, "rocm", "rocm721"),
    ("intel-gpu", Machine("Linux", intel_gpu=True), {}, "xpu", "xpu"),
    ("macos", Machine("Darwin"), {}, "cpu", "cpu"),
    ("windows", Machine("Windows"), {}, "empty", "empty"),
    ("nvidia-and-amd", Machine("Linux", nvidia_gpu=True, nvidia_driver=V("580.1"), rocm=V("7.0.1"),
                               amd_gpu=True), {}, "rocm", "rocm700"),
    ("nvidia-no-version", Machine("Linux", nvidia_gpu=True), {}, "cuda", "cu130"),
    # overrides
    ("force-cpu-on-nvidia", Machine("Linux", nvidia_gpu=True, nvidia_driver=V("580.1")),
     {"VLLM_TARGET_DEVICE": "cpu"}, "cpu", "cpu"),
    ("force-cuda-no-gpu", Machine("Linux"), {"VLLM_TARGET_DEVICE": "cuda"}, "cuda", "cu130"),
    ("main-cuda-12.9", Machine("Linux", nvidia_gpu=True, nvidia_driver=V("580.1")),
     {"VLLM_MAIN_CUDA_VERSION": "12.9"}, "cuda", "cu129"),
    ("main-cuda-13", Machine("Linux", torch_cuda="12.9"), {"VLLM_MAIN_CUDA_VERSION": "13.0"}, "cuda", "cu130"),
    ("precompiled-variant", Machine("Linux"), {"VLLM_PRECOMPILED_WHEEL_VARIANT": "rocm700"}, "rocm", "rocm700"),
    ("precompiled-cpu-on-gpu", Machine("Linux", nvidia_gpu=True, nvidia_driver=V("580.1")),
     {"VLLM_PRECOMPILED_WHEEL_VARIANT": "cpu"}, "cpu", "cpu"),
    ("force-empty", Machine("Linux"), {"VLLM_TARGET_DEVICE": "empty"}, "empty", "empty"),
    ("force-xpu", Machine("Linux"), {"VLLM_TARGET_DEVICE": "xpu"}, "xpu", "xpu"),
]


@pytest.mark.parametrize("machine,env,device,variant", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_choose(machine, env, device, variant):
    t = choose(machine, env)
    assert (t.device, t.variant.label) == (device, variant)
    assert t.reasons


def test_macos_warns():
    assert any("warning" in r and "macOS" in r for r in choose(Machine("Darwin"), {}).reasons)


INVALID = [
    ({"VLLM_TARGET_DEVICE": "tpu"}, Machine("Linux"), "valid values: cuda, rocm, xpu, cpu, empty"),
    ({"VLLM_MAIN_CUDA_VERSION": "11.8"}, Machine("Linux", nvidia_gpu=True), "use 12.x (cu129) or 13.x"),
    ({"VLLM_PRECOMPILED_WHEEL_VARIANT": "cu118"}, Machine("Linux"), "valid variants: cu129, cu130"),
    ({"VLLM_PRECOMPILED_WHEEL_VARIANT": "cu130", "VLLM_TARGET_DEVICE": "cpu"}, Machine("Linux"),
     "make them agree"),
    ({}, Machine("Linux", nvidia_gpu=True, nvidia_driver=V("470.1")), "too old"),
    ({}, Machine("Linux", rocm=V("6.4.1")), "supported ROCm versions: 7.0, 7.2"),
    ({"VLLM_TARGET_DEVICE": "rocm"}, Machine("Linux"), "no ROCm version was found"),
]


@pytest.mark.parametrize("env,machine,message", INVALID)
def test_invalid_overrides_and_machines(env, machine, message):
    with pytest.raises(UserError, match=message.replace("(", r"\(").replace(")", r"\)")):
        choose(machine, env)


# ---- probe: fake roots and fake helper programs ----------------------------------


def write(root: Path, rel: str, text: str) -> None:
    p = root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)


def fake_bin(tmp_path: Path, name: str, script: str):
    d = tmp_path / "bin"
    d.mkdir(exist_ok=True)
    exe = d / name
    exe.write_text("#!/bin/sh\n" + script + "\n")
    exe.chmod(0o755)
    return lambda prog: shutil.which(prog, path=str(d))


def no_helpers(prog):
    return None


def test_probe_driver_from_sys_module(tmp_path):
    write(tmp_path, "sys/module/nvidia/version", "580.65.06\n")
    m = probe(tmp_path, which=no_helpers, env={})
    assert m.nvidia_driver == V("580.65.06") and m.nvidia_gpu
    assert choose(m, {}).variant.label == "cu130"


def test_probe_driver_from_proc(tmp_path):
    write(tmp_path, "proc/driver/nvidia/version",
          "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.14  Thu Feb 22 01:44:30 UTC 2024\n")
    m = probe(tmp_path, which=no_helpers, env={})
    assert m.nvidia_driver == V("550.54.14")
    assert choose(m, {}).variant.label == "cu129"


def test_probe_driver_from_nvidia_smi(tmp_path):
    which = fake_bin(tmp_path, "nvidia-smi", "echo 580.82.07")
    m = probe(tmp_path / "root", which=which, env={})
    assert m.nvidia_driver == V("580.82.07")


def test_broken_nvidia_smi_is_a_reason_not_a_crash(tmp_path):
    which = fake_bin(tmp_path, "nvidia-smi", "echo 'NVIDIA-SMI has failed' >&2; exit 9")
    m = probe(tmp_path / "root", which=which, env={})
    assert m.nvidia_driver is None
    assert any("nvidia-smi failed with exit code 9" in n for n in m.notes)
    assert choose(m, {}).device == "cpu"


def test_hung_nvidia_smi_times_out(tmp_path, monkeypatch):
    monkeypatch.setattr(accelerator, "HELPER_TIMEOUT_S", 0.5)
    which = fake_bin(tmp_path, "nvidia-smi", "sleep 30")
    m = probe(tmp_path / "root", which=which, env={})
    assert any("did not answer" in n for n in m.notes)


def test_probe_rocm_and_kfd(tmp_path):
    write(tmp_path, "opt/rocm/.info/version", "7.2.1-81\n")
    (tmp_path / "sys/class/kfd").mkdir(parents=True)
    which = fake_bin(tmp_path, "rocm_agent_enumerator", "echo gfx000; echo gfx942")
    m = probe(tmp_path, which=which, env={})
    assert m.rocm == V("7.2.1") and m.rocm_agents == ("gfx942",) and m.amd_gpu
    assert choose(m, {}).variant.label == "rocm721"


def test_probe_rocm_path_env(tmp_path):
    write(tmp_path, "custom/rocm/.info/version", "7.0.2\n")
    m = probe(tmp_path, which=no_helpers, env={"ROCM_PATH": "/custom/rocm"})
    assert m.rocm == V("7.0.2")


def test_probe_intel_gpu_on_pci(tmp_path):
    write(tmp_path, "sys/bus/pci/devices/0000:03:00.0/class", "0x030000\n")
    write(tmp_path, "sys/bus/pci/devices/0000:03:00.0/vendor", "0x8086\n")
    write(tmp_path, "sys/bus/pci/devices/0000:00:1f.0/class", "0x060100\n")  # a bridge
    write(tmp_path, "sys/bus/pci/devices/0000:00:1f.0/vendor", "0x8086\n")
    m = probe(tmp_path, which=no_helpers, env={})
    assert m.intel_gpu and choose(m, {}).device == "xpu"


def test_probe_intel_bridge_is_not_a_gpu(tmp_path):
    write(tmp_path, "sys/bus/pci/devices/0000:00:1f.0/class", "0x060100\n")
    write(tmp_path, "sys/bus/pci/devices/0000:00:1f.0/vendor", "0x8086\n")
    assert not probe(tmp_path, which=no_helpers, env={}).intel_gpu


def test_probe_reads_nothing_outside_root(tmp_path):
    m = probe(tmp_path, which=no_helpers, env={})
    assert m == Machine(m.os)  # an empty root is a machine with nothing


def run_cli(*args, env=None, root=None):
    full = {**os.environ, **(env or {})}
    if root is not None:
        full["VLLM_DETECT_ROOT"] = str(root)
    full["PATH"] = os.path.dirname(sys.executable)  # no real nvidia-smi etc.
    return subprocess.run([sys.executable, "-m", "tools.target", *args], cwd=REPO, env=full,
                          capture_output=True, text=True, timeout=120)


def test_cli_json(tmp_path):
    write(tmp_path, "sys/module/nvidia/version", "550.1\n")
    res = run_cli("--json", env={"VLLM_TORCH_INDEX_BASE": "http://127.0.0.1:9/whl"}, root=tmp_path)
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    assert data["device"] == "cuda" and data["variant"] == "cu129"
    assert data["torch_backend"] == "cu129"
    assert data["torch_index_url"] == "http://127.0.0.1:9/whl/cu129"
    pin = data["torch_requirement"]
    assert pin == target.torch_requirement(target.get_variant("cu129"))  # requirements/torch/
    assert pin.startswith("torch==") and pin.endswith("+cu129")
    assert any("550.1" in r for r in data["reasons"])


def test_cli_rocm_index_spelling(tmp_path):
    write(tmp_path, "opt/rocm/.info/version", "7.0.0\n")
    data = json.loads(run_cli("--json", root=tmp_path).stdout)
    assert data["variant"] == "rocm700"
    assert data["torch_index_url"] == "https://download.pytorch.org/whl/rocm7.0"


def test_cli_text_and_commands(tmp_path):
    res = run_cli(root=tmp_path)
    assert "variant:           cpu" in res.stdout and "reasons:" in res.stdout
    res = run_cli("--commands", env={"VLLM_WHEEL_INDEX": "http://idx"}, root=tmp_path)
    assert "uv pip install vllm-engine --extra-index-url http://idx/nightly/cpu" in res.stdout
    assert "--torch-backend cpu" in res.stdout
    default = run_cli("--commands", root=tmp_path).stdout  # the project's folder index
    assert f"--extra-index-url {(REPO / 'index').as_uri()}/nightly/cpu" in default


def test_cli_invalid_override_is_one_clear_line(tmp_path):
    res = run_cli(env={"VLLM_TARGET_DEVICE": "tpu"}, root=tmp_path)
    assert res.returncode == 2
    assert "Traceback" not in res.stderr
    assert "valid values: cuda, rocm, xpu, cpu, empty" in res.stderr


@pytest.mark.parametrize("text,expected", [
    ("__version__ = '2.13.0+cu129'\ncuda: Optional[str] = '12.9'\nhip: Optional[str] = None\n",
     ("12.9", None, None)),
    ("__version__ = '2.13.0+rocm7.0'\ncuda = None\nhip = '7.0.51831'\n", (None, "7.0.51831", None)),
])
def test_torch_versions_are_read_without_importing_torch(tmp_path, monkeypatch, text, expected):
    import importlib.machinery
    import importlib.util

    pkg = tmp_path / "torch"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("raise ImportError('importing torch is too slow here')\n")
    (pkg / "version.py").write_text("from typing import Optional\n" + text)
    spec = importlib.machinery.ModuleSpec("torch", None, is_package=True)
    spec.submodule_search_locations = [str(pkg)]
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: spec if name == "torch" else real(name, *a))
    assert accelerator._torch_versions() == expected


def test_unreadable_torch_version_is_a_reason(tmp_path, monkeypatch):
    import importlib.machinery
    import importlib.util

    spec = importlib.machinery.ModuleSpec("torch", None, is_package=True)
    spec.submodule_search_locations = [str(tmp_path / "torch")]  # no version.py
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: spec)
    cuda, hip, problem = accelerator._torch_versions()
    assert cuda is None and hip is None and "cannot be read" in problem
