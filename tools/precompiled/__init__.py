"""Precompiled mode: take the compiled kernels of the right commit and variant
from the wheel index instead of compiling (VLLM_USE_PRECOMPILED=1).

select.py decides which wheel, fetch.py downloads and checks it, extract.py
takes its compiled files into the source tree; install_kernels runs the three.
"""
from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

from tools.precompiled.extract import RECORD, extract_kernels
from tools.precompiled.fetch import fetch
from tools.precompiled.select import Choice, choose_wheel
from tools.target import torch_requirement
from tools.variants import get_variant


def install_kernels(root: Path, env: Mapping[str, str], log=print) -> Choice:
    choice = choose_wheel(root, env, log=log)
    path = fetch(choice.url, choice.sha256, env, log=log)
    record = {
        "commit": choice.commit, "variant": choice.variant, "source": choice.url,
        "sha256": choice.sha256, "fallback_from": choice.fallback_from,
        "wheel": choice.filename,
    }
    extract_kernels(path, root / "engine", choice.variant,
                    torch_requirement(get_variant(choice.variant)),
                    extra={RECORD: json.dumps(record, indent=1).encode()})
    log(f"vllm-engine: using precompiled kernels of {choice.commit or choice.url} "
        f"({choice.variant})")
    return choice
