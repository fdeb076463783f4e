"""The build-info record written next to the compiled kernels at build time.

Read without loading the extension (and without torch), so that a mismatch
between the torch the kernels were compiled against and the one installed is
reported in words instead of as an undefined-symbol crash.
"""
from __future__ import annotations

import importlib.util
import json
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

RECORD_NAME = "_build_info.json"


@dataclass(frozen=True)
class BuildInfo:
    variant: str
    device: str
    git_commit: str
    torch_version: str | None
    code_paths: tuple[str, ...] = ()
    processor: str | None = None
    torch_requirement: str | None = None
    torch_index_url: str | None = None
    extension: Path | None = None
    extra: dict = field(default_factory=dict, compare=False)

    @property
    def has_kernels(self) -> bool:
        return self.extension is not None


def read_record(path: Path) -> dict:
    return json.loads(path.read_text())


def _refuse_missing_kernels() -> None:
    """An installation whose version names a compiled variant must have its
    kernels: never fall back to the slow reference ops without saying so."""
    from importlib import metadata

    try:
        version = metadata.version("vllm-engine")
    except metadata.PackageNotFoundError:
        return  # a source tree that was never installed
    # Only the `empty` variant ships without kernels, and it always says so in its
    # local label; a plain release is the main CUDA variant (compiled).
    if not version.endswith(("+empty", ".empty")):
        raise ImportError(f"vllm-engine {version} is installed but its compiled kernels "
                          "(engine/_C.abi3.so) are missing; the installation is incomplete. "
                          "Reinstall vllm-engine.")


@lru_cache(maxsize=1)
def build_info() -> BuildInfo:
    """The record of the installed kernels, or an `empty` record when none are installed."""
    spec = importlib.util.find_spec("engine._C")
    if spec is None or spec.origin is None:
        _refuse_missing_kernels()
        return BuildInfo(variant="empty", device="empty", git_commit="unknown", torch_version=None)
    so = Path(spec.origin)
    record = so.with_name(RECORD_NAME)
    if not record.is_file():
        raise ImportError(
            f"vllm-engine: {so} has no {RECORD_NAME} beside it; the installation is incomplete. "
            "Reinstall vllm-engine."
        )
    data = read_record(record)
    known = {k: data.pop(k) for k in list(data) if k in BuildInfo.__dataclass_fields__}
    known["code_paths"] = tuple(known.get("code_paths", ()))
    return BuildInfo(**known, extension=so, extra=data)
