"""`python -m engine.env`: what this installation is and runs on (like upstream's collect_env)."""
from __future__ import annotations

import json
import platform
import sys


def report() -> dict:
    import torch

    import engine
    from engine import preload
    from engine.platforms import current as current_platform

    info = engine.BUILD_INFO
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
        "cpu_isa_in_use": engine.ops.cpu_isa(),
        **_cpu_report(info),
        "extension": str(info.extension) if info.extension else None,
        "precompiled_from": precompiled,
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "torch_hip": getattr(torch.version, "hip", None),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "processor": platform.machine(),
        "platform_class": type(current_platform()).__name__,
        "ld_preload_hint": preload.export_line(preload.find(), preload.is_source_build()),
    }


def _cpu_report(info) -> dict:
    """What the CPU runs: usable code paths, how linear layers run per dtype, the KV cache."""
    if info.device != "cpu":
        return {}
    import torch

    from engine import cpu_features, envs
    from engine.layers.linear import cpu_linear_choice

    features = cpu_features.current()
    out = {
        "cpu_isas_usable": [i for i in features.usable_isas()
                            if i in engine_compiled_isas()] or None,
        "cpu_max_isa": features.capped_at,
    }
    for dtype in (torch.float32, torch.bfloat16):
        choice = cpu_linear_choice(dtype)
        out[f"linear_{str(dtype)[6:]}"] = f"{choice.mode} ({choice.reason})"
    try:
        gib = f"{envs.kvcache_space_bytes() / 2**30:g} GiB"
    except envs.EnvError as exc:
        gib = f"invalid: {exc}"
    out["kv_cache"] = (f"{gib} (VLLM_CPU_KVCACHE_SPACE), checked against available memory at "
                       "start-up, then reserved lazily: pages are committed as blocks fill")
    return out


def engine_compiled_isas() -> list[str]:
    import engine.ops

    return engine.ops.compiled_cpu_isas()


def main(argv: list[str] | None = None) -> int:
    try:
        data = report()
    except ValueError as exc:  # a bad run-time variable (VLLM_CPU_ISA, ...): one line
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if argv and "--json" in argv:
        print(json.dumps(data, indent=2))
    else:
        width = max(map(len, data))
        for key, value in data.items():
            print(f"{key:<{width}}  {value}")
        if data["ld_preload_hint"]:
            print(f"\nfor the best CPU performance:\n  {data['ld_preload_hint']}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
