"""Load the compiled kernels (engine._C) safely.

Before the extension is loaded, the torch it was compiled against is compared
with the installed one, and the CPU code path is chosen from VLLM_CPU_ISA.
"""
from __future__ import annotations

import importlib

import torch
from packaging.version import Version

from engine import envs
from engine.build_info import BuildInfo, build_info


class TorchMismatchError(ImportError):
    """The installed torch is not the one the kernels were compiled against."""


def _fix_command(info: BuildInfo) -> str:
    req = info.torch_requirement
    if not req or req == "torch":  # built with use_existing_torch.py: no pin recorded
        req = f"torch=={info.torch_version}"
    if info.torch_index_url:
        return f"pip install '{req}' --index-url {info.torch_index_url}"
    return f"pip install '{req}'"


def check_torch(info: BuildInfo, installed: str) -> None:
    if info.torch_version is None:
        return
    if Version(installed).public != Version(info.torch_version).public:
        raise TorchMismatchError(
            f"vllm-engine's kernels ({info.variant}) were compiled against torch "
            f"{info.torch_version}, but torch {installed} is installed. The compiled ops would "
            f"fail to load. Fix: {_fix_command(info)}  (or reinstall vllm-engine built for "
            f"torch {installed})"
        )


def load() -> BuildInfo:
    """Load engine._C if this installation has it; return its build info."""
    info = build_info()
    if not info.has_kernels:
        return info
    check_torch(info, torch.__version__)
    importlib.import_module("engine._C")
    if info.device == "cpu":
        _select_cpu_isa()
    return info


def _select_cpu_isa() -> None:
    from engine import cpu_features

    features = cpu_features.current()
    try:
        requested = envs.cpu_isa()
    except envs.EnvError as exc:
        raise cpu_features.CpuIsaError(
            f"{exc} ({cpu_features.describe(features)})") from None
    compiled = [i for i in torch.ops._C.cpu_compiled_isas().split(",") if i]
    torch.ops._C.select_cpu_isa(cpu_features.choose_isa(requested, features, compiled))
