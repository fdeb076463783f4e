"""The variant table: the one home of every fact about a wheel variant.

Imported by the build backend, target detection, the wheel index and
precompiled mode. A variant is what a wheel is built for: a device plus, for
GPUs, the toolkit generation; it names the wheel's local version segment, the
index folder, and the torch index the wheel's torch comes from.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from tools.errors import UserError

#: Upstream PyTorch's wheel index; VLLM_TORCH_INDEX_BASE overrides it (mirrors,
#: air-gapped machines, tests).
DEFAULT_TORCH_INDEX_BASE = "https://download.pytorch.org/whl"

DEVICES = ("cuda", "rocm", "xpu", "cpu", "empty")

#: The CUDA version whose variant is the default one (no suffix in the index
#: layout, plain version on a release); VLLM_MAIN_CUDA_VERSION overrides.
DEFAULT_MAIN_CUDA_VERSION = "13.0"


@dataclass(frozen=True)
class Variant:
    label: str  # local version segment and index folder: cpu, cu130, rocm700...
    device: str  # VLLM_TARGET_DEVICE value that builds it
    torch_index: str | None  # folder under the torch index base (PyTorch's spelling)
    toolkit: str | None = None  # CUDA or ROCm version the variant is for

    @property
    def compiles(self) -> bool:
        return self.device != "empty"

    def torch_index_url(self, base: str | None = None) -> str | None:
        if self.torch_index is None:
            return None
        return f"{(base or torch_index_base()).rstrip('/')}/{self.torch_index}"

    @property
    def torch_backend(self) -> str | None:
        """The name uv's --torch-backend takes for this variant."""
        return self.torch_index.replace(".", "") if self.torch_index else None


VARIANTS: dict[str, Variant] = {
    v.label: v
    for v in (
        Variant("cu129", "cuda", "cu129", "12.9"),
        Variant("cu130", "cuda", "cu130", "13.0"),
        Variant("rocm700", "rocm", "rocm7.0", "7.0"),
        Variant("rocm721", "rocm", "rocm7.2", "7.2.1"),
        Variant("xpu", "xpu", "xpu"),
        Variant("cpu", "cpu", "cpu"),
        Variant("empty", "empty", None),
    )
}


def torch_index_base(env: os._Environ[str] | dict[str, str] | None = None) -> str:
    env = os.environ if env is None else env
    return env.get("VLLM_TORCH_INDEX_BASE") or DEFAULT_TORCH_INDEX_BASE


def get_variant(label: str) -> Variant:
    try:
        return VARIANTS[label]
    except KeyError:
        raise UserError(
            f"unknown wheel variant {label!r}; valid variants: {', '.join(VARIANTS)}"
        ) from None


def check_device(device: str, source: str = "VLLM_TARGET_DEVICE") -> str:
    if device not in DEVICES:
        raise UserError(
            f"{source}={device!r} is not a known target device; valid values: {', '.join(DEVICES)}"
        )
    return device


def cuda_variant_for(version: str, source: str = "VLLM_MAIN_CUDA_VERSION") -> Variant:
    """Map a CUDA version (12.x, 13.x) to its variant: 12.x -> cu129, 13.x -> cu130."""
    major = version.strip().split(".")[0]
    label = {"12": "cu129", "13": "cu130"}.get(major)
    if label is None:
        raise UserError(
            f"{source}={version!r} is not a supported CUDA version; use 12.x (cu129) or 13.x (cu130)"
        )
    return VARIANTS[label]


def main_cuda_variant(env: os._Environ[str] | dict[str, str] | None = None) -> Variant:
    env = os.environ if env is None else env
    return cuda_variant_for(env.get("VLLM_MAIN_CUDA_VERSION") or DEFAULT_MAIN_CUDA_VERSION)


def is_default_variant(label: str, env=None) -> bool:
    """The main CUDA variant is served without a variant folder and may drop its suffix."""
    return label == main_cuda_variant(env).label
