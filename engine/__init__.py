"""vllm-engine: an LLM inference engine whose compiled kernels ship as per-variant wheels.

Importing the package checks, without importing torch, that this installation
is complete and that the installed torch is the one the kernels were compiled
against (TorchMismatchError otherwise). The kernels
themselves (`engine.ops`, `engine.BUILD_INFO`) and the model runner (LLM,
SamplingParams) load on first use, so that `engine --help` starts at once.
"""
from __future__ import annotations

from engine import omp_wait_policy as _omp_wait_policy
from engine._kernels import check_installed as _check_installed
from engine.build_info import BuildInfo

_omp_wait_policy.apply()  # before anything loads torch, and with it libgomp
_check_installed()

__all__ = ["BUILD_INFO", "BuildInfo", "LLM", "PoolingParams", "SamplingParams", "ops",
           "__version__"]


def __getattr__(name: str):
    if name == "__version__":  # importlib.metadata costs more than the rest of `import engine`
        from importlib import metadata

        try:
            return metadata.version("vllm-engine")
        except metadata.PackageNotFoundError:  # a source tree that was never installed
            return "0+unknown"
    if name in ("ops", "BUILD_INFO"):
        import engine.ops  # loads the kernels

        return engine.ops if name == "ops" else engine.ops.BUILD_INFO
    if name == "LLM":
        from engine.entrypoints.llm import LLM

        return LLM
    if name == "SamplingParams":
        from engine.sampling_params import SamplingParams

        return SamplingParams
    if name == "PoolingParams":
        from engine.pooling_params import PoolingParams

        return PoolingParams
    raise AttributeError(f"module 'engine' has no attribute {name!r}")
