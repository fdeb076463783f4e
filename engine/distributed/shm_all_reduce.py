"""An all-reduce (and all-gather) through shared memory for tensor-parallel
ranks on one machine (upstream's CPU backend has one too): each rank copies its tensor
into its slot of a mapping every rank shares, raises its flag, waits until
every flag is up, and sums the slots in rank order (the same sum on every
rank). Two alternating buffers make reuse safe: a rank can only write a
buffer again two calls later, after every peer raised its flag for the call
in between, so after each finished reading it.

x86 only: the flag is written after the data with plain stores, which x86
keeps in order (another architecture would need fences); tensors larger
than a slot go through gloo. A waiting rank raises after COLLECTIVE_TIMEOUT_S,
at once when the abort flag is up (the driver's watchdog sets it when a rank
dies) or when the process that started it is gone."""
from __future__ import annotations

import mmap
import os
import platform
import time

import numpy as np
import torch

#: the largest tensor (bytes) that goes through shared memory; larger ones use gloo
SLOT_BYTES = 4 << 20
_LINE = 8  # int64s per flag: one cache line each


def supported() -> bool:
    return platform.machine() in ("x86_64", "AMD64")


class ShmAllReduce:
    def __init__(self, path: str, rank: int, world: int, timeout_s: float, create: bool):
        self.rank, self.world, self.timeout_s = rank, world, timeout_s
        header = (world + 1) * _LINE * 8
        size = header + 2 * world * SLOT_BYTES
        fd = os.open(path, os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0), 0o600)
        try:
            if create:
                os.ftruncate(fd, size)
            self._map = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        self._flags = np.frombuffer(self._map, np.int64, (world + 1) * _LINE)
        self._up = self._flags[:world * _LINE:_LINE]  # each rank's last finished call
        self._data = torch.frombuffer(self._map, dtype=torch.uint8, offset=header,
                                      count=2 * world * SLOT_BYTES).view(2, world, SLOT_BYTES)
        self._calls = 0
        self._parent = os.getppid()

    def fits(self, x: torch.Tensor) -> bool:
        return x.is_contiguous() and x.device.type == "cpu" and \
            x.numel() * x.element_size() <= SLOT_BYTES

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """x becomes the sum of every rank's x (in place); x must fit()."""
        slots = self._exchange(x)
        x.view(-1).copy_(slots[0])
        for r in range(1, self.world):
            x.view(-1).add_(slots[r])
        return x

    def all_gather(self, x: torch.Tensor) -> list[torch.Tensor]:
        """Every rank's x, in rank order: views of the shared slots, valid until
        the next call but one (copy them at once, e.g. torch.cat); x must fit()."""
        return [slot.view(x.shape) for slot in self._exchange(x)]

    def _exchange(self, x: torch.Tensor) -> torch.Tensor:
        """Publish x in this rank's slot; once every rank has, the slots [world, numel]."""
        self._calls += 1
        call, buf = self._calls, self._calls % 2
        nbytes = x.numel() * x.element_size()
        slots = self._data[buf, :, :nbytes].view(x.dtype)
        slots[self.rank].copy_(x.view(-1))
        self._flags[self.rank * _LINE] = call
        self._wait(call)
        return slots

    def _wait(self, call: int) -> None:
        up, spins, deadline = self._up, 0, None
        while (up < call).any():
            spins += 1
            if spins < 2000:
                continue
            if self._flags[self.world * _LINE]:
                raise RuntimeError("shared-memory all-reduce aborted: a rank died")
            if deadline is None:
                deadline = time.monotonic() + self.timeout_s
            elif time.monotonic() > deadline:
                raise RuntimeError(f"shared-memory all-reduce: no peer answer in "
                                   f"{self.timeout_s:.0f} s")
            if self.rank and os.getppid() != self._parent:
                raise RuntimeError("shared-memory all-reduce: the driver is gone")
            os.sched_yield()  # a peer sharing this CPU gets to run

    def abort(self) -> None:
        """Make every rank waiting here raise (a peer died)."""
        self._flags[self.world * _LINE] = 1
