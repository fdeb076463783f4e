"""Data parallel (-dp N, data_parallel_size): N whole engine replicas, each a
process of its own (engine.executor.dp_replica) with its scheduler, KV cache and
tensor-parallel ranks, behind one front that tokenizes, checks and balances.

DPEngineCore is what EngineCore is to the offline LLM and the engine core
process (add_request, abort_requests, step, has_unfinished, check_health,
make_stats), so both drive N replicas as they drive one. A request goes
to the replica with the fewest requests in flight (upstream's load-balanced
DP client; ties to the lowest rank) and stays there. The replicas step on
their own; step() here returns once any of them has sent a step's tokens.

A replica that dies is named in one line (RankDiedError), as a
tensor-parallel rank is."""
from __future__ import annotations

import atexit
import logging
import multiprocessing as mp
import os
from collections import deque
from multiprocessing.connection import wait

import msgspec

from engine.core.engine_core import EngineCore
from engine.core.messages import EngineCoreOutputs, EngineCoreRequest, SchedulerStats
from engine.distributed.parallel_state import RankDiedError, raise_if_dead, replica_bindings
from engine.engine_args import create_engine_config
from engine.executor import dp_replica
from engine.spawn import main_not_rerun
from engine.spec_decode import metrics as spec_metrics

logger = logging.getLogger("engine")


def engine_core(model: str | os.PathLike, dtype: str = "auto", **engine_args):
    """An EngineCore, or the front of data_parallel_size replicas of one."""
    if engine_args.get("data_parallel_size", 1) == 1:
        return EngineCore(model, dtype, **engine_args)
    return DPEngineCore(model, dtype, **engine_args)


def least_loaded(in_flight: list[int]) -> int:
    """The replica with the fewest requests in flight (the first of equals)."""
    return min(range(len(in_flight)), key=in_flight.__getitem__)


class DPEngineCore:
    def __init__(self, model: str | os.PathLike, dtype: str = "auto", **engine_args):
        self.engine_config = c = create_engine_config(model, dtype, **engine_args)
        self.path, self.config, self.dtype = c.path, c.model, c.dtype
        self.max_model_len = c.max_model_len
        dp = c.data_parallel_size
        if c.bind_threads:  # every replica's ranks checked before any process starts
            for rank in range(dp):
                replica_bindings(c.world_size, dp, rank)
        self.last_scheduled: list[str] = []
        self.last_output = None  # each replica sizes its own steps
        self.owner: dict[str, int] = {}  # request id -> replica, while in flight
        self.in_flight = [0] * dp
        self.assigned = [0] * dp  # requests each replica was given, ever
        self.stats = [SchedulerStats()] * dp
        self._pending: deque = deque()  # messages read, not yet applied
        self.procs: list = []
        self.conns: list = []
        self.dead: str | None = None
        self._closing = False
        ctx = mp.get_context("spawn")
        try:
            for rank in range(dp):
                parent, child = ctx.Pipe()
                # not a daemon: a replica with -tp > 1 starts processes of its own
                proc = ctx.Process(target=dp_replica.replica_main, name=f"dp-rank-{rank}",
                                   args=(rank, str(c.path), dtype, engine_args, child))
                with main_not_rerun():
                    proc.start()
                child.close()
                self.procs.append(proc)
                self.conns.append(parent)
            self._wait_ready()
        except BaseException:
            self.shutdown()
            raise
        atexit.register(self.shutdown)  # before multiprocessing's join of its children
        logger.info("data parallel: %d engine replicas (mp)", dp)

    @property
    def requests(self) -> dict[str, int]:
        return self.owner

    def _wait_ready(self) -> None:
        for rank, (proc, conn) in enumerate(zip(self.procs, self.conns)):
            try:
                kind, value = conn.recv()
            except EOFError:
                proc.join(5)
                raise RankDiedError(f"data-parallel rank {rank} died while loading the model "
                                    f"(exit code {proc.exitcode})") from None
            if kind == "error":
                raise ValueError(f"data-parallel rank {rank}: {value}")

    # ---- requests ------------------------------------------------------------

    def add_request(self, req: EngineCoreRequest) -> None:
        if req.request_id in self.owner:
            raise ValueError(f"request id {req.request_id!r} is already running")
        rank = least_loaded(self.in_flight)
        self.owner[req.request_id] = rank
        self.in_flight[rank] += 1
        self.assigned[rank] += 1
        self._send(rank, ("add", req))

    def abort_requests(self, request_ids) -> None:
        by_rank: dict[int, list[str]] = {}
        for request_id in request_ids:
            if request_id in self.owner:
                by_rank.setdefault(self.owner[request_id], []).append(request_id)
                self._done(request_id)
        for rank, ids in by_rank.items():
            self._send(rank, ("abort", ids))

    def has_unfinished(self) -> bool:
        return bool(self.owner)

    def check_health(self) -> None:
        if self.dead is None and not self._closing:
            for rank, proc in enumerate(self.procs):
                if not proc.is_alive():
                    self.dead = f"data-parallel rank {rank} died (exit code {proc.exitcode})"
        raise_if_dead(self.dead)

    def make_stats(self, stepped: list[SchedulerStats] | None = None) -> SchedulerStats:
        """The replicas' schedulers and KV caches summed (usage: their mean),
        with each replica's: those of its steps in `stepped`, else its latest
        without a step's tokens (they were counted when it stepped)."""
        n = len(self.stats)
        stepped = stepped or []
        fresh = {s.engine_index for s in stepped}
        replicas = [msgspec.structs.replace(s, engine_index=rank, num_scheduled_tokens=0)
                    for rank, s in enumerate(self.stats) if rank not in fresh]
        return SchedulerStats(sum(s.num_running_reqs for s in self.stats),
                              sum(s.num_waiting_reqs for s in self.stats),
                              sum(s.kv_cache_usage for s in self.stats) / max(n, 1),
                              sum(s.prefix_cache_queries for s in self.stats),
                              sum(s.prefix_cache_hits for s in self.stats),
                              sum(s.num_preemptions for s in self.stats),
                              spec_metrics.summed([s.spec_decoding for s in self.stats]),
                              replicas=replicas + stepped)

    def step(self) -> EngineCoreOutputs:
        """The outputs of the replicas' steps since the last call (waits for
        one step of any replica); finished requests are gone."""
        self.last_scheduled = []
        if not self._pending:
            self._read()
        outputs: list = []
        stepped: list[SchedulerStats] = []
        while self._pending:
            rank, msg = self._pending.popleft()
            if msg[0] == "step":
                out: EngineCoreOutputs = msg[1]
                if out.scheduler_stats is not None:
                    self.stats[rank] = out.scheduler_stats
                    stepped.append(msgspec.structs.replace(out.scheduler_stats,
                                                           engine_index=rank))
                for o in out.outputs:
                    if o.request_id not in self.owner:  # aborted while the replica stepped it
                        continue
                    if o.finish_reason is not None:
                        self._done(o.request_id)
                    o.engine_index = rank  # /metrics labels the request by it
                    outputs.append(o)
            elif msg[0] == "failed":
                if outputs:  # hand these over first; the failure comes with the next call
                    self._pending.appendleft((rank, msg))
                    break
                self.last_scheduled = [i for i in msg[1] if i in self.owner]
                for request_id in self.last_scheduled:
                    self._done(request_id)
                raise RuntimeError(f"data-parallel rank {rank}: {msg[2]}")
            else:  # "dead": a part of the replica died
                self.dead = f"data-parallel rank {rank}: {msg[1]}"
                raise RankDiedError(self.dead)
        return EngineCoreOutputs(outputs, self.make_stats(stepped))

    def _read(self) -> None:
        """Wait for the replicas' next messages (or for one to die)."""
        sentinels = {p.sentinel: rank for rank, p in enumerate(self.procs)}
        while not self._pending:
            ready = wait(self.conns + list(sentinels), timeout=dp_replica.HEALTH_POLL_S)
            for rank, conn in enumerate(self.conns):
                while conn.poll(0):
                    try:
                        self._pending.append((rank, conn.recv()))
                    except (EOFError, OSError):  # closed, or reset by a killed replica
                        break
            gone = [sentinels[r] for r in ready if r in sentinels]
            if not self._pending and not gone:  # a reset pipe can come before the sentinel
                gone = [rank for rank, p in enumerate(self.procs) if not p.is_alive()]
            if not self._pending and gone:
                proc = self.procs[gone[0]]
                proc.join(2)  # its exit code
                self.dead = f"data-parallel rank {gone[0]} died (exit code {proc.exitcode})"
                raise RankDiedError(self.dead)

    def _done(self, request_id: str) -> None:
        self.in_flight[self.owner.pop(request_id)] -= 1

    def _send(self, rank: int, msg) -> None:
        try:
            self.conns[rank].send(msg)
        except OSError:
            self.check_health()
            raise RankDiedError(f"data-parallel rank {rank} went away") from None

    def shutdown(self) -> None:
        if self._closing:
            return
        self._closing = True
        for conn in self.conns:
            try:
                conn.send(None)
            except OSError:
                pass
        for proc in self.procs:
            proc.join(10)
            if proc.is_alive():
                proc.kill()
                proc.join()
