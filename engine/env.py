"""`python -m engine.env`: what this installation is and runs on (like upstream's collect_env).

The first lines come from the build-info record alone; torch is imported only
for the lines that need it, so the command answers at once.
"""
from __future__ import annotations

import json
import os
import platform
import sys

WIDTH = len("compiled_against_torch")  # the longest key; the lines print before all are known


def _platform() -> str:
    """platform.platform()'s answer without its `uname -p` subprocess."""
    u = os.uname()
    try:
        libc = "-with-" + os.confstr("CS_GNU_LIBC_VERSION").replace(" ", "")
    except (ValueError, OSError, AttributeError):  # not glibc, or not a POSIX system
        libc = ""
    return f"{u.sysname}-{u.release}-{u.machine}{libc}"


def static_report() -> dict:
    """What the installation is, from its build-info record (no torch import)."""
    import engine
    from engine.build_info import build_info

    info = build_info()
    precompiled = None
    if info.extension is not None:
        record = info.extension.with_name("_precompiled.json")
        if record.is_file():
            precompiled = json.loads(record.read_text())
    return {
        "vllm_engine": engine.__version__,
        "variant": info.variant,
        "git_commit": info.git_commit,
        "compiled_against_torch": info.torch_version,
        "code_paths": list(info.code_paths),
        "extension": str(info.extension) if info.extension else None,
        "precompiled_from": precompiled,
        "python": sys.version.split()[0],
        "platform": _platform(),
        "processor": platform.machine(),
    }


def runtime_report() -> dict:
    """What it runs on: loads torch and the kernels."""
    import torch

    import engine
    from engine import preload
    from engine.platforms import current as current_platform

    return {
        "cpu_isa_in_use": engine.ops.cpu_isa(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "torch_hip": getattr(torch.version, "hip", None),
        "platform_class": type(current_platform()).__name__,
        "ld_preload_hint": preload.export_line(preload.find(), preload.is_source_build()),
    }


def report() -> dict:
    return {**static_report(), **runtime_report()}


def main(argv: list[str] | None = None) -> int:
    if argv and "--json" in argv:
        print(json.dumps(report(), indent=2))
        return 0
    for key, value in static_report().items():
        print(f"{key:<{WIDTH}}  {value}", flush=True)
    runtime = runtime_report()
    for key, value in runtime.items():
        print(f"{key:<{WIDTH}}  {value}")
    if runtime["ld_preload_hint"]:
        print(f"\nfor the best CPU performance:\n  {runtime['ld_preload_hint']}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
