"""A tensor-parallel rank other than the driver's, in a process of its own
(engine.executor.multiproc_executor starts it): pinned to its CPUs, it loads
its shard of the model, joins the gloo group and runs every batch the driver
sends, until the driver says stop or goes away."""
from __future__ import annotations

import logging
import os
import sys

from engine.distributed import parallel_state
from engine.distributed.parallel_state import DistInit
from engine.engine_args import EngineConfig
from engine.platforms.cpu_binding import Binding

READY = "ready"


def worker_main(rank: int, config: EngineConfig, binding: Binding | None, dist: DistInit,
                conn) -> None:
    logging.basicConfig(level=logging.WARNING, format=f"%(levelname)s rank {rank}: %(message)s")
    try:
        runner = start(rank, config, binding, dist, conn)
    except Exception as exc:  # noqa: BLE001 - the driver names the rank and this line
        conn.send(f"{type(exc).__name__}: {exc}")
        return
    try:
        while True:
            inputs = conn.recv()
            if inputs is None:
                break
            runner.execute(inputs)  # the logits are the driver's; this rank's part is gathered
    except (EOFError, OSError, KeyboardInterrupt):
        pass  # the driver went away: so does this rank
    except RuntimeError as exc:  # a collective failed: a peer died
        print(f"tensor-parallel rank {rank}: {exc}".splitlines()[0], file=sys.stderr)
    finally:
        os._exit(0)  # gloo's threads must not keep a rank alive past its driver


def start(rank: int, config: EngineConfig, binding: Binding | None, dist: DistInit, conn):
    from engine.core.kv_cache_manager import BlockManager
    from engine.platforms import cpu_binding
    from engine.worker.cpu_worker import build_runner

    if binding is not None:
        cpu_binding.apply(binding)
    parallel_state.init(rank, dist)
    runner = build_runner(config, BlockManager(config.num_blocks, config.block_size))
    conn.send(READY)
    parallel_state.join(rank, dist)
    return runner
