"""The platform the engine runs on, chosen once at first use.

The choice agrees with the variant the kernels were built for: a cpu wheel
never claims CUDA. On a CPU build, an AMD Zen processor with AVX-512 and an
importable zentorch gets ZenCpuPlatform.
"""
from __future__ import annotations

import importlib.util
import logging
from functools import lru_cache
from pathlib import Path

import torch

from engine import envs
from engine.build_info import build_info

logger = logging.getLogger("engine")

FP16_FALLBACK_WARNING = ("Your device 'cpu' doesn't support torch.float16. Falling back to "
                         "torch.bfloat16 for compatibility.")
ZEN_LOG = "AMD Zen CPU detected with zentorch installed, using ZenCpuPlatform."


class Platform:
    name = "base"
    device_type = "cpu"
    supported_dtypes: tuple[torch.dtype, ...] = (torch.float32, torch.bfloat16)

    def resolve_dtype(self, dtype: torch.dtype) -> torch.dtype:
        if dtype in self.supported_dtypes:
            return dtype
        raise ValueError(f"{self.name} does not support {dtype}; use one of "
                         f"{', '.join(str(d) for d in self.supported_dtypes)}")

    def device(self) -> torch.device:
        return torch.device(self.device_type)


class CpuPlatform(Platform):
    name = "cpu"

    def resolve_dtype(self, dtype):
        if dtype == torch.float16:
            logger.warning(FP16_FALLBACK_WARNING)
            return torch.bfloat16
        return super().resolve_dtype(dtype)


class ZenCpuPlatform(CpuPlatform):
    name = "zen_cpu"


class CudaPlatform(Platform):
    name = "cuda"
    device_type = "cuda"
    supported_dtypes = (torch.float32, torch.bfloat16)


class RocmPlatform(CudaPlatform):
    name = "rocm"  # torch exposes ROCm devices as "cuda"


class XpuPlatform(Platform):
    name = "xpu"
    device_type = "xpu"


def _cpuinfo() -> str:
    try:
        return (Path(envs.sysfs_root()) / "proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return ""


def is_zen_cpu(cpuinfo: str) -> bool:
    return "AuthenticAMD" in cpuinfo and "avx512" in cpuinfo


def choose_platform(device: str, cpuinfo: str, zentorch_importable: bool) -> Platform:
    if device == "cuda":
        return CudaPlatform()
    if device == "rocm":
        return RocmPlatform()
    if device == "xpu":
        return XpuPlatform()
    if device == "cpu" and is_zen_cpu(cpuinfo) and zentorch_importable:
        logger.info(ZEN_LOG)
        return ZenCpuPlatform()
    return CpuPlatform()  # cpu builds, and `empty` installs (reference ops on the CPU)


def _zentorch_importable() -> bool:
    if importlib.util.find_spec("zentorch") is None:
        return False
    try:
        import zentorch  # noqa: F401
    except Exception:
        return False
    return True


@lru_cache(maxsize=1)
def current() -> Platform:
    device = build_info().device
    cpuinfo = _cpuinfo() if device == "cpu" else ""
    zen = device == "cpu" and is_zen_cpu(cpuinfo) and _zentorch_importable()
    return choose_platform(device, cpuinfo, zen)


def __getattr__(name: str):
    if name == "current_platform":
        return current()
    raise AttributeError(name)
