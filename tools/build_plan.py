"""What a build makes: the variant (named by VLLM_TARGET_DEVICE, an sdist's
own, or detected by tools.target) and whether it compiles, from the settings
tools/build_settings.py reads."""
from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from email.parser import HeaderParser
from functools import lru_cache
from pathlib import Path

from packaging.version import InvalidVersion, Version

from tools import build_settings
from tools.errors import UserError
from tools.requirements import REPO_ROOT
from tools.target import detect
from tools.variants import VARIANTS, Variant, check_device, main_cuda_variant


@dataclass(frozen=True)
class BuildSettings:
    variant: Variant
    precompiled: bool
    max_jobs: int | None
    compiler_launcher: str | None

    @property
    def compiles(self) -> bool:
        return self.variant.compiles and not self.precompiled


def sdist_variant(root: Path, env: Mapping[str, str]) -> Variant | None:
    """The variant an unpacked sdist was made for, from its PKG-INFO Version
    (None in a git checkout). Version and Requires-Dist of an sdist are fixed
    for its variant, so it builds wheels of that variant only."""
    pkg_info = root / "PKG-INFO"
    if not pkg_info.is_file() or (root / ".git").exists():
        return None
    version = HeaderParser().parsestr(pkg_info.read_text(errors="replace"))["Version"] or ""
    try:
        local = Version(version).local or ""
    except InvalidVersion:
        raise UserError(f"{pkg_info}: Version {version!r} is not a PEP 440 version") from None
    labels = [part for part in local.split(".") if part in VARIANTS]
    # A plain X.Y.Z is the main CUDA variant's release (tools/version.py).
    return VARIANTS[labels[-1]] if labels else main_cuda_variant(env)


def target_variant(env: Mapping[str, str], root: Path = REPO_ROOT) -> Variant:
    """cpu/xpu/empty name their variant; a GPU generation (cu129 or cu130,
    rocm700 or rocm721) and an unset device are left to tools.target, which
    consults VLLM_MAIN_CUDA_VERSION, then the build environment's torch, then
    the driver. An sdist builds its own variant, and refuses another."""
    device = build_settings.target_device(env)
    forced = build_settings.precompiled_variant(env)
    made_for = sdist_variant(root, env)
    if made_for is not None and not device and not forced:
        return made_for
    chosen = _chosen(env, device, forced)
    if made_for is not None and chosen.label != made_for.label:
        raise UserError(
            f"this sdist was made for the {made_for.label} variant and builds {made_for.label} "
            f"wheels only (not {chosen.label}): unset VLLM_TARGET_DEVICE or set it to "
            f"{made_for.device}, or make an sdist for {chosen.label} from a git checkout "
            f"(VLLM_TARGET_DEVICE={chosen.device} uv build --sdist)")
    return chosen


def _chosen(env: Mapping[str, str], device: str, forced: str) -> Variant:
    if device and check_device(device) in ("cpu", "xpu", "empty") and not forced:
        return VARIANTS[device]
    return _detected(build_settings.detection_env(env))


@lru_cache(maxsize=8)
def _detected(relevant: tuple[tuple[str, str], ...]) -> Variant:
    """Detection, once per process for the same settings: the metadata
    provider and every hook ask, and probing may import torch."""
    return detect(dict(relevant)).variant


def resolve(env: Mapping[str, str] | None = None) -> BuildSettings:
    env = os.environ if env is None else env
    launcher = next((tool for tool in ("sccache", "ccache") if shutil.which(tool)), None)
    return BuildSettings(target_variant(env), build_settings.use_precompiled(env),
                         build_settings.max_jobs(env), launcher)
