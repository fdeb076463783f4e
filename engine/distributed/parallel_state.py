"""This process's place among the ranks (upstream's parallel_state): one
gloo process group over TCP on the driver's address, of pp stages of tp
ranks each (global rank = stage x tp + tensor-parallel rank). A process that
never joins one is rank 0 of 1, stage 0 of 1, and every collective of
engine.distributed.communication_op is then a no-op."""
from __future__ import annotations

import logging
import os
import secrets
import socket
from dataclasses import dataclass
from datetime import timedelta

# A collective that waits longer than this on a peer raises instead of hanging
# (a rank that died mid-step usually closes its sockets first, and gloo then
# raises at once). Long enough for the slowest prefill of one step on a peer.
COLLECTIVE_TIMEOUT_S = 120


class RankDiedError(RuntimeError):
    """A tensor-parallel rank is gone; the engine cannot step again."""


def raise_if_dead(dead: str | None) -> None:
    """An executor's health check: once a rank has died (dead names it), every
    later step fails with that one line."""
    if dead is not None:
        raise RankDiedError(dead)


@dataclass(frozen=True)
class DistInit:
    """How a rank joins the group: the address of rank 0's TCP store."""

    host: str
    port: int
    world_size: int  # every rank: tp x pp
    pp_size: int = 1  # pipeline stages
    same_machine: bool = False  # every rank on this machine: all-reduce through shared memory


_rank, _world = 0, 1  # tensor parallel, within this stage
_pp_rank, _pp_size = 0, 1
_shm = None  # the shared-memory all-reduce (engine.distributed.shm_all_reduce), when there is one


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def replica_bindings(ranks: int, dp: int = 1, dp_rank: int = 0) -> list:
    """The CPU bindings (engine.platforms.cpu_binding) of one data-parallel
    replica's ranks (tp x pp). The machine's dp x ranks are planned together, so
    VLLM_CPU_OMP_THREADS_BIND names one list per rank, replica after replica
    ('0|1' with -dp 2: replica 0 on CPU 0, replica 1 on CPU 1), and `auto`
    gives each its own NUMA node; this replica's share is returned."""
    from engine.platforms import cpu_binding

    if dp == 1 and ranks == 1:  # one rank: list 0 of any list, as before there was -dp
        return [cpu_binding.plan()]
    return cpu_binding.plan_all(dp * ranks)[dp_rank * ranks:(dp_rank + 1) * ranks]


def init(rank: int, dist: DistInit) -> None:
    """Take `rank`'s place: the model built next is this rank's shard (of
    this stage's layers)."""
    global _rank, _world, _pp_rank, _pp_size
    tp = dist.world_size // dist.pp_size
    _rank, _world = rank % tp, tp
    _pp_rank, _pp_size = rank // tp, dist.pp_size


def join(rank: int, dist: DistInit) -> None:
    """Join the gloo group (blocks until every rank has joined); separate
    from init() so that a rank whose model fails to load is heard of first."""
    import torch.distributed as td

    if dist.world_size > 1:
        td.init_process_group("gloo", init_method=f"tcp://{dist.host}:{dist.port}", rank=rank,
                              world_size=dist.world_size,
                              timeout=timedelta(seconds=COLLECTIVE_TIMEOUT_S))
        if dist.same_machine and dist.pp_size == 1:
            _join_shared_memory(rank, dist)


def _join_shared_memory(rank: int, dist: DistInit) -> None:
    """Map the ranks' shared all-reduce buffers (a random name rank 0 sends
    the others, unlinked once every rank has mapped them)."""
    global _shm
    import torch.distributed as td

    from engine.distributed import shm_all_reduce

    if not shm_all_reduce.supported():
        return
    # a name no one can guess (a name from the port let another local user plant
    # a file or link there first), made by rank 0 (O_EXCL, 0600) and sent to the rest
    name = [f"/dev/shm/vllm-engine-allreduce-{secrets.token_hex(16)}" if rank == 0 else ""]
    td.broadcast_object_list(name, src=0)
    path: str = name[0]
    if rank == 0:
        _shm = shm_all_reduce.ShmAllReduce(path, 0, dist.world_size, COLLECTIVE_TIMEOUT_S, True)
    td.barrier()
    if rank:
        _shm = shm_all_reduce.ShmAllReduce(path, rank, dist.world_size, COLLECTIVE_TIMEOUT_S,
                                           False)
    td.barrier()
    if rank == 0:
        os.unlink(path)
        logging.getLogger("engine").info(
            "all-reduce: shared memory for tensors up to %d MiB, gloo above",
            shm_all_reduce.SLOT_BYTES >> 20)


def shared_memory_all_reduce():
    """The shared-memory all-reduce of this rank's group, or None."""
    return _shm


def abort_collectives() -> None:
    """Make every rank waiting in a shared-memory all-reduce raise (a rank died)."""
    if _shm is not None:
        _shm.abort()


def destroy() -> None:
    global _rank, _world, _pp_rank, _pp_size, _shm
    import torch.distributed as td

    if td.is_initialized():
        td.destroy_process_group()
    _rank, _world, _pp_rank, _pp_size, _shm = 0, 1, 0, 1, None


def tp_rank() -> int:
    return _rank


def tp_size() -> int:
    return _world


def pp_rank() -> int:
    return _pp_rank


def pp_size() -> int:
    return _pp_size


def pp_layer_range(num_layers: int, pp: int | None = None, stage: int | None = None
                   ) -> tuple[int, int]:
    """[start, end): the decoder layers of a pipeline stage, as even as they
    go (the first num_layers % pp stages one more)."""
    pp = _pp_size if pp is None else pp
    stage = _pp_rank if stage is None else stage
    per, extra = divmod(num_layers, pp)
    start = stage * per + min(stage, extra)
    return start, start + per + (stage < extra)
