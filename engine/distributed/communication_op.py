"""The collectives the tensor-parallel layers use (upstream's
communication_op), over torch.distributed's gloo group; with one rank
each returns its input untouched."""
from __future__ import annotations

import torch

from engine.distributed.parallel_state import tp_size


def tensor_model_parallel_all_reduce(x: torch.Tensor) -> torch.Tensor:
    """The sum of every rank's x, in place."""
    if tp_size() == 1:
        return x
    import torch.distributed as td

    td.all_reduce(x)
    return x


def tensor_model_parallel_all_gather(x: torch.Tensor) -> torch.Tensor:
    """Every rank's x side by side along the last dimension, in rank order."""
    world = tp_size()
    if world == 1:
        return x
    import torch.distributed as td

    x = x.contiguous()
    parts = [torch.empty_like(x) for _ in range(world)]
    td.all_gather(parts, x)
    return torch.cat(parts, dim=-1)
