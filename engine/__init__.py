"""vllm-engine: an LLM inference engine whose compiled kernels ship as per-variant wheels.

Importing the package loads the compiled kernels (after checking that the
installed torch is the one they were compiled against). The model runner
(LLM, SamplingParams) is imported on first use.
"""
from __future__ import annotations

from importlib import metadata as _metadata

from engine import ops
from engine.build_info import BuildInfo
from engine.ops import BUILD_INFO

try:
    __version__ = _metadata.version("vllm-engine")
except _metadata.PackageNotFoundError:  # a source tree that was never installed
    __version__ = "0+unknown"

__all__ = ["BUILD_INFO", "BuildInfo", "LLM", "SamplingParams", "ops", "__version__"]


def __getattr__(name: str):
    if name == "LLM":
        from engine.llm import LLM

        return LLM
    if name == "SamplingParams":
        from engine.sampling_params import SamplingParams

        return SamplingParams
    raise AttributeError(f"module 'engine' has no attribute {name!r}")
