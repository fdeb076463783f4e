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


def main(argv: list[str] | None = None) -> int:
    data = report()
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
