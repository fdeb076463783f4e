"""One data-parallel replica, in a process of its own (engine.executor.
data_parallel starts it): a whole engine core (scheduler, KV cache, executor,
its own tensor-parallel ranks when -tp > 1) pinned to its share of the CPUs.
It takes the requests the front sends, steps while it has work, and sends
back each step's new tokens, until the front says stop or goes away.

To the replica: ("add", Sequence), ("abort", request_id), None (stop).
From it: ("ready", num_blocks) or ("error", line) once; then per step
("step", [TokenUpdate...], ReplicaLoad); ("failed", request_ids, line) for a
step that raised (its requests end, the replica goes on); ("dead", line)
before it exits because a part of it died."""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass

HEALTH_POLL_S = 1.0  # an idle replica checks its own ranks this often


@dataclass(frozen=True)
class TokenUpdate:
    """What one step did to one request."""

    request_id: str
    token: int
    finish_reason: str | None
    stop_string: str | int | None
    text: str | None  # the output's text, once finished
    logprob: tuple | None  # the token's (logprob, top) when the request asks


@dataclass(frozen=True)
class ReplicaLoad:
    """A replica's scheduler and KV cache after a step (the server's metrics)."""

    running: int
    waiting: int
    num_free: int
    prefix_queries: int
    prefix_hits: int


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
                core.add(msg[1])
            else:
                core.abort(msg[1])
        if not core.has_unfinished():
            continue
        core.last_scheduled = []
        try:
            stepped = core.step()
        except RankDiedError as exc:
            conn.send(("dead", str(exc)))
            return
        except Exception as exc:  # noqa: BLE001 - fail the step's requests, not the replica
            ids = [s.request_id for s in core.last_scheduled or list(core.requests.values())]
            for request_id in ids:
                core.abort(request_id)
            conn.send(("failed", ids, f"{type(exc).__name__}: {exc}".splitlines()[0]))
            continue
        conn.send(("step", [_update(core, s) for s in stepped], load(core)))


def _update(core, seq) -> TokenUpdate:
    reason = seq.finish_reason
    return TokenUpdate(seq.request_id, seq.token_ids[-1], reason,
                       seq.stop_string if reason else None,
                       core.output_text(seq) if reason else None,
                       seq.logprobs[-1] if seq.params.logprobs is not None else None)


def load(core) -> ReplicaLoad:
    s, b = core.scheduler, core.blocks
    return ReplicaLoad(len(s.running), len(s.waiting), b.num_free, b.prefix_queries,
                       b.prefix_hits)
