"""What accelerators this machine has: `probe` observes, tools/target.py decides.

As uv's uv-torch crate splits detection from choice: every file read goes
through one root directory, so tests describe machines as small fake trees;
helper programs run with a short timeout. Nothing here needs torch: when the
root is the real one, torch.version.cuda / .hip are read from torch's files.
"""
from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from packaging.version import InvalidVersion, Version

HELPER_TIMEOUT_S = 5.0


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


def _read(root: Path, rel: str) -> str | None:
    try:
        return (root / rel.lstrip("/")).read_text(errors="replace")
    except OSError:
        return None


def version_in(text: str | None) -> Version | None:
    """The first dotted version number in text (a driver banner, a version file)."""
    if not text:
        return None
    m = re.search(r"\d+(?:\.\d+)+", text)
    try:
        return Version(m.group(0)) if m else None
    except InvalidVersion:
        return None


def _run_helper(which: Callable[[str], str | None], argv: list[str],
                notes: list[str]) -> str | None:
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
    found: list[tuple[str, str]] = []
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
            if isinstance(node, ast.Assign) and len(node.targets) == 1:
                target = node.targets[0]
            elif isinstance(node, ast.AnnAssign):
                target = node.target
            else:
                continue
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
                driver = version_in(m.group(1)) if m else None
            else:
                driver = version_in(text)
            if driver:
                src = "/" + rel
                break
            notes.append(f"/{rel} exists but holds no driver version")
    if driver is None:
        out = _run_helper(which, ["nvidia-smi", "--query-gpu=driver_version",
                                  "--format=csv,noheader"], notes)
        driver = version_in(out.splitlines()[0] if out and out.strip() else None)
        src = "nvidia-smi" if driver else None
    if driver:
        notes.append(f"NVIDIA driver {driver} (from {src})")
    nvidia = driver is not None or any(v == "0x10de" for v, _ in displays) or (
        root / "proc/driver/nvidia").exists()

    rocm_home = Path(env["ROCM_PATH"]) if env.get("ROCM_PATH") else Path("opt/rocm")
    rocm_rel = str(rocm_home).lstrip("/")
    rocm = version_in(_read(root, f"{rocm_rel}/.info/version"))
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
