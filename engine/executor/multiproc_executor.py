"""Tensor and pipeline parallel on this machine (distributed_executor_backend="mp"): the
driver process is rank 0, as upstream's CPU path has it, and ranks 1..N-1
are processes of their own (engine.worker.tp_worker). The scheduler runs once,
here; each step's inputs go to every rank over a pipe, the ranks run the same
batch and meet in gloo collectives (torch.distributed), and the driver samples
from the gathered logits.

A rank that dies is named in one line (RankDiedError): a watchdog thread
waits on the workers' processes, and a collective whose peer went away
raises (at once when its sockets close, else after the group's timeout)."""
from __future__ import annotations

import atexit
import logging
import multiprocessing as mp
import threading
from multiprocessing.connection import wait

from engine.core.kv_cache_manager import BlockManager
from engine.core.sequence import Sequence
from engine.distributed import parallel_state
from engine.distributed.parallel_state import (
    DistInit,
    RankDiedError,
    free_port,
    raise_if_dead,
    replica_bindings,
)
from engine.engine_args import EngineConfig
from engine.platforms import cpu_binding, cpu_preload
from engine.spawn import main_not_rerun
from engine.worker import tp_worker
from engine.worker.cpu_worker import build_runner
from engine.worker.model_runner import sample_step

logger = logging.getLogger("engine")


class MultiprocExecutor:
    def __init__(self, config: EngineConfig, blocks: BlockManager):
        world = config.world_size
        # every rank's binding checked before any process starts: errors are one line here
        bindings = (replica_bindings(world, config.data_parallel_size, config.data_parallel_rank)
                    if config.bind_threads else [None] * world)
        cpu_preload.warn_if_not_preloaded()
        dist = DistInit("127.0.0.1", free_port(), world, config.pipeline_parallel_size,
                        same_machine=True)
        ctx = mp.get_context("spawn")  # a fork would copy torch's OpenMP pool and locks
        self.procs, self.conns = {}, {}
        self.dead: str | None = None
        self.eos_token_ids = config.model.eos_token_ids
        try:
            for rank in range(1, world):
                parent, child = ctx.Pipe()
                proc = ctx.Process(target=tp_worker.worker_main, daemon=True,
                                   args=(rank, config, bindings[rank], dist, child),
                                   name=f"tp-rank-{rank}")
                with main_not_rerun():
                    proc.start()
                child.close()
                self.procs[rank], self.conns[rank] = proc, parent
            if bindings[0] is not None:
                cpu_binding.apply(bindings[0])
            parallel_state.init(0, dist)
            self.runner = build_runner(config, blocks)
            self._wait_ready()
            parallel_state.join(0, dist)
        except BaseException:
            self.shutdown()
            raise
        atexit.register(self.shutdown)  # before multiprocessing's own: a stop is no death
        self._watchdog = threading.Thread(target=self._watch, daemon=True, name="tp-watchdog")
        self._watchdog.start()
        logger.info("tensor parallel: %d ranks in %d pipeline stage(s) (mp, gloo on "
                    "127.0.0.1:%d)", world, config.pipeline_parallel_size, dist.port)

    def _wait_ready(self) -> None:
        waiting = dict(self.conns)
        while waiting:
            for rank, conn in list(waiting.items()):
                proc = self.procs[rank]
                if not conn.poll(0.05):
                    if not proc.is_alive():
                        raise RankDiedError(f"tensor-parallel rank {rank} died while loading "
                                            f"the model (exit code {proc.exitcode})")
                    continue
                try:
                    msg = conn.recv()
                except EOFError:
                    proc.join(5)
                    raise RankDiedError(f"tensor-parallel rank {rank} died while loading the "
                                        f"model (exit code {proc.exitcode})") from None
                if msg != tp_worker.READY:
                    raise ValueError(f"tensor-parallel rank {rank}: {msg}")
                del waiting[rank]

    def _watch(self) -> None:
        sentinels = {p.sentinel: rank for rank, p in self.procs.items()}
        if not sentinels:
            return
        ready = wait(list(sentinels))
        if self.dead is None and not getattr(self, "_closing", False):
            # wait() gives back some of the sentinels (ints) it got; typeshed types them wider
            rank = sentinels[ready[0]]  # type: ignore[index]
            self.dead = f"tensor-parallel rank {rank} died (exit code " \
                        f"{self.procs[rank].exitcode})"
            logger.error("%s; the engine stops", self.dead)
            parallel_state.abort_collectives()  # a rank waiting on it in shared memory raises

    def check_health(self) -> None:
        raise_if_dead(self.dead)

    def execute_model(self, seqs: list[Sequence], is_prefill: bool,
                      bitmask=None) -> list[int]:
        self.check_health()
        inputs = self.runner.prepare(seqs, is_prefill)
        try:
            for conn in self.conns.values():
                conn.send(inputs)
            logits = self.runner.execute(inputs)
        except (RuntimeError, OSError) as exc:  # a peer gone mid-step (or a collective timeout)
            self._watchdog.join(2)  # give the watchdog a moment to name the rank
            self.check_health()
            raise RankDiedError(f"tensor parallel step failed: {str(exc).splitlines()[0]}") \
                from None
        assert logits is not None, "the driver (rank 0) gets the logits"
        return sample_step(logits, seqs, self.eos_token_ids, bitmask)

    def shutdown(self) -> None:
        if getattr(self, "_closing", False):
            return
        self._closing = True
        for conn in self.conns.values():
            try:
                conn.send(None)
            except OSError:
                pass
        for proc in self.procs.values():
            proc.join(5)
            if proc.is_alive():
                proc.kill()
        parallel_state.destroy()
