"""Tensor parallel on a Ray cluster (distributed_executor_backend="ray"): one
Ray actor per rank, each holding one CPU of a placement group spread over
the cluster's nodes ($RAY_ADDRESS, else the cluster Ray finds or starts on
this machine). The ranks meet in a gloo group on rank 0's node; the driver
(this process) schedules, sends every rank the step's inputs and samples
from rank 0's gathered logits. A rank whose actor dies is named in one
line (RankDiedError)."""
from __future__ import annotations

import logging
from typing import Any

import torch

from engine import envs
from engine.core.kv_cache_manager import BlockManager
from engine.core.sequence import Sequence
from engine.distributed.parallel_state import RankDiedError, raise_if_dead
from engine.engine_args import EngineConfig
from engine.worker.input_batch import InputBatch
from engine.worker.model_runner import ModelRunner, prepare_inputs, sample_step

logger = logging.getLogger("engine")

PLACEMENT_TIMEOUT_S = 60


class RankActor:
    """One rank, in a Ray worker process."""

    def __init__(self, rank: int, config: EngineConfig):
        import torch

        torch.set_num_threads(1)  # the one CPU Ray gave this actor
        self.rank, self.config = rank, config
        self.runner: ModelRunner | None = None  # load() builds it

    def address(self) -> tuple[str, int]:
        import ray

        from engine.distributed.parallel_state import free_port

        ip = ray.util.get_node_ip_address()
        # a node named by its IPv4-mapped address (::ffff:127.0.0.1, how a local
        # two-node cluster stays on the loopback) meets on the IPv4 one
        ip = ip.removeprefix("::ffff:")
        return ip, free_port(ip)

    def node_id(self) -> str:
        import ray

        return ray.get_runtime_context().get_node_id()

    def load(self, dist) -> None:
        from engine.distributed import parallel_state
        from engine.worker.cpu_worker import build_runner

        parallel_state.init(self.rank, dist)
        self.runner = build_runner(self.config, BlockManager(self.config.num_blocks,
                                                             self.config.block_size))

    def join(self, dist) -> None:
        from engine.distributed import parallel_state

        parallel_state.join(self.rank, dist)

    def execute(self, inputs):
        logits = self.runner.execute(inputs)
        return logits if self.rank == 0 else None


class RayExecutor:
    def __init__(self, config: EngineConfig, blocks: BlockManager):
        import ray
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        from engine.distributed.parallel_state import DistInit

        world = config.world_size
        self.blocks = blocks
        self.input_batch = InputBatch(blocks.block_size, torch.device("cpu"))
        self.dead: str | None = None
        self.eos_token_ids = config.model.eos_token_ids
        ray.init(address=envs.ray_address(), ignore_reinit_error=True, log_to_driver=False)
        self.pg = placement_group([{"CPU": 1}] * world, strategy="SPREAD")
        ready, _ = ray.wait([self.pg.ready()], timeout=PLACEMENT_TIMEOUT_S)
        if not ready:
            ray.util.remove_placement_group(self.pg)
            raise ValueError(f"the Ray cluster has no room for {world} ranks of one CPU each "
                             f"in {PLACEMENT_TIMEOUT_S} s (see `ray status`)")
        actor = ray.remote(num_cpus=1)(RankActor)
        # Any: Ray types an actor's methods' .remote only where @ray.method decorates
        # them, and RankActor's module must not import ray (an optional dependency)
        self.actors: list[Any] = [
            actor.options(scheduling_strategy=PlacementGroupSchedulingStrategy(
                self.pg, placement_group_bundle_index=rank)).remote(rank, config)
            for rank in range(world)]
        nodes = self._get([a.node_id.remote() for a in self.actors])
        host, port = self._get([self.actors[0].address.remote()])[0]
        dist = DistInit(host, port, world, config.pipeline_parallel_size)
        self._get([a.load.remote(dist) for a in self.actors])
        self._get([a.join.remote(dist) for a in self.actors])
        logger.info("tensor parallel: %d ranks on Ray (gloo on %s:%d), on nodes %s", world, host,
                    port, " ".join(n[:12] for n in nodes))

    def _get(self, refs: list):
        import ray

        try:
            return ray.get(refs, timeout=600)
        except ray.exceptions.RayActorError as exc:
            rank = next((r for r, a in enumerate(self.actors)
                         if getattr(exc, "actor_id", None) == a._actor_id.hex()), None)
            self.dead = f"tensor-parallel rank {rank if rank is not None else '?'} died " \
                        "(its Ray actor is gone)"
            raise RankDiedError(self.dead) from None
        except ray.exceptions.RayTaskError as exc:
            raise RankDiedError(f"tensor parallel step failed on Ray: "
                                f"{str(exc).splitlines()[0]}") from None

    def check_health(self) -> None:
        raise_if_dead(self.dead)

    def execute_model(self, seqs: list[Sequence], is_prefill: bool,
                      bitmask=None) -> list[int]:
        self.check_health()
        inputs = prepare_inputs(self.blocks, torch.device("cpu"), seqs, is_prefill,
                                self.input_batch)
        logits = self._get([a.execute.remote(inputs) for a in self.actors])[0]
        return sample_step(logits, seqs, self.eos_token_ids, bitmask)

    def shutdown(self) -> None:
        import ray

        for a in self.actors:
            ray.kill(a)
        ray.util.remove_placement_group(self.pg)
