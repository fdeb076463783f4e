"""The executor an EngineConfig asks for: one process, processes on this
machine (mp) or a Ray cluster (ray)."""
from __future__ import annotations

from engine.core.kv_cache_manager import BlockManager
from engine.engine_args import EngineConfig


def make_executor(config: EngineConfig, blocks: BlockManager):
    backend = config.distributed_executor_backend
    if backend == "mp":
        from engine.executor.multiproc_executor import MultiprocExecutor

        return MultiprocExecutor(config, blocks)
    if backend == "ray":
        from engine.executor.ray_executor import RayExecutor

        return RayExecutor(config, blocks)
    from engine.executor.uniproc_executor import UniProcExecutor

    return UniProcExecutor(config, blocks)
