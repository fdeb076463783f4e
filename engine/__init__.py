"""vllm-engine: an LLM inference engine whose compiled kernels ship as per-variant wheels.

`import engine` is cheap (no torch), so the `engine` command starts fast. The
compiled kernels load on first use of `engine.ops`, `engine.BUILD_INFO`,
`engine.LLM` or `engine.SamplingParams`, after checking that the installed
torch is the one they were compiled against (`import engine.ops` does it at once).
"""
from __future__ import annotations

from importlib import metadata as _metadata

try:
    __version__ = _metadata.version("vllm-engine")
except _metadata.PackageNotFoundError:  # a source tree that was never installed
    __version__ = "0+unknown"

__all__ = ["BUILD_INFO", "BuildInfo", "LLM", "SamplingParams", "ops", "__version__"]


def __getattr__(name: str):
    if name == "ops":
        import engine.ops

        return engine.ops
    if name == "BUILD_INFO":
        from engine.ops import BUILD_INFO

        return BUILD_INFO
    if name == "BuildInfo":
        from engine.build_info import BuildInfo

        return BuildInfo
    if name == "LLM":
        from engine.llm import LLM

        return LLM
    if name == "SamplingParams":
        from engine.sampling_params import SamplingParams

        return SamplingParams
    raise AttributeError(f"module 'engine' has no attribute {name!r}")
