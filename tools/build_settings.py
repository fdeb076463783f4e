"""What a build is asked to do, read from the environment in one place.

Build-time variables (VLLM_TARGET_DEVICE, VLLM_USE_PRECOMPILED, MAX_JOBS...)
are parsed here and nowhere else in tools/ (the other modules call the
accessors below); run-time ones live in engine/envs.py. Each is documented in
docs/environment-variables.md. What a build then makes (its variant, whether it
compiles) is tools/build_plan.py's: this module imports no other of tools/ but
its errors and paths, so every module may read its variables here.
"""
from __future__ import annotations

import os
from collections.abc import Mapping

from tools.errors import UserError

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


def use_precompiled(env: Mapping[str, str] | None = None) -> bool:
    """VLLM_USE_PRECOMPILED, or a wheel location given: the kernels come prebuilt."""
    env = _env(env)
    return env_flag(env, "VLLM_USE_PRECOMPILED") or bool(precompiled_location(env))


def max_jobs(env: Mapping[str, str] | None = None) -> int | None:
    """MAX_JOBS: parallel compile jobs (None: the build tool's default)."""
    raw = _env(env).get("MAX_JOBS", "").strip()
    if not raw:
        return None
    try:
        jobs = int(raw)
        if jobs < 1:
            raise ValueError
    except ValueError:
        raise UserError(f"MAX_JOBS={raw!r} must be a positive integer") from None
    return jobs


def detection_env(env: Mapping[str, str] | None = None) -> tuple[tuple[str, str], ...]:
    """The variables device detection (tools.target) reads, sorted: its cache key."""
    return tuple(sorted((k, v) for k, v in _env(env).items()
                        if k.startswith(("VLLM_", "ROCM_PATH", "CUDA"))))


def allow_csrc_changes(env: Mapping[str, str] | None = None) -> bool:
    """VLLM_PRECOMPILED_ALLOW_CSRC_CHANGES: only a true value allows (anything
    else, an unparsable value too, is the safe "no")."""
    return _env(env).get("VLLM_PRECOMPILED_ALLOW_CSRC_CHANGES", "").strip().lower() in TRUE


