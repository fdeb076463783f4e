"""NUMA memory binding: done where the system allows it; where a container
refuses the system calls, one warning and the engine runs on."""
from __future__ import annotations

import logging

import pytest

from engine.platforms import cpu_binding, cpu_numa


def test_bind_memory_on_this_machine():
    reason = cpu_numa.bind_memory(0)
    if reason and "not permitted" in reason:
        pytest.skip(f"this process may not set a memory policy ({reason})")
    assert reason is None
    assert cpu_numa.bind_memory(5000) == "NUMA node 5000 is out of range"


def test_auto_plan_names_the_node_only_for_the_real_sysfs(tmp_path):
    every = set(range(64))
    assert isinstance(cpu_binding.plan(0, 1, {}, None).node, int)
    (tmp_path / "sys/devices/system/cpu").mkdir(parents=True)
    (tmp_path / "sys/devices/system/cpu/online").write_text("0-3\n")
    fake = cpu_binding.plan(0, 1, {"VLLM_SYSFS_ROOT": str(tmp_path)}, every)
    assert fake.cpus == (0, 1, 2, 3) and fake.node is None
    assert cpu_binding.plan(0, 1, {"VLLM_CPU_OMP_THREADS_BIND": "nobind"}, every).node is None


def test_refused_numa_calls_cost_one_warning(monkeypatch, caplog):
    calls = []

    def refused(node):
        calls.append(node)
        return "get_mempolicy: Operation not permitted"

    monkeypatch.setattr(cpu_numa, "bind_memory", refused)
    monkeypatch.setattr(cpu_binding, "_numa_warned", False)
    monkeypatch.setattr(cpu_binding, "_applied", None)
    binding = cpu_binding.Binding(None, "test", node=0)
    with caplog.at_level(logging.WARNING, logger="engine"):
        cpu_binding.apply(binding)
        cpu_binding.apply(binding)  # a second engine in the process: no second warning
    warnings = [r.getMessage() for r in caplog.records if "NUMA" in r.getMessage()]
    assert calls == [0, 0]
    assert len(warnings) == 1
    assert "get_mempolicy: Operation not permitted" in warnings[0]
    assert "--cap-add SYS_NICE" in warnings[0]
