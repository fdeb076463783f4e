"""glibc's malloc kept from handing a step's activations back to the kernel.

A prefill step allocates tensors of tokens x width (a 2048-token step of the
small benchmark Llama: 22 MB for the gate/up output alone). glibc serves
anything above its mmap threshold (at most 32 MiB, grown only after a free) with
a fresh mapping and unmaps it when the tensor is freed, and trims the heap's
free top back to the kernel: the next step touches every page again, one page
fault per 4 KiB. Measured on a 2-core Zen 5 VM: 0.38 ms per MB, 90k faults and
0.45 s of system time in one 3000-token prefill of the small Llama (about 1 s).
Upstream vLLM preloads TCMalloc for the same reason.

`keep_freed_memory()` (once the model is loaded, so the load's own transient
copies are still returned) fixes glibc's mmap threshold at its largest (32 MiB:
every smaller block comes from the heap, from the first step on) and stops it
trimming the heap: the resident memory stays at the largest step's working set
instead of shrinking between steps. (Blocks above 32 MiB are still mapped
afresh: glibc allows no higher threshold, and without mmap at all its aligned
allocations fragment the heap.) A no-op where malloc is not glibc's (TCMalloc
preloaded ignores mallopt), and off with VLLM_CPU_KEEP_FREED_MEMORY=0.
"""
from __future__ import annotations

import ctypes
import sys
from functools import lru_cache

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
#: glibc's largest mmap threshold on 64-bit (DEFAULT_MMAP_THRESHOLD_MAX)
MMAP_THRESHOLD_MAX = 32 << 20
_INT_MAX = 2 ** 31 - 1


@lru_cache(maxsize=1)
def keep_freed_memory() -> bool:
    """Whether glibc's malloc now keeps freed memory (once per process)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
        _ = libc.gnu_get_libc_version  # glibc only: AttributeError elsewhere
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return (bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_MAX))
            and bool(mallopt(M_TRIM_THRESHOLD, _INT_MAX)))
