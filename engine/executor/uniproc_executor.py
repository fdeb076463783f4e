"""Runs the model in this process, as upstream's UniProcExecutor: pins the
threads, builds the model runner (engine/worker/cpu_worker.py) and runs
scheduled batches."""
from __future__ import annotations

from engine.core.kv_cache_manager import BlockManager
from engine.core.sequence import Sequence
from engine.distributed.parallel_state import replica_bindings
from engine.engine_args import EngineConfig
from engine.platforms import cpu_binding, cpu_preload
from engine.platforms import current as current_platform
from engine.worker.cpu_worker import build_pooling_runner, build_runner
from engine.worker.model_runner import ModelRunner
from engine.worker.pooling_model_runner import PoolingModelRunner


class UniProcExecutor:
    def __init__(self, config: EngineConfig, blocks: BlockManager):
        if current_platform().device_type == "cpu":
            cpu_preload.warn_if_not_preloaded()
            if config.bind_threads:
                cpu_binding.apply(replica_bindings(1, config.data_parallel_size,
                                                   config.data_parallel_rank)[0])
        self.runner: ModelRunner | PoolingModelRunner = \
            build_pooling_runner(config) if config.pooler is not None else \
            build_runner(config, blocks)
        self.model, self.linear_mode = self.runner.model, self.runner.linear_mode

    def execute_model(self, seqs: list[Sequence], is_prefill: bool, bitmask=None) -> list:
        """One token per sequence, sampled from the batch's logits (a pooling
        model: one pooled vector per sequence); bitmask: a Future of the sampled
        rows' grammar bitmask (structured outputs), or None."""
        if bitmask is None:
            return self.runner.run(seqs, is_prefill)
        return self.runner.run(seqs, is_prefill, bitmask)  # type: ignore[call-arg]  # generating

    def check_health(self) -> None:
        """Raises when a part of the executor has died (never, in one process)."""
