"""Kernels at the edge of memory: scratch that malloc refuses (the attention's
per-thread logits, sized by the batch's longest sequence; the linear layer's
packed rows of x) is an OutOfMemoryError naming the op, not a write through a
null pointer."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
from helpers import REPO

import engine

PROBE = r"""
import resource, torch
from engine import ops

def inputs(seq_len, heads=64, head_size=16, block_size=16):
    # one cached block, named by every table entry: a long sequence in little memory
    kc = torch.randn(1, 1, block_size, head_size)
    vc = torch.randn(1, 1, block_size, head_size)
    blocks = -(-seq_len // block_size)
    tables = torch.zeros(1, blocks, dtype=torch.int32)
    q = torch.randn(1, heads, head_size)
    return torch.empty_like(q), q, kc, vc, tables, torch.tensor([seq_len], dtype=torch.int32)

ops.paged_attention(*inputs(64), 0.25)  # the OpenMP pool and torch's arenas, before the cap
args = inputs(1 << 20)  # 64 heads x 1M tokens: 256 MiB of logits for the thread
vm = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmSize:"))
resource.setrlimit(resource.RLIMIT_AS, ((vm << 10) + (128 << 20), resource.RLIM_INFINITY))
try:
    ops.paged_attention(*args, 0.25)
    print("ran")
except torch.OutOfMemoryError as exc:
    print("refused:", str(exc).splitlines()[0])
"""


@pytest.mark.slow  # a Python start with torch, then 1M-token attention setup
@pytest.mark.skipif(not engine.BUILD_INFO.has_kernels, reason="no compiled kernels (run ci/setup-dev.sh)")
def test_attention_scratch_that_cannot_be_allocated_is_an_error():
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    res = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True,
                         timeout=300, cwd=REPO)
    assert res.returncode == 0, (res.returncode, res.stderr[-2000:])
    assert res.stdout.startswith("refused: paged_attention: a thread could not allocate "), \
        res.stdout + res.stderr[-2000:]



LINEAR_PROBE = r"""
import resource, torch
from engine import ops
from engine.model_executor.layers.linear import pack_panels

packed = pack_panels(torch.randn(16, 4096))
ops.linear(torch.empty(8, 16), torch.randn(8, 4096), packed, None)  # the OpenMP pool, first
x = torch.randn(1 << 14, 4096)  # 256 MiB of rows, which the kernel packs into as much scratch
out = torch.empty(1 << 14, 16)
vm = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmSize:"))
resource.setrlimit(resource.RLIMIT_AS, ((vm << 10) + (128 << 20), resource.RLIM_INFINITY))
try:
    ops.linear(out, x, packed, None)
    print("ran")
except torch.OutOfMemoryError as exc:
    print("refused:", str(exc).splitlines()[0])
"""


@pytest.mark.slow  # a Python start with torch and 256 MiB of input
@pytest.mark.skipif(not engine.BUILD_INFO.has_kernels,
                    reason="no compiled kernels (run ci/setup-dev.sh)")
def test_linear_scratch_that_cannot_be_allocated_is_an_error():
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    res = subprocess.run([sys.executable, "-c", LINEAR_PROBE], env=env, capture_output=True,
                         text=True, timeout=300, cwd=REPO)
    assert res.returncode == 0, (res.returncode, res.stderr[-2000:])
    assert res.stdout.startswith("refused: linear: a thread could not allocate "), \
        res.stdout + res.stderr[-2000:]
