"""Every run-time environment variable of the engine, parsed and validated here.

Each variable has its default, its valid forms and its error message next to
it; the rest of the package reads the parsed values through this module.
"""
from __future__ import annotations

import os
from typing import Mapping

CPU_ISA_CHOICES = ("auto", "avx512", "avx2", "generic")


class EnvError(ValueError):
    """An environment variable has a value the engine cannot use."""


def _choice(env: Mapping[str, str], name: str, choices: tuple[str, ...], default: str) -> str:
    value = env.get(name, "").strip().lower() or default
    if value not in choices:
        raise EnvError(f"{name}={env[name]!r} is not valid; use one of: {', '.join(choices)}")
    return value


def cpu_isa(env: Mapping[str, str] | None = None) -> str:
    """VLLM_CPU_ISA: which compiled CPU code path the kernels use.

    `auto` (default) takes the best the processor supports; `avx2` forces the
    AVX2 path on an AVX-512 machine (the tests cover both paths this way);
    `avx512` fails clearly where the processor lacks AVX-512.
    """
    return _choice(os.environ if env is None else env, "VLLM_CPU_ISA", CPU_ISA_CHOICES, "auto")
