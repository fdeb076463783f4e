"""Load the compiled kernels (engine._C) safely.

Before the extension is loaded, the torch it was compiled against is compared
with the installed one, and the CPU code path is chosen from VLLM_CPU_ISA.
check_installed() does the checks that need no torch import (`import engine`).
"""
from __future__ import annotations

import importlib
import importlib.util
import re
from pathlib import Path

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
    """The release must match. For GPU kernels the local label counts too: a +cu129
    build needs CUDA 12 libraries that a +cpu (or the default CUDA 13) torch of the
    same release does not ship. CPU kernels link only libtorch_cpu and libc10,
    which every build of a release carries (the aarch64 cpu wheel is cross-built
    against PyPI's CUDA build and runs on the +cpu one)."""
    if info.torch_version is None:
        return
    same = (Version(installed) == Version(info.torch_version) if info.device != "cpu"
            else Version(installed).public == Version(info.torch_version).public)
    if not same:
        raise TorchMismatchError(
            f"vllm-engine's kernels ({info.variant}) were compiled against torch "
            f"{info.torch_version}, but torch {installed} is installed. The compiled ops would "
            f"fail to load. Fix: {_fix_command(info)}  (or reinstall vllm-engine built for "
            f"torch {installed})"
        )


def installed_torch_version() -> str | None:
    """torch.__version__ without importing torch (seconds): read from torch/version.py."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return None
    try:
        text = (Path(list(spec.submodule_search_locations)[0]) / "version.py").read_text()
    except OSError:
        return None
    m = re.search(r"^__version__\s*(?::\s*\w+\s*)?=\s*['\"]([^'\"]+)['\"]", text, re.M)
    return m.group(1) if m else None


def check_installed() -> None:
    """What `import engine` checks before anything imports torch: a complete
    installation and the torch it was compiled against. VLLM_CPU_ISA is checked
    where the kernels load (`engine.ops`), against what this CPU runs."""
    info = build_info()
    if not info.has_kernels:
        return
    installed = installed_torch_version()
    if installed is not None:  # else load() checks, after importing torch
        check_torch(info, installed)


def load() -> BuildInfo:
    """Load engine._C if this installation has it; return its build info."""
    info = build_info()
    if not info.has_kernels:
        return info
    import torch

    check_torch(info, torch.__version__)
    importlib.import_module("engine._C")
    torch.ops._C.set_device_bound_checks(envs.check_bounds())
    if info.device == "cpu":
        _select_cpu_isa()
    return info


def _select_cpu_isa() -> None:
    import torch

    from engine.platforms import cpu_features

    features = cpu_features.current()
    try:
        requested = envs.cpu_isa()
    except envs.EnvError as exc:
        raise cpu_features.CpuIsaError(
            f"{exc} ({cpu_features.describe(features)})") from None
    compiled = [i for i in torch.ops._C.cpu_compiled_isas().split(",") if i]
    torch.ops._C.select_cpu_isa(cpu_features.choose_isa(requested, features, compiled))
    # the capped flags: VLLM_CPU_MAX_ISA below avx512_bf16 hides AMX too
    torch.ops._C.cpu_set_amx(cpu_features.has_amx(features))
