"""`python -m engine.collect_env`: what this installation is and runs on (like
upstream's collect_env).

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
        version = os.confstr("CS_GNU_LIBC_VERSION")
    except (ValueError, OSError, AttributeError):  # not glibc, or not a POSIX system
        version = None
    libc = "" if version is None else "-with-" + version.replace(" ", "")
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
    from engine.platforms import cpu_preload
    from engine.platforms import current as current_platform

    return {
        "cpu_isa_in_use": engine.ops.cpu_isa(),
        **_cpu_report(engine.BUILD_INFO),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "torch_hip": getattr(torch.version, "hip", None),
        "platform_class": type(current_platform()).__name__,
        "ld_preload_hint": cpu_preload.export_line(cpu_preload.find(),
                                                   cpu_preload.is_source_build()),
    }


def _cpu_report(info) -> dict:
    """What the CPU runs: usable code paths, how linear layers run per dtype, the KV cache."""
    if info.device != "cpu":
        return {}
    import torch

    from engine import envs
    from engine.model_executor.layers.linear import cpu_large_m_choice, cpu_linear_choice
    from engine.platforms import cpu_features

    features = cpu_features.current()
    out = {
        "cpu_isas_usable": [i for i in features.usable_isas()
                            if i in engine_compiled_isas()] or None,
        "cpu_max_isa": features.capped_at,
    }
    for dtype in (torch.float32, torch.bfloat16):
        choice = cpu_linear_choice(dtype)
        out[f"linear_{str(dtype)[6:]}"] = f"{choice.mode} ({choice.reason})"
        if choice.mode == cpu_features.PANELS:
            out[f"linear_{str(dtype)[6:]}_large_batches"] = cpu_large_m_choice(dtype).reason
    try:
        gib = f"{envs.kvcache_space_bytes() / 2**30:g} GiB"
    except envs.EnvError as exc:
        gib = f"invalid: {exc}"
    out["kv_cache"] = (f"{gib} (VLLM_CPU_KVCACHE_SPACE), checked against available memory and "
                       "committed at start-up, as upstream's (a first touch inside a prefill costs "
                       "~1 GB/s)")
    out["amx"] = ("tiles for W8A8 linear layers (from 8 rows) and bfloat16 prefill attention"
                  if cpu_features.has_amx(features) else
                  "none: " + ("VLLM_CPU_MAX_ISA hides it" if features.capped_at else
                              "this CPU has no amx_tile/amx_int8/amx_bf16"))
    from pathlib import Path

    from engine.platforms import cpu_hugepages

    mode = cpu_hugepages.thp_mode(Path(envs.sysfs_root()))
    out["huge_pages"] = (
        f"transparent huge pages '{mode}': asked for the packed weights and the KV cache"
        if mode in ("always", "madvise") else
        f"transparent huge pages {mode or 'unavailable'}: 4 KiB pages (slower streaming of "
        "weights and KV cache)")
    return out


def engine_compiled_isas() -> list[str]:
    import engine.ops

    return engine.ops.compiled_cpu_isas()


def report() -> dict:
    return {**static_report(), **runtime_report()}


def main(argv: list[str] | None = None) -> int:
    try:
        return _print(argv)
    except ValueError as exc:  # a bad run-time variable (VLLM_CPU_ISA, ...): one line
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `engine env | head -1`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no flush error at exit
        return 0


def _print(argv: list[str] | None) -> int:
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
