"""One data-parallel replica, in a process of its own (engine.executor.
data_parallel starts it): a whole engine core (scheduler, KV cache, executor,
its own tensor-parallel ranks when -tp > 1) pinned to its share of the CPUs.
It takes the requests the front sends, steps while it has work, and sends
back each step's new tokens, until the front says stop or goes away.

To the replica: ("add", EngineCoreRequest), ("abort", [request_id...]), None
(stop). From it: ("ready", num_blocks) or ("error", line) once; then per
step ("step", EngineCoreOutputs); ("failed", request_ids, line) for a step
that raised (its requests end, the replica goes on); ("dead", line) before
it exits because a part of it died."""
from __future__ import annotations

import logging
import os

HEALTH_POLL_S = 1.0  # an idle replica checks its own ranks this often


def replica_main(rank: int, model, dtype: str, engine_args: dict, conn) -> None:
    logging.basicConfig(level=logging.WARNING,
                        format=f"%(levelname)s data-parallel rank {rank}: %(message)s")
    try:
        from engine.core.engine_core import EngineCore

        core = EngineCore(model, dtype, **engine_args, data_parallel_rank=rank)
    except Exception as exc:  # noqa: BLE001 - the front names the rank and this line
        conn.send(("error", f"{type(exc).__name__}: {exc}".splitlines()[0]))
        return
    conn.send(("ready", core.blocks.num_blocks))
    try:
        serve(core, conn)
    except (EOFError, OSError, KeyboardInterrupt):
        pass  # the front went away: so does this replica
    finally:
        shutdown = getattr(core.executor, "shutdown", None)
        if shutdown is not None:
            shutdown()
        os._exit(0)  # gloo's threads must not keep a replica alive past its front


def serve(core, conn) -> None:
    from engine.distributed.parallel_state import RankDiedError

    while True:
        if not core.has_unfinished() and not conn.poll(HEALTH_POLL_S):
            try:
                core.check_health()
            except RankDiedError as exc:
                conn.send(("dead", str(exc)))
                return
            continue
        while conn.poll(0):
            msg = conn.recv()
            if msg is None:
                return
            if msg[0] == "add":
                core.add_request(msg[1])
            else:
                core.abort_requests(msg[1])
        if not core.has_unfinished():
            continue
        core.last_scheduled = []
        try:
            out = core.step()
        except RankDiedError as exc:
            conn.send(("dead", str(exc)))
            return
        except Exception as exc:  # noqa: BLE001 - fail the step's requests, not the replica
            ids = list(core.last_scheduled or core.requests)
            core.abort_requests(ids)
            conn.send(("failed", ids, f"{type(exc).__name__}: {exc}".splitlines()[0]))
            continue
        conn.send(("step", out))
