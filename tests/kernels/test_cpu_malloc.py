"""engine.platforms.cpu_malloc: after keep_freed_memory(), a freed large tensor's
pages are reused without page faults (each case in a fresh interpreter, so the
test process keeps its own malloc)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from engine import envs

SCRIPT = """
import resource, sys, torch
from engine.platforms import cpu_malloc
if sys.argv[1] == "keep":
    assert cpu_malloc.keep_freed_memory()
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
def step():  # a step's activations: several tensors of a few MB, live together
    live = [torch.empty(6 << 20).fill_(1) for _ in range(8)]  # 24 MB each
for _ in range(3):
    step()
before = faults()
for _ in range(3):
    step()
print(faults() - before)
"""


def faults(mode: str) -> int:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    out = subprocess.run([sys.executable, "-c", SCRIPT, mode], capture_output=True, text=True,
                         check=True, env=env)
    return int(out.stdout.split()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt: Linux only")
def test_freed_activations_are_reused_without_page_faults():
    pages = 8 * (24 << 20) // 4096  # one step's
    # glibc's own choice depends on where the heap landed (address randomisation):
    # most runs trim and refault every step, some keep the memory by chance
    plain = 0
    for _ in range(5):
        plain = max(plain, faults("plain"))
        if plain > pages:
            break
    assert plain > pages, f"the default malloc never refaulted ({plain} faults): nothing to show"
    keep = faults("keep")
    assert keep < pages // 16, keep


def test_the_switch():
    assert envs.cpu_keep_freed_memory({}) is True
    assert envs.cpu_keep_freed_memory({"VLLM_CPU_KEEP_FREED_MEMORY": "0"}) is False
