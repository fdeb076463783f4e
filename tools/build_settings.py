"""What a build is asked to do, read from the environment in one place.

Build-time variables (VLLM_TARGET_DEVICE, VLLM_USE_PRECOMPILED, MAX_JOBS...)
are parsed here and nowhere else in tools/ (the other modules call the
accessors below); run-time ones live in engine/envs.py. Each is documented in
docs/environment-variables.md. tools.variants is imported inside the functions
that need it: it reads its own settings (VLLM_MAIN_CUDA_VERSION,
VLLM_TORCH_INDEX_BASE) through this module.
"""
from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from email.parser import HeaderParser
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

from packaging.version import InvalidVersion, Version

from tools.errors import UserError
from tools.requirements import REPO_ROOT

if TYPE_CHECKING:
    from tools.variants import Variant

TRUE = ("1", "true", "yes", "on")
FALSE = ("", "0", "false", "no", "off")


def env_flag(env: Mapping[str, str], name: str) -> bool:
    value = env.get(name, "").strip().lower()
    if value in TRUE:
        return True
    if value in FALSE:
        return False
    raise UserError(f"{name}={env[name]!r} is not a boolean; use 1/true or 0/false")


def _env(env: Mapping[str, str] | None) -> Mapping[str, str]:
    return os.environ if env is None else env


# ---- each variable, by name (env: os.environ when None) ----------------------

def debug(env: Mapping[str, str] | None = None) -> bool:
    """VLLM_DEBUG set: a tools/ command raises its failure with the traceback."""
    return bool(_env(env).get("VLLM_DEBUG"))


def target_device(env: Mapping[str, str] | None = None) -> str:
    return _env(env).get("VLLM_TARGET_DEVICE", "").strip()


def main_cuda_version(env: Mapping[str, str] | None = None) -> str:
    """VLLM_MAIN_CUDA_VERSION, "" when unset."""
    return _env(env).get("VLLM_MAIN_CUDA_VERSION") or ""


def torch_index_base(env: Mapping[str, str] | None = None) -> str:
    """VLLM_TORCH_INDEX_BASE, "" when unset."""
    return _env(env).get("VLLM_TORCH_INDEX_BASE") or ""


def torch_find_links(env: Mapping[str, str] | None = None) -> str:
    """VLLM_TORCH_FIND_LINKS (a folder of torch wheels), "" when unset."""
    return _env(env).get("VLLM_TORCH_FIND_LINKS") or ""


def detect_root(env: Mapping[str, str] | None = None) -> str:
    """VLLM_DETECT_ROOT (the file system tools.target probes), "" when unset."""
    return _env(env).get("VLLM_DETECT_ROOT") or ""


def wheel_index(env: Mapping[str, str] | None = None) -> str:
    """VLLM_WHEEL_INDEX (a team's wheel index), "" when unset."""
    return _env(env).get("VLLM_WHEEL_INDEX") or ""


def precompiled_variant(env: Mapping[str, str] | None = None) -> str:
    return _env(env).get("VLLM_PRECOMPILED_WHEEL_VARIANT", "").strip()


def precompiled_location(env: Mapping[str, str] | None = None) -> str:
    return _env(env).get("VLLM_PRECOMPILED_WHEEL_LOCATION", "").strip()


def precompiled_wheel_index(env: Mapping[str, str] | None = None) -> str:
    return _env(env).get("VLLM_PRECOMPILED_WHEEL_INDEX", "").strip()


def precompiled_commit(env: Mapping[str, str] | None = None) -> str:
    return _env(env).get("VLLM_PRECOMPILED_WHEEL_COMMIT", "").strip()


def precompiled_base_ref(env: Mapping[str, str] | None = None) -> str:
    return _env(env).get("VLLM_PRECOMPILED_BASE_REF", "").strip()


def precompiled_cache(env: Mapping[str, str] | None = None) -> str:
    """VLLM_PRECOMPILED_CACHE (where fetched wheels are kept), "" when unset."""
    return _env(env).get("VLLM_PRECOMPILED_CACHE") or ""


def allow_csrc_changes(env: Mapping[str, str] | None = None) -> bool:
    """VLLM_PRECOMPILED_ALLOW_CSRC_CHANGES: only a true value allows (anything
    else, an unparsable value too, is the safe "no")."""
    return _env(env).get("VLLM_PRECOMPILED_ALLOW_CSRC_CHANGES", "").strip().lower() in TRUE


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
    from tools.variants import VARIANTS, main_cuda_variant

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
    device = target_device(env)
    forced = precompiled_variant(env)
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
    from tools.variants import VARIANTS, check_device

    if device and check_device(device) in ("cpu", "xpu", "empty") and not forced:
        return VARIANTS[device]
    return _detected(tuple(sorted((k, v) for k, v in env.items() if k.startswith(
        ("VLLM_", "ROCM_PATH", "CUDA")))))


@lru_cache(maxsize=8)
def _detected(relevant: tuple[tuple[str, str], ...]) -> Variant:
    """Detection, once per process for the same settings: the metadata
    provider and every hook ask, and probing may import torch."""
    from tools.target import detect

    return detect(dict(relevant)).variant


def resolve(env: Mapping[str, str] | None = None) -> BuildSettings:
    env = os.environ if env is None else env
    precompiled = env_flag(env, "VLLM_USE_PRECOMPILED") or bool(precompiled_location(env))
    max_jobs = None
    if env.get("MAX_JOBS", "").strip():
        try:
            max_jobs = int(env["MAX_JOBS"])
            if max_jobs < 1:
                raise ValueError
        except ValueError:
            raise UserError(f"MAX_JOBS={env['MAX_JOBS']!r} must be a positive integer") from None
    launcher = next((tool for tool in ("sccache", "ccache") if shutil.which(tool)), None)
    return BuildSettings(target_variant(env), precompiled, max_jobs, launcher)
