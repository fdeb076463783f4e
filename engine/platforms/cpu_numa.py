"""Keep a rank's memory on its NUMA node (set_mempolicy), the memory half of
VLLM_CPU_OMP_THREADS_BIND=auto.

Containers may forbid it: Docker's default seccomp profile refuses the NUMA
system calls unless the container has CAP_SYS_NICE (the guide's
`--cap-add SYS_NICE --security-opt seccomp=unconfined`). That must cost only
this optimisation, so failures come back as a reason, never as an exception.
"""
from __future__ import annotations

import ctypes
import os
import platform

# No libnuma in the images: the two system calls are made directly.
_SYSCALLS = {
    "x86_64": {"get_mempolicy": 239, "set_mempolicy": 238},
    "aarch64": {"get_mempolicy": 236, "set_mempolicy": 237},
}
MPOL_BIND = 2
_MASK_BITS = 1024


def _syscall(name: str, *args) -> int:
    """The call's errno, 0 on success."""
    nums = _SYSCALLS.get(platform.machine())
    if nums is None:
        return -1
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    if libc.syscall(ctypes.c_long(nums[name]), *args) == 0:
        return 0
    return ctypes.get_errno()


def bind_memory(node: int) -> str | None:
    """Bind this thread's (and its future threads') allocations to `node`.
    None when done, else why not (e.g. 'get_mempolicy: Operation not permitted')."""
    if platform.machine() not in _SYSCALLS:
        return f"NUMA memory binding is not implemented on {platform.machine()}"
    if not 0 <= node < _MASK_BITS:
        return f"NUMA node {node} is out of range"
    # get_mempolicy first: harmless, and refused exactly when set_mempolicy would be.
    mode = ctypes.c_int()
    err = _syscall("get_mempolicy", ctypes.byref(mode), None, ctypes.c_ulong(0), None,
                   ctypes.c_ulong(0))
    if err:
        return f"get_mempolicy: {os.strerror(err)}"
    words = _MASK_BITS // (8 * ctypes.sizeof(ctypes.c_ulong))
    mask = (ctypes.c_ulong * words)()
    bits = 8 * ctypes.sizeof(ctypes.c_ulong)
    mask[node // bits] = 1 << (node % bits)
    # maxnode is one more than the mask's bits, as libnuma passes it.
    err = _syscall("set_mempolicy", ctypes.c_int(MPOL_BIND), mask, ctypes.c_ulong(_MASK_BITS + 1))
    if err:
        return f"set_mempolicy: {os.strerror(err)}"
    return None
