"""This process's place among the tensor-parallel ranks (upstream's
parallel_state): one gloo process group over TCP on the driver's address.
A process that never joins one is rank 0 of 1, and every collective of
engine.distributed.communication_op is then a no-op."""
from __future__ import annotations

import socket
from dataclasses import dataclass
from datetime import timedelta

# A collective that waits longer than this on a peer raises instead of hanging
# (a rank that died mid-step usually closes its sockets first, and gloo then
# raises at once). Long enough for the slowest prefill of one step on a peer.
COLLECTIVE_TIMEOUT_S = 120


class RankDiedError(RuntimeError):
    """A tensor-parallel rank is gone; the engine cannot step again."""


@dataclass(frozen=True)
class DistInit:
    """How a rank joins the group: the address of rank 0's TCP store."""

    host: str
    port: int
    world_size: int


_rank, _world = 0, 1


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def replica_bindings(tp: int, dp: int = 1, dp_rank: int = 0) -> list:
    """The CPU bindings (engine.platforms.cpu_binding) of one data-parallel
    replica's tp ranks. The machine's dp x tp ranks are planned together, so
    VLLM_CPU_OMP_THREADS_BIND names one list per rank, replica after replica
    ('0|1' with -dp 2: replica 0 on CPU 0, replica 1 on CPU 1), and `auto`
    gives each its own NUMA node; this replica's share is returned."""
    from engine.platforms import cpu_binding

    if dp == 1 and tp == 1:  # one rank: list 0 of any list, as before there was -dp
        return [cpu_binding.plan()]
    return cpu_binding.plan_all(dp * tp)[dp_rank * tp:(dp_rank + 1) * tp]


def init(rank: int, dist: DistInit) -> None:
    """Take `rank`'s place: the model built next is this rank's shard."""
    global _rank, _world
    _rank, _world = rank, dist.world_size


def join(rank: int, dist: DistInit) -> None:
    """Join the gloo group (blocks until every rank has joined); separate
    from init() so that a rank whose model fails to load is heard of first."""
    import torch.distributed as td

    if dist.world_size > 1:
        td.init_process_group("gloo", init_method=f"tcp://{dist.host}:{dist.port}", rank=rank,
                              world_size=dist.world_size,
                              timeout=timedelta(seconds=COLLECTIVE_TIMEOUT_S))


def destroy() -> None:
    global _rank, _world
    import torch.distributed as td

    if td.is_initialized():
        td.destroy_process_group()
    _rank, _world = 0, 1


def tp_rank() -> int:
    return _rank


def tp_size() -> int:
    return _world
