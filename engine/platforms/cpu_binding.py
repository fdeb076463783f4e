"""Bind each rank's OpenMP threads to CPUs (VLLM_CPU_OMP_THREADS_BIND).

`auto` reads the NUMA topology from sysfs (under VLLM_SYSFS_ROOT, so tests use
a fake tree), takes one CPU per physical core of the rank's node, and keeps
VLLM_CPU_NUM_OF_RESERVED_CPU of them free; a CPU list is checked against the
CPUs that exist and are allowed to this process; `nobind` leaves
OMP_NUM_THREADS in charge. The binding applied is logged once. With `auto`
memory is also bound to the rank's node (engine.platforms.cpu_numa); where the system refuses
(a container without CAP_SYS_NICE) one warning says so and nothing else changes.
"""
from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from engine import envs
from engine.platforms import cpu_numa

logger = logging.getLogger("engine")


@dataclass(frozen=True)
class Binding:
    cpus: tuple[int, ...] | None  # None: nobind
    description: str
    node: int | None = None  # the NUMA node to keep memory on (auto only)


def _read(root: Path, rel: str) -> str | None:
    try:
        return (root / rel).read_text().strip()
    except OSError:
        return None


def online_cpus(root: Path) -> list[int]:
    text = _read(root, "sys/devices/system/cpu/online")
    if text:
        return envs.parse_cpu_list(text, "/sys/devices/system/cpu/online")
    return list(range(os.cpu_count() or 1))


def numa_nodes(root: Path) -> dict[int, list[int]]:
    base = root / "sys/devices/system/node"
    nodes = {}
    if base.is_dir():
        for d in sorted(base.glob("node[0-9]*")):
            text = _read(d, "cpulist")
            if text:
                nodes[int(d.name[4:])] = envs.parse_cpu_list(text, f"{d}/cpulist")
    return nodes or {0: online_cpus(root)}


def physical_cores(root: Path, cpus: list[int]) -> list[int]:
    """One CPU (the first hyper-thread sibling) per physical core."""
    out, seen = [], set()
    for cpu in cpus:
        text = _read(root, f"sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list")
        siblings = tuple(envs.parse_cpu_list(text, "thread_siblings_list")) if text else (cpu,)
        if siblings not in seen:
            seen.add(siblings)
            out.append(cpu)
    return out


def plan(rank: int = 0, world_size: int = 1, env: Mapping[str, str] | None = None,
         allowed: set[int] | None = None) -> Binding:
    env = os.environ if env is None else env
    root = Path(envs.sysfs_root(env))
    mode = envs.omp_threads_bind(env)
    allowed = set(os.sched_getaffinity(0)) if allowed is None else allowed
    if mode == "nobind":
        return Binding(None, f"nobind: OMP_NUM_THREADS={env.get('OMP_NUM_THREADS', 'unset')}")
    if isinstance(mode, list):
        if rank >= len(mode):
            raise envs.EnvError(f"VLLM_CPU_OMP_THREADS_BIND names {len(mode)} rank(s) but rank "
                                f"{rank} of {world_size} needs one")
        cpus = mode[rank]
        exist = set(online_cpus(root))
        cpu_list = envs.format_cpu_list
        if missing := set(cpus) - exist:
            raise envs.EnvError(f"VLLM_CPU_OMP_THREADS_BIND names CPUs that do not exist: "
                                f"{cpu_list(missing)} (online: {cpu_list(exist)})")
        if denied := set(cpus) - allowed:
            raise envs.EnvError(f"VLLM_CPU_OMP_THREADS_BIND names CPUs not allowed to this "
                                f"process: {cpu_list(denied)} (allowed: {cpu_list(allowed)}; "
                                "see taskset / cgroup cpusets)")
        return Binding(tuple(cpus), f"rank {rank}: CPUs {cpu_list(cpus)} "
                                    "(from VLLM_CPU_OMP_THREADS_BIND)")
    nodes = numa_nodes(root)
    visible = envs.visible_memory_nodes(env)
    if visible is not None:
        if unknown := sorted(set(visible) - set(nodes)):
            raise envs.EnvError(f"CPU_VISIBLE_MEMORY_NODES names nodes {unknown} that do not "
                                f"exist (nodes: {sorted(nodes)})")
        order = visible
    else:
        order = sorted(nodes)
    node = order[rank % len(order)]
    cores = [c for c in physical_cores(root, nodes[node]) if c in allowed]
    reserved = envs.num_reserved_cpus(world_size, env)
    if reserved >= len(cores):
        raise envs.EnvError(f"VLLM_CPU_NUM_OF_RESERVED_CPU={reserved} leaves no CPU for rank "
                            f"{rank} on NUMA node {node} ({len(cores)} usable cores)")
    cpus = cores[: len(cores) - reserved]
    why = f"rank {rank}: NUMA node {node}, one thread per physical core: CPUs " \
        f"{envs.format_cpu_list(cpus)}" + (f", {reserved} reserved" if reserved else "")
    return Binding(tuple(cpus), why,
                   node if root == Path("/") else None)  # a fake sysfs names no real node


def plan_all(world_size: int, env: Mapping[str, str] | None = None,
             allowed: set[int] | None = None) -> list[Binding]:
    """Every rank's binding, checked before any rank starts: a per-rank list
    whose count differs from the world size is one error naming both."""
    mode = envs.omp_threads_bind(env)
    if isinstance(mode, list) and len(mode) != world_size:
        raw = envs.omp_threads_bind_text(env)
        raise envs.EnvError(f"VLLM_CPU_OMP_THREADS_BIND={raw!r} names {len(mode)} "
                            f"CPU list(s) but there are {world_size} ranks; give one "
                            "'|'-separated list per rank")
    return [plan(rank, world_size, env, allowed) for rank in range(world_size)]


_applied: Binding | None = None
_numa_warned = False


def apply(binding: Binding) -> None:
    """Pin this process and size torch's OpenMP pool; logs the first binding."""
    import torch

    global _applied, _numa_warned
    if binding.cpus is not None:
        os.sched_setaffinity(0, binding.cpus)
        torch.set_num_threads(len(binding.cpus))
    if binding.node is not None:
        reason = cpu_numa.bind_memory(binding.node)
        if reason and not _numa_warned:
            _numa_warned = True
            logger.warning("NUMA memory binding unavailable (%s); memory is not kept on node %d, "
                           "threads are still bound. In Docker, run with --cap-add SYS_NICE "
                           "--security-opt seccomp=unconfined.", reason, binding.node)
    if _applied is None:
        logger.info("CPU thread binding: %s", binding.description)
    _applied = binding
