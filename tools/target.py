"""Which device and variant this machine needs: `python -m tools.target`.

Split as uv's uv-torch crate splits it: tools/accelerator.py's `probe`
observes, `choose` here decides (a pure function of what was observed and the
environment). Neither needs torch.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field

from packaging.requirements import Requirement
from packaging.version import Version

from tools import build_settings
from tools.accelerator import Machine, probe, version_in
from tools.errors import UserError
from tools.requirements import REQUIREMENTS_DIR, read_requirements
from tools.variants import (
    DEFAULT_MAIN_CUDA_VERSION,
    VARIANTS,
    Variant,
    check_device,
    cuda_variant_for,
    get_variant,
    is_default_variant,
)
from wheel_index.layout import DEFAULT_WHEEL_INDEX

# Driver thresholds, as uv's --torch-backend auto: newest variant first.
CUDA_DRIVER_MINIMUM = (("cu130", Version("580")), ("cu129", Version("525.60.13")))

ROCM_VARIANTS = (("7.0", "rocm700"), ("7.2", "rocm721"))


@dataclass
class Target:
    device: str
    variant: Variant
    detected: str | None
    reasons: list[str] = field(default_factory=list)

    def torch_requirement(self) -> str:
        return torch_requirement(self.variant)

    def as_dict(self) -> dict:
        return {
            "device": self.device,
            "variant": self.variant.label,
            "detected": self.detected,
            "torch_backend": self.variant.torch_backend,
            "torch_index_url": self.variant.torch_index_url(),
            "torch_requirement": self.torch_requirement(),
            "build_requirements": f"requirements/build/{self.variant.label}.txt",
            "runtime_requirements": f"requirements/{self.variant.label}.txt",
            "reasons": list(self.reasons),
        }


def torch_requirement(variant: Variant) -> str:
    """The torch pin of a variant that applies to this machine's platform
    ("torch" when use_existing_torch.py has removed the pins)."""
    if not variant.compiles:
        return "torch"
    for line in read_requirements(REQUIREMENTS_DIR / "torch" / f"{variant.label}.txt"):
        req = Requirement(line)
        if req.marker is None or req.marker.evaluate():  # against this interpreter's platform
            return f"{req.name}{req.specifier}"
    return "torch"


def _cuda_variant(m: Machine, env: Mapping[str, str], reasons: list[str]) -> Variant:
    if asked := build_settings.main_cuda_version(env):
        v = cuda_variant_for(asked)
        reasons.append(f"VLLM_MAIN_CUDA_VERSION={asked} selects {v.label}")
    elif m.torch_cuda:
        v = cuda_variant_for(m.torch_cuda, source="torch.version.cuda")
        reasons.append(f"installed torch is built for CUDA {m.torch_cuda}: {v.label}")
    elif m.nvidia_driver is not None:
        for label, minimum in CUDA_DRIVER_MINIMUM:
            if m.nvidia_driver >= minimum:
                v = VARIANTS[label]
                reasons.append(f"NVIDIA driver {m.nvidia_driver} >= {minimum} supports {label}")
                break
        else:
            raise UserError(
                f"NVIDIA driver {m.nvidia_driver} is too old for every CUDA variant "
                f"(cu129 needs >= {CUDA_DRIVER_MINIMUM[-1][1]}); update the driver, or set "
                "VLLM_TARGET_DEVICE=cpu to build for the CPU"
            )
        return v
    else:
        v = cuda_variant_for(DEFAULT_MAIN_CUDA_VERSION)
        reasons.append(f"no driver version found; using the main CUDA version "
                       f"{DEFAULT_MAIN_CUDA_VERSION} ({v.label})")
        return v
    if m.nvidia_driver is not None:
        need = dict(CUDA_DRIVER_MINIMUM)[v.label]
        if m.nvidia_driver < need:
            reasons.append(f"warning: {v.label} needs NVIDIA driver >= {need}, "
                           f"this machine has {m.nvidia_driver}")
    return v


def _rocm_variant(m: Machine, reasons: list[str]) -> Variant:
    version = version_in(m.torch_hip) if m.torch_hip else m.rocm
    source = "torch.version.hip" if m.torch_hip else "the ROCm installation"
    if version is None:
        raise UserError("the rocm device needs ROCm, but no ROCm version was found "
                        "(/opt/rocm/.info/version, $ROCM_PATH/.info/version, torch.version.hip); "
                        "install ROCm (it provides the hipcc compiler), or set "
                        "VLLM_PRECOMPILED_WHEEL_VARIANT=rocm700 to use a precompiled wheel")
    key = f"{version.major}.{version.minor}"
    for prefix, label in ROCM_VARIANTS:
        if key == prefix:
            reasons.append(f"ROCm {version} from {source}: {label}")
            return VARIANTS[label]
    raise UserError(f"ROCm {version} ({source}) has no wheel variant; supported ROCm versions: "
                    f"{', '.join(p for p, _ in ROCM_VARIANTS)}")


def choose(m: Machine, env: Mapping[str, str]) -> Target:
    reasons: list[str] = []
    forced_variant = build_settings.precompiled_variant(env)
    forced_device = build_settings.target_device(env)
    if forced_device:
        check_device(forced_device)
    if forced_variant:
        v = get_variant(forced_variant)
        if forced_device and forced_device != v.device:
            raise UserError(
                f"VLLM_PRECOMPILED_WHEEL_VARIANT={forced_variant} is a {v.device} variant but "
                f"VLLM_TARGET_DEVICE={forced_device}; make them agree or unset one"
            )
        reasons.append(f"VLLM_PRECOMPILED_WHEEL_VARIANT={forced_variant}")
        return Target(v.device, v, _detected(m, v.device), reasons)

    if forced_device:
        device = forced_device
        reasons.append(f"VLLM_TARGET_DEVICE={forced_device}")
    elif m.os == "Linux":
        if m.rocm is not None or m.torch_hip or m.amd_gpu:
            device = "rocm"
            reasons.append("ROCm is present (checked first)")
            if m.nvidia_gpu:
                reasons.append("an NVIDIA GPU is present too; ROCm takes precedence "
                               "(set VLLM_TARGET_DEVICE=cuda to build for it)")
        elif m.intel_gpu:
            device = "xpu"
            reasons.append("Intel GPU found")
        elif m.nvidia_gpu or m.torch_cuda:
            device = "cuda"
            reasons.append("NVIDIA GPU or CUDA torch found")
        else:
            device = "cpu"
            reasons.append("no GPU found")
    elif m.os == "Darwin":
        device = "cpu"
        reasons.append("warning: macOS: building for the CPU; vllm-engine's kernels are "
                       "tested on Linux only")
    else:
        device = "empty"
        reasons.append(f"{m.os}: no kernels are built (empty); use Linux for compiled kernels")

    if device == "cuda":
        v = _cuda_variant(m, env, reasons)
    elif device == "rocm":
        v = _rocm_variant(m, reasons)
    else:
        v = VARIANTS[device]
    return Target(device, v, _detected(m, device), reasons)


def _detected(m: Machine, device: str) -> str | None:
    if device == "cuda":
        parts = []
        if m.torch_cuda:
            parts.append(f"torch CUDA {m.torch_cuda}")
        if m.nvidia_driver:
            parts.append(f"NVIDIA driver {m.nvidia_driver}")
        return ", ".join(parts) or None
    if device == "rocm":
        return f"ROCm {m.torch_hip or m.rocm}" if (m.torch_hip or m.rocm) else None
    return None


def detect(env: Mapping[str, str] | None = None, root: str | None = None) -> Target:
    env = os.environ if env is None else env
    root = root or build_settings.detect_root(env) or "/"
    machine = probe(root, env=env)
    target = choose(machine, env)
    target.reasons[:0] = list(machine.notes)
    return target


# ---- command line -------------------------------------------------------------


def install_commands(t: Target, index: str) -> list[str]:
    v = t.variant
    backend = f" --torch-backend {v.torch_backend}" if v.torch_backend else ""
    torch_url = v.torch_index_url()
    default_cuda = v.compiles and v.device == "cuda" and is_default_variant(v.label)
    folder = "" if default_cuda else f"/{v.label}"
    device = f"VLLM_TARGET_DEVICE={t.device} "
    return [
        "# from the wheel index (uv):",
        f"uv pip install vllm-engine --extra-index-url {index}/nightly{folder} "
        f"--index-strategy first-index{backend}",
        "# from the wheel index (pip; pip prefers the highest version of all indexes):",
        f"pip install --pre vllm-engine --extra-index-url {index}/nightly{folder}"
        + (f" --extra-index-url {torch_url}" if torch_url else ""),
        "# from source:",
        f"{device}uv pip install -e .{backend}",
        f"uv pip install -r requirements/build/{v.label}.txt{backend}"
        " --index-strategy unsafe-best-match"
        f" && {device}uv pip install --no-build-isolation -e .",
    ]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.target", description=__doc__.splitlines()[0])
    p.add_argument("--root", help="read /proc, /sys, /opt/rocm, /etc under DIR (default: "
                   "$VLLM_DETECT_ROOT or /)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--commands", action="store_true", help="print install commands")
    args = p.parse_args(argv)
    try:
        t = detect(root=args.root)
        info = t.as_dict()
    except UserError as exc:
        if build_settings.debug():
            raise
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(info, indent=2))
    elif args.commands:
        # VLLM_WHEEL_INDEX names a team's index; else the folder ci/ publishes into.
        index = build_settings.wheel_index() or DEFAULT_WHEEL_INDEX.as_uri()
        print("\n".join(install_commands(t, index)))
    else:
        print(f"device:            {info['device']}")
        print(f"variant:           {info['variant']}")
        print(f"detected:          {info['detected'] or '-'}")
        print(f"torch backend:     {info['torch_backend'] or '-'}")
        print(f"torch index:       {info['torch_index_url'] or '-'}")
        print(f"torch requirement: {info['torch_requirement']} (build and run)")
        print("reasons:")
        for r in info["reasons"]:
            print(f"  - {r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
