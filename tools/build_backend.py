"""The in-tree PEP 517 backend: decide the variant, then delegate.

Each hook maps to scikit_build_core.build with config settings derived from
tools.build_plan; hooks may run in separate processes, so nothing is kept
between them. Requirements come from requirements/build/<variant>.txt, so a
build environment receives only what this variant needs.
"""
from __future__ import annotations

import os
import sys
from functools import wraps

from scikit_build_core import build as _skbuild

from tools import fingerprint
from tools.build_plan import BuildSettings, resolve
from tools.build_settings import debug
from tools.errors import UserError
from tools.requirements import REPO_ROOT, build_requirements
from tools.target import torch_requirement
from tools.variants import DEFAULT_TORCH_INDEX_BASE
from tools.version import git_commit

__all__ = [
    "build_editable",
    "build_sdist",
    "build_wheel",
    "get_requires_for_build_editable",
    "get_requires_for_build_sdist",
    "get_requires_for_build_wheel",
    "prepare_metadata_for_build_editable",
    "prepare_metadata_for_build_wheel",
]


def _user_errors_exit(hook):
    """A UserError becomes one clear line on stderr and a failed build, not a traceback."""

    @wraps(hook)
    def run(*args, **kwargs):
        try:
            return hook(*args, **kwargs)
        except UserError as exc:
            if debug():
                raise
            print(f"vllm-engine build: error: {exc}", file=sys.stderr)
            raise SystemExit(1) from None

    return run


def config_settings_for(settings: BuildSettings, given: dict | None) -> dict:
    cs = dict(given or {})
    if settings.precompiled:  # kernels come from a wheel: a platform wheel without CMake
        cs.setdefault("wheel.cmake", "false")
        cs.setdefault("wheel.platlib", "true")
        # The extracted files are git-ignored (they are not sources); pack them anyway.
        cs.setdefault("sdist.include", ["engine/*.so", "engine/_build_info.json",
                                        "engine/_precompiled.json"])
        return cs
    if not settings.compiles:
        cs.setdefault("wheel.cmake", "false")
        cs.setdefault("wheel.py-api", "py3")
        cs.setdefault("wheel.platlib", "false")
        return cs
    v = settings.variant
    cs["cmake.define.VLLM_TARGET_DEVICE"] = v.device
    cs["cmake.define.VLLM_VARIANT"] = v.label
    cs["cmake.define.VLLM_GIT_COMMIT"] = git_commit(REPO_ROOT) or "unknown"
    # Recorded in the build info so that a torch mismatch names its own fix;
    # the upstream index, never a private mirror the builder may have used.
    cs["cmake.define.VLLM_TORCH_REQUIREMENT"] = torch_requirement(v)
    cs["cmake.define.VLLM_TORCH_INDEX_URL"] = v.torch_index_url(DEFAULT_TORCH_INDEX_BASE) or ""
    # What decides the compiled files, so that CI can reuse these kernels for a
    # later commit whose fingerprint agrees (tools/fingerprint.py).
    kernel = fingerprint.of_build(REPO_ROOT, v.label, v.device, os.environ)
    cs["cmake.define.VLLM_KERNEL_FINGERPRINT"] = kernel["kernel_fingerprint"]
    cs["cmake.define.VLLM_KERNEL_SOURCES"] = kernel["kernel_sources"]
    # One build tree per variant: a cpu and a cu130 build never share a cache.
    cs.setdefault("build-dir", f"build/{v.label}")
    if settings.compiler_launcher:
        for lang in ("C", "CXX", "CUDA"):
            cs.setdefault(f"cmake.define.CMAKE_{lang}_COMPILER_LAUNCHER",
                          settings.compiler_launcher)
        # pip and uv build in random temporary folders; hash relative paths.
        os.environ.setdefault("CCACHE_NOHASHDIR", "true")
        os.environ.setdefault("CCACHE_BASEDIR", str(REPO_ROOT))
    if settings.max_jobs:
        os.environ["CMAKE_BUILD_PARALLEL_LEVEL"] = str(settings.max_jobs)
    return cs


def _requires(settings: BuildSettings, skbuild_requires: list[str]) -> list[str]:
    if settings.precompiled:
        out = build_requirements("precompiled")
    else:
        out = build_requirements(settings.variant.label if settings.compiles else "empty")
    # scikit-build-core asks for cmake/ninja only when the system's are too old.
    return out + [r for r in skbuild_requires if r not in out]


@_user_errors_exit
def get_requires_for_build_wheel(config_settings=None):
    s = resolve()
    cs = config_settings_for(s, config_settings)
    return _requires(s, _skbuild.get_requires_for_build_wheel(cs))


@_user_errors_exit
def get_requires_for_build_editable(config_settings=None):
    s = resolve()
    cs = config_settings_for(s, config_settings)
    return _requires(s, _skbuild.get_requires_for_build_editable(cs))


@_user_errors_exit
def get_requires_for_build_sdist(config_settings=None):
    return _skbuild.get_requires_for_build_sdist(config_settings)


@_user_errors_exit
def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    cs = config_settings_for(resolve(), config_settings)
    return _skbuild.prepare_metadata_for_build_wheel(metadata_directory, cs)


@_user_errors_exit
def prepare_metadata_for_build_editable(metadata_directory, config_settings=None):
    cs = config_settings_for(resolve(), config_settings)
    return _skbuild.prepare_metadata_for_build_editable(metadata_directory, cs)


def _settings_for_build() -> BuildSettings:
    """Resolve the build; in precompiled mode, first take the kernels into engine/."""
    s = resolve()
    if s.precompiled:
        from tools.precompiled import install_kernels

        install_kernels(REPO_ROOT, os.environ, log=lambda m: print(m, file=sys.stderr))
    else:
        _remove_precompiled_kernels()
    return s


def _remove_precompiled_kernels() -> None:
    """Kernels an earlier precompiled install put into the source tree would
    shadow (or be packed beside) the ones this build makes."""
    from tools.precompiled.extract import BUILD_INFO, RECORD

    pkg = REPO_ROOT / "engine"
    for leftover in [*pkg.glob("*.so"), pkg / BUILD_INFO, pkg / RECORD]:
        if leftover.exists():
            print(f"vllm-engine build: removing {leftover.relative_to(REPO_ROOT)} left by "
                  "precompiled mode", file=sys.stderr)
            leftover.unlink()


@_user_errors_exit
def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    cs = config_settings_for(_settings_for_build(), config_settings)
    return _skbuild.build_wheel(wheel_directory, cs, metadata_directory)


@_user_errors_exit
def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    cs = config_settings_for(_settings_for_build(), config_settings)
    return _skbuild.build_editable(wheel_directory, cs, metadata_directory)


@_user_errors_exit
def build_sdist(sdist_directory, config_settings=None):
    return _skbuild.build_sdist(sdist_directory, config_settings)
