"""The collectives the tensor-parallel layers use (upstream's
communication_op), over torch.distributed's gloo group; with one rank
each returns its input untouched. And the point-to-point sends between
pipeline stages."""
from __future__ import annotations

from collections.abc import Iterable

import torch

from engine.distributed.parallel_state import shared_memory_all_reduce, tp_size


def tensor_model_parallel_all_reduce(x: torch.Tensor) -> torch.Tensor:
    """The sum of every rank's x, in place."""
    if tp_size() == 1:
        return x
    shm = shared_memory_all_reduce()
    if shm is not None and shm.fits(x):  # ranks on one machine: faster than gloo
        return shm.all_reduce(x)
    import torch.distributed as td

    td.all_reduce(x)
    return x


def tensor_model_parallel_all_gather(x: torch.Tensor) -> torch.Tensor:
    """Every rank's x side by side along the last dimension, in rank order."""
    world = tp_size()
    if world == 1:
        return x
    x = x.contiguous()
    shm = shared_memory_all_reduce()
    if shm is not None and shm.fits(x):  # the LM head's logits every step: gloo costs ms
        return torch.cat(shm.all_gather(x), dim=-1)
    import torch.distributed as td

    parts = [torch.empty_like(x) for _ in range(world)]
    td.all_gather(parts, x)
    return torch.cat(parts, dim=-1)


def send_tensors(tensors: list[torch.Tensor], dst: int) -> None:
    """To global rank dst, in order (it receives them with recv_tensors)."""
    import torch.distributed as td

    for t in tensors:
        td.send(t.contiguous(), dst)


def recv_tensors(like: Iterable[tuple[tuple[int, ...], torch.dtype]], src: int
                 ) -> list[torch.Tensor]:
    """Tensors of the given (shape, dtype)s from global rank src, in order."""
    import torch.distributed as td

    out = [torch.empty(shape, dtype=dtype) for shape, dtype in like]
    for t in out:
        td.recv(t, src)
    return out
