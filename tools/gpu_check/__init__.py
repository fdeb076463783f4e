"""The GPU check (ci/gpu-check.sh): every op against engine.reference, the
engine's greedy output against transformers, and the kernels against eager
torch, on one device. Each part takes the device as an argument, so the suite
runs them on the CPU (tests/toolchain/test_gpu_check.py) where no GPU is at hand.

    python -m tools.gpu_check [--device cuda] [--skip-greedy] [--skip-bench] [--check]
"""
