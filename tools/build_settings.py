"""What a build is asked to do, read from the environment in one place.

Build-time variables (VLLM_TARGET_DEVICE, VLLM_USE_PRECOMPILED, MAX_JOBS...)
are parsed here and nowhere else in tools/; run-time ones live in engine/envs.py.
"""
from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from typing import Mapping

from tools.errors import UserError
from tools.variants import VARIANTS, Variant, check_device, main_cuda_variant

TRUE = ("1", "true", "yes", "on")
FALSE = ("", "0", "false", "no", "off")


def env_flag(env: Mapping[str, str], name: str) -> bool:
    value = env.get(name, "").strip().lower()
    if value in TRUE:
        return True
    if value in FALSE:
        return False
    raise UserError(f"{name}={env[name]!r} is not a boolean; use 1/true or 0/false")


@dataclass(frozen=True)
class BuildSettings:
    variant: Variant
    precompiled: bool
    max_jobs: int | None
    compiler_launcher: str | None

    @property
    def compiles(self) -> bool:
        return self.variant.compiles and not self.precompiled


def variant_for_device(device: str, env: Mapping[str, str]) -> Variant:
    if device == "cuda":
        return main_cuda_variant(env)
    if device == "rocm":
        return VARIANTS["rocm700"]
    return VARIANTS[device]


def target_variant(env: Mapping[str, str]) -> Variant:
    device = env.get("VLLM_TARGET_DEVICE", "").strip()
    if device:
        return variant_for_device(check_device(device), env)
    from tools.target import detect  # only when the user left the choice to us

    return detect(env).variant


def resolve(env: Mapping[str, str] | None = None) -> BuildSettings:
    env = os.environ if env is None else env
    precompiled = env_flag(env, "VLLM_USE_PRECOMPILED") or bool(
        env.get("VLLM_PRECOMPILED_WHEEL_LOCATION", "").strip()
    )
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
