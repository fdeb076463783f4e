"""Which device and variant this machine needs: `python -m tools.target`.

Split as uv's uv-torch crate splits it: `probe` observes (every file read goes
through one root directory, so tests describe machines as small fake trees;
helper programs run with a short timeout), `choose` decides (a pure function of
what was observed and the environment). Neither needs torch; `probe` consults
torch.version.cuda / .hip when torch is importable and the root is the real one.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.version import InvalidVersion, Version

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

HELPER_TIMEOUT_S = 5.0

# Driver thresholds, as uv's --torch-backend auto: newest variant first.
CUDA_DRIVER_MINIMUM = (("cu130", Version("580")), ("cu129", Version("525.60.13")))

ROCM_VARIANTS = (("7.0", "rocm700"), ("7.2", "rocm721"))


@dataclass(frozen=True)
class Machine:
    """What was observed; nothing decided yet."""

    os: str  # platform.system(): Linux, Darwin, Windows...
    nvidia_gpu: bool = False
    nvidia_driver: Version | None = None
    torch_cuda: str | None = None
    torch_hip: str | None = None
    rocm: Version | None = None
    rocm_agents: tuple[str, ...] = ()
    amd_gpu: bool = False
    intel_gpu: bool = False
    notes: tuple[str, ...] = ()  # how each fact was found, or why a source failed


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
    env = default_environment()
    for line in read_requirements(REQUIREMENTS_DIR / "torch" / f"{variant.label}.txt"):
        req = Requirement(line)
        if req.marker is None or req.marker.evaluate(env):
            return f"{req.name}{req.specifier}"
    return "torch"


# ---- probe ------------------------------------------------------------------


def _read(root: Path, rel: str) -> str | None:
    try:
        return (root / rel.lstrip("/")).read_text(errors="replace")
    except OSError:
        return None


def _version(text: str | None) -> Version | None:
    if not text:
        return None
    m = re.search(r"\d+(?:\.\d+)+", text)
    try:
        return Version(m.group(0)) if m else None
    except InvalidVersion:
        return None


def _run_helper(which: Callable[[str], str | None], argv: list[str], notes: list[str]) -> str | None:
    exe = which(argv[0])
    if exe is None:
        return None
    try:
        out = subprocess.run([exe, *argv[1:]], capture_output=True, text=True,
                             timeout=HELPER_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        notes.append(f"{argv[0]} did not answer within {HELPER_TIMEOUT_S:g} s; ignored")
        return None
    except OSError as exc:
        notes.append(f"{argv[0]} could not run ({exc}); ignored")
        return None
    if out.returncode != 0:
        err = (out.stderr or out.stdout).strip().splitlines()
        notes.append(f"{argv[0]} failed with exit code {out.returncode}"
                     + (f": {err[0]}" if err else "") + "; ignored")
        return None
    return out.stdout


def _pci_displays(root: Path) -> list[tuple[str, str]]:
    """(vendor, class) of every PCI display controller (class 0x03xxxx)."""
    found = []
    devices = root / "sys/bus/pci/devices"
    try:
        entries = sorted(devices.iterdir())
    except OSError:
        return found
    for dev in entries:
        cls = _read(dev, "class")
        vendor = _read(dev, "vendor")
        if cls and vendor and cls.strip().lower().startswith("0x03"):
            found.append((vendor.strip().lower(), cls.strip().lower()))
    return found


def _torch_versions() -> tuple[str | None, str | None, str | None]:
    """torch.version.cuda and .hip, read from torch/version.py without importing
    torch (seconds): detection must answer at once."""
    import ast
    import importlib.util

    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return None, None, None
    path = Path(list(spec.submodule_search_locations)[0]) / "version.py"
    found: dict[str, str | None] = {}
    try:
        for node in ast.parse(path.read_text()).body:
            target = (node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1
                      else node.target if isinstance(node, ast.AnnAssign) else None)
            if isinstance(target, ast.Name) and target.id in ("cuda", "hip") and node.value:
                found[target.id] = ast.literal_eval(node.value)
    except (OSError, SyntaxError, ValueError) as exc:  # a broken install is a fact, not a crash
        return None, None, f"torch is installed but {path} cannot be read ({exc}); ignored"
    return found.get("cuda"), found.get("hip"), None


def probe(root: Path | str = "/", which: Callable[[str], str | None] = shutil.which,
          env: Mapping[str, str] | None = None, use_torch: bool | None = None,
          os_name: str | None = None) -> Machine:
    env = os.environ if env is None else env
    root = Path(root)
    notes: list[str] = []
    real_root = root.resolve() == Path("/")

    displays = _pci_displays(root)
    driver, src = None, None
    for rel in ("sys/module/nvidia/version", "proc/driver/nvidia/version"):
        text = _read(root, rel)
        if text is not None:
            if rel.startswith("proc"):
                m = re.search(r"Kernel Module(?:\s+for\s+\S+)?\s+(\d+(?:\.\d+)+)", text)
                driver = _version(m.group(1)) if m else None
            else:
                driver = _version(text)
            if driver:
                src = "/" + rel
                break
            notes.append(f"/{rel} exists but holds no driver version")
    if driver is None:
        out = _run_helper(which, ["nvidia-smi", "--query-gpu=driver_version",
                                  "--format=csv,noheader"], notes)
        driver = _version(out.splitlines()[0] if out and out.strip() else None)
        src = "nvidia-smi" if driver else None
    if driver:
        notes.append(f"NVIDIA driver {driver} (from {src})")
    nvidia = driver is not None or any(v == "0x10de" for v, _ in displays) or (
        root / "proc/driver/nvidia").exists()

    rocm_home = Path(env["ROCM_PATH"]) if env.get("ROCM_PATH") else Path("opt/rocm")
    rocm_rel = str(rocm_home).lstrip("/")
    rocm = _version(_read(root, f"{rocm_rel}/.info/version"))
    if rocm:
        notes.append(f"ROCm {rocm} (from /{rocm_rel}/.info/version)")
    agents_out = _run_helper(which, ["rocm_agent_enumerator"], notes)
    agents = tuple(a for a in (agents_out or "").split() if a.startswith("gfx") and a != "gfx000")
    if agents:
        notes.append(f"AMD GPU agents: {', '.join(agents)} (from rocm_agent_enumerator)")
    amd = bool(agents) or (root / "sys/class/kfd").exists()
    if (root / "sys/class/kfd").exists():
        notes.append("/sys/class/kfd exists (AMD GPU kernel driver)")

    intel = any(v == "0x8086" for v, _ in displays)
    if intel:
        notes.append("Intel display device on the PCI bus (vendor 0x8086, class 0x03)")

    torch_cuda = torch_hip = None
    if use_torch if use_torch is not None else real_root:
        torch_cuda, torch_hip, problem = _torch_versions()
        if problem:
            notes.append(problem)
    os_release = _read(root, "etc/os-release") or ""
    m = re.search(r'^PRETTY_NAME="?([^"\n]*)"?', os_release, re.M)
    if m:
        notes.append(f"OS: {m.group(1)}")
    return Machine(
        os=os_name or platform.system(), nvidia_gpu=nvidia, nvidia_driver=driver,
        torch_cuda=torch_cuda, torch_hip=torch_hip, rocm=rocm, rocm_agents=agents,
        amd_gpu=amd, intel_gpu=intel, notes=tuple(notes),
    )


# ---- choose -----------------------------------------------------------------


def _cuda_variant(m: Machine, env: Mapping[str, str], reasons: list[str]) -> Variant:
    if env.get("VLLM_MAIN_CUDA_VERSION"):
        v = cuda_variant_for(env["VLLM_MAIN_CUDA_VERSION"])
        reasons.append(f"VLLM_MAIN_CUDA_VERSION={env['VLLM_MAIN_CUDA_VERSION']} selects {v.label}")
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
    version = _version(m.torch_hip) if m.torch_hip else m.rocm
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
    forced_variant = env.get("VLLM_PRECOMPILED_WHEEL_VARIANT", "").strip()
    forced_device = env.get("VLLM_TARGET_DEVICE", "").strip()
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
    root = root or env.get("VLLM_DETECT_ROOT") or "/"
    machine = probe(root, env=env)
    target = choose(machine, env)
    target.reasons[:0] = list(machine.notes)
    return target


# ---- command line -------------------------------------------------------------


def install_commands(t: Target, index: str) -> list[str]:
    v = t.variant
    backend = f" --torch-backend {v.torch_backend}" if v.torch_backend else ""
    torch_url = v.torch_index_url()
    folder = "" if v.compiles and v.device == "cuda" and is_default_variant(v.label) else f"/{v.label}"
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
        f"uv pip install -r requirements/build/{v.label}.txt{backend} --index-strategy unsafe-best-match"
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
        if os.environ.get("VLLM_DEBUG"):
            raise
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(info, indent=2))
    elif args.commands:
        from tools.precompiled.select import DEFAULT_WHEEL_INDEX

        # VLLM_WHEEL_INDEX names a team's index; else the folder ci/ publishes into.
        index = os.environ.get("VLLM_WHEEL_INDEX") or DEFAULT_WHEEL_INDEX.as_uri()
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
