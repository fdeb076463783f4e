"""The variant table: the one home of every fact about a wheel variant.

Imported by the build backend, target detection, the wheel index and
precompiled mode. A variant is what a wheel is built for: a device plus, for
GPUs, the toolkit generation; it names the wheel's local version segment, the
index folder, and the torch index the wheel's torch comes from.
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from tools import build_settings
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
    #: Why no wheel of this variant is built, while its kernels are not written
    #: (None: they exist and CI builds it). Detection, layout and the index
    #: still know the variant.
    unbuilt: str | None = None

    @property
    def compiles(self) -> bool:
        return self.device != "empty"

    @property
    def kernels(self) -> bool:
        """Whether this variant has compiled kernels that CI builds."""
        return self.compiles and self.unbuilt is None

    def torch_index_url(self, base: str | None = None) -> str | None:
        if self.torch_index is None:
            return None
        return f"{(base or torch_index_base()).rstrip('/')}/{self.torch_index}"

    @property
    def torch_backend(self) -> str | None:
        """The name uv's --torch-backend takes for this variant."""
        return self.torch_index.replace(".", "") if self.torch_index else None


_NO_HIP = "no HIP kernels yet (csrc/ has cpu/ and cuda/ only)"

VARIANTS: dict[str, Variant] = {
    v.label: v
    for v in (
        Variant("cu129", "cuda", "cu129", "12.9"),
        Variant("cu130", "cuda", "cu130", "13.0"),
        Variant("rocm700", "rocm", "rocm7.0", "7.0", unbuilt=_NO_HIP),
        Variant("rocm721", "rocm", "rocm7.2", "7.2.1", unbuilt=_NO_HIP),
        Variant("xpu", "xpu", "xpu", unbuilt="no SYCL kernels yet (csrc/ has cpu/ and cuda/ only)"),
        Variant("cpu", "cpu", "cpu"),
        Variant("empty", "empty", None),
    )
}


def torch_index_base(env: os._Environ[str] | dict[str, str] | None = None) -> str:
    return build_settings.torch_index_base(env) or DEFAULT_TORCH_INDEX_BASE


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
            f"{source}={version!r} is not a supported CUDA version; "
            "use 12.x (cu129) or 13.x (cu130)"
        )
    return VARIANTS[label]


def main_cuda_variant(env: Mapping[str, str] | None = None) -> Variant:
    return cuda_variant_for(build_settings.main_cuda_version(env) or DEFAULT_MAIN_CUDA_VERSION)


def is_default_variant(label: str, env: Mapping[str, str] | None = None) -> bool:
    """The main CUDA variant is served without a variant folder and may drop its suffix."""
    return label == main_cuda_variant(env).label


# -- CI builders --------------------------------------------------------------
# Each Linux wheel is built inside a manylinux_2_28 image, so auditwheel (which
# these images point at manylinux_2_28 through AUDITWHEEL_PLAT) can only tag
# what the symbols allow: glibc 2.28, installable on RHEL 8+ and Ubuntu 20.04+.
# Images are pinned by digest; bump one deliberately (docker buildx imagetools
# inspect <image>:<tag>) and let CI rebuild.

@dataclass(frozen=True)
class Builder:
    variant: str
    arch: str  # platform.machine() of the runner: x86_64, aarch64
    runner: str  # GitHub-hosted runner label
    image: str | None  # manylinux_2_28 builder, by digest; None: none recorded yet
    python: str = "/opt/python/cp312-cp312/bin"  # the image's CPython, put on PATH

    @property
    def unbuilt(self) -> str | None:
        v = VARIANTS[self.variant]
        if not v.kernels:
            return v.unbuilt or "compiles nothing"
        if self.image is None:
            return ("no manylinux_2_28 builder image pinned by digest is recorded; add it "
                    "to BUILDERS in tools/variants.py")
        return None


_PYPA = "quay.io/pypa/manylinux_2_28"
BUILDERS: tuple[Builder, ...] = (
    Builder("cpu", "x86_64", "ubuntu-24.04", f"{_PYPA}_x86_64@sha256:"
            "39df0042d5cc900b085aa25a0659368b42a0006c54c474299b785b44c1b4ff82"),
    Builder("cpu", "aarch64", "ubuntu-24.04-arm", f"{_PYPA}_aarch64@sha256:"
            "f5f03dedf61b47d69d0742d36047db78adeee3bdb7a9910ff52304750ecf2514"),
    # PyTorch's own manylinux_2_28 CUDA builders (the images torch's wheels come from).
    Builder("cu129", "x86_64", "ubuntu-24.04", None),  # pytorch/manylinux2_28-builder:cuda12.9
    Builder("cu130", "x86_64", "ubuntu-24.04", "pytorch/manylinux2_28-builder:cuda13.0@sha256:"
            "7710cbc19d7ee951134e2e827f8ec89237c993095eb2581dd5e74f58e4e278c7"),
    Builder("rocm700", "x86_64", "ubuntu-24.04", None),
    Builder("rocm721", "x86_64", "ubuntu-24.04", None),
    Builder("xpu", "x86_64", "ubuntu-24.04", None),
)


def ci_matrix() -> dict:
    """The wheel jobs CI runs ({"include": [...]}) and the rows it leaves out, with why."""
    built, unbuilt = [], []
    for b in BUILDERS:
        row = {"variant": b.variant, "arch": b.arch}
        if b.unbuilt:
            unbuilt.append({**row, "reason": b.unbuilt})
        else:
            built.append({**row, "runner": b.runner, "image": b.image, "python": b.python})
    return {"include": built, "unbuilt": unbuilt}


def _main(argv: list[str] | None = None) -> int:
    import argparse
    import json

    ap = argparse.ArgumentParser(prog="python -m tools.variants",
                                 description="The variant table, for scripts and CI.")
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--matrix", action="store_true",
                   help="CI's wheel matrix as one line of JSON ({include: [...], unbuilt: [...]})")
    g.add_argument("--built", action="store_true",
                   help="the variants that have kernels and are built, one a line")
    args = ap.parse_args(argv)
    if args.matrix:
        print(json.dumps(ci_matrix(), separators=(",", ":")))
    elif args.built:
        print("\n".join(v.label for v in VARIANTS.values() if v.kernels))
    else:
        for v in VARIANTS.values():
            state = "built" if v.kernels else (v.unbuilt or "pure Python, no kernels")
            print(f"{v.label:8} {v.device:6} {state}")
    return 0


if __name__ == "__main__":
    raise SystemExit(_main())
