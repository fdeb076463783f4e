"""Run-time variables, thread binding, preloaded libraries and the platform
choice: the engine's view of the machine, tested on fake roots."""
from __future__ import annotations

import logging
import sys
import types
from pathlib import Path

import pytest
import torch

from engine import envs, platforms
from engine.platforms import cpu_binding, cpu_preload

# ---- run-time variables ---------------------------------------------------------


@pytest.mark.parametrize("value,gib", [("", 4), ("0", 4), ("2", 2), ("0.5", 0.5)])
def test_kvcache_space_valid(value, gib):
    assert envs.kvcache_space_bytes({"VLLM_CPU_KVCACHE_SPACE": value}) == int(gib * 2**30)


@pytest.mark.parametrize("value", ["-1", "abc", "nan", "inf"])
def test_kvcache_space_invalid(value):
    with pytest.raises(envs.EnvError, match="VLLM_CPU_KVCACHE_SPACE"):
        envs.kvcache_space_bytes({"VLLM_CPU_KVCACHE_SPACE": value})


@pytest.mark.parametrize("value,parsed", [
    ("", "auto"), ("auto", "auto"), ("nobind", "nobind"), ("0-3", [[0, 1, 2, 3]]),
    ("0,2,4-5", [[0, 2, 4, 5]]), ("0-1|2-3", [[0, 1], [2, 3]])])
def test_threads_bind_valid(value, parsed):
    assert envs.omp_threads_bind({"VLLM_CPU_OMP_THREADS_BIND": value}) == parsed


@pytest.mark.parametrize("value,message", [
    ("all", "is not a CPU list"), ("3-1", "runs backwards"), ("0,0", "names a CPU twice"),
    ("0-3|2-5", "ranks share CPUs 2-3$"), ("0-", "is not a CPU list")])
def test_threads_bind_invalid(value, message):
    with pytest.raises(envs.EnvError, match=message):
        envs.omp_threads_bind({"VLLM_CPU_OMP_THREADS_BIND": value})


@pytest.mark.parametrize("cpus,text", [
    ([], ""), ([7], "7"), ([0, 1], "0-1"), ([3, 0, 1, 2, 8, 10, 11], "0-3,8,10-11"),
    (range(2, 100), "2-99"), ([1, 3, 5], "1,3,5")])
def test_cpu_lists_are_named_as_ranges(cpus, text):
    assert envs.format_cpu_list(cpus) == text
    if text:
        assert envs.parse_cpu_list(text, "X") == sorted(cpus)


def test_reserved_cpus_and_memory_nodes():
    assert envs.num_reserved_cpus(1, {}) == 0 and envs.num_reserved_cpus(2, {}) == 1
    assert envs.num_reserved_cpus(1, {"VLLM_CPU_NUM_OF_RESERVED_CPU": "2"}) == 2
    with pytest.raises(envs.EnvError, match="whole number"):
        envs.num_reserved_cpus(1, {"VLLM_CPU_NUM_OF_RESERVED_CPU": "-1"})
    assert envs.visible_memory_nodes({"CPU_VISIBLE_MEMORY_NODES": "0,1"}) == [0, 1]
    assert envs.visible_memory_nodes({}) is None
    with pytest.raises(envs.EnvError, match="CPU_VISIBLE_MEMORY_NODES"):
        envs.visible_memory_nodes({"CPU_VISIBLE_MEMORY_NODES": "x"})
    with pytest.raises(envs.EnvError, match="VLLM_CPU_ISA='sse'"):
        envs.cpu_isa({"VLLM_CPU_ISA": "sse"})


def fake_sysfs(root: Path) -> Path:
    """2 NUMA nodes x 4 cores x 2 hyper-threads: CPUs 0-7 node 0, 8-15 node 1;
    siblings are (n, n+4) within a node."""
    def w(rel, text):
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text + "\n")

    w("sys/devices/system/cpu/online", "0-15")
    w("sys/devices/system/node/node0/cpulist", "0-7")
    w("sys/devices/system/node/node1/cpulist", "8-15")
    for base in (0, 8):
        for i in range(4):
            sib = f"{base + i},{base + i + 4}"
            w(f"sys/devices/system/cpu/cpu{base + i}/topology/thread_siblings_list", sib)
            w(f"sys/devices/system/cpu/cpu{base + i + 4}/topology/thread_siblings_list", sib)
    return root


def test_auto_binding_one_thread_per_physical_core(tmp_path):
    env = {"VLLM_SYSFS_ROOT": str(fake_sysfs(tmp_path))}
    every = set(range(16))
    assert cpu_binding.plan(0, 1, env, every).cpus == (0, 1, 2, 3)
    two = cpu_binding.plan(1, 2, env, every)  # 2 ranks: 1 reserved CPU each by default
    assert two.cpus == (8, 9, 10) and "1 reserved" in two.description
    assert cpu_binding.plan(0, 1, {**env, "CPU_VISIBLE_MEMORY_NODES": "1"}, every).cpus == (8, 9, 10, 11)
    assert cpu_binding.plan(0, 1, env, every - {1}).cpus == (0, 2, 3)  # only allowed CPUs
    with pytest.raises(envs.EnvError, match="nodes \\[5\\] that do not exist"):
        cpu_binding.plan(0, 1, {**env, "CPU_VISIBLE_MEMORY_NODES": "5"}, every)
    with pytest.raises(envs.EnvError, match="leaves no CPU"):
        cpu_binding.plan(0, 1, {**env, "VLLM_CPU_NUM_OF_RESERVED_CPU": "4"}, every)


def test_list_binding_is_validated(tmp_path):
    env = {"VLLM_SYSFS_ROOT": str(fake_sysfs(tmp_path))}
    every = set(range(16))
    assert cpu_binding.plan(1, 2, {**env, "VLLM_CPU_OMP_THREADS_BIND": "0-3|8-11"}, every).cpus == (8, 9, 10, 11)
    with pytest.raises(envs.EnvError, match="not exist: 16-17 \\(online: 0-15\\)$"):
        cpu_binding.plan(0, 1, {**env, "VLLM_CPU_OMP_THREADS_BIND": "14-17"}, every)
    with pytest.raises(envs.EnvError, match="not exist: 16-99 \\(online: 0-15\\)$"):
        cpu_binding.plan(0, 1, {**env, "VLLM_CPU_OMP_THREADS_BIND": "0-99"}, every)
    with pytest.raises(envs.EnvError, match="names CPUs not allowed to this process: 0-3 "
                       "\\(allowed: 4-5;"):
        cpu_binding.plan(0, 1, {**env, "VLLM_CPU_OMP_THREADS_BIND": "0-3"}, {4, 5})
    with pytest.raises(envs.EnvError, match="not allowed to this process: 2-7,9-15 "):
        cpu_binding.plan(0, 1, {**env, "VLLM_CPU_OMP_THREADS_BIND": "0-15"}, {0, 1, 8})
    with pytest.raises(envs.EnvError, match="rank 1 of 2 needs one"):
        cpu_binding.plan(1, 2, {**env, "VLLM_CPU_OMP_THREADS_BIND": "0-3"}, every)
    nobind = cpu_binding.plan(0, 1, {**env, "VLLM_CPU_OMP_THREADS_BIND": "nobind",
                                     "OMP_NUM_THREADS": "3"}, every)
    assert nobind.cpus is None and "OMP_NUM_THREADS=3" in nobind.description


def test_binding_applied_is_logged_once(caplog, monkeypatch):
    monkeypatch.setattr(cpu_binding, "_applied", None)
    allowed = sorted(__import__("os").sched_getaffinity(0))
    b = cpu_binding.Binding(tuple(allowed), "test binding")
    with caplog.at_level(logging.INFO, logger="engine"):
        cpu_binding.apply(b)
        cpu_binding.apply(b)
    assert [r.message for r in caplog.records].count("CPU thread binding: test binding") == 1


def test_preload_line(tmp_path):
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "libiomp5.so").write_text("")
    (lib / "libtcmalloc_minimal.so.4").write_text("")
    found = cpu_preload.find(dirs=[lib])
    assert cpu_preload.export_line(found, source_build=False) == \
        f"export LD_PRELOAD={lib}/libiomp5.so${{LD_PRELOAD:+:$LD_PRELOAD}}"
    assert f"{lib}/libtcmalloc_minimal.so.4" in cpu_preload.export_line(found, source_build=True)
    assert cpu_preload.export_line({}, True) is None


# ---- platforms ------------------------------------------------------------------

ZEN_CPUINFO = "vendor_id\t: AuthenticAMD\nflags\t\t: fpu sse avx2 avx512f avx512bw\n"
INTEL_CPUINFO = "vendor_id\t: GenuineIntel\nflags\t\t: fpu sse avx2 avx512f\n"


def test_zen_platform_by_the_contract(tmp_path, monkeypatch, caplog):
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc" / "cpuinfo").write_text(ZEN_CPUINFO)
    monkeypatch.setenv("VLLM_SYSFS_ROOT", str(tmp_path))
    monkeypatch.setitem(sys.modules, "zentorch", types.ModuleType("zentorch"))
    monkeypatch.setattr(platforms, "_zentorch_importable", lambda: True)
    platforms.current.cache_clear()
    try:
        with caplog.at_level(logging.INFO, logger="engine"):
            p = platforms.current()
        assert isinstance(p, platforms.ZenCpuPlatform)
        assert platforms.ZEN_LOG in caplog.text
        with caplog.at_level(logging.WARNING, logger="engine"):
            assert p.resolve_dtype(torch.float16) == torch.bfloat16
        assert ("Your device 'cpu' doesn't support torch.float16. Falling back to "
                "torch.bfloat16 for compatibility.") in caplog.text
        assert p.resolve_dtype(torch.float32) == torch.float32
    finally:
        platforms.current.cache_clear()


@pytest.mark.parametrize("device,cpuinfo,zen,expected", [
    ("cpu", ZEN_CPUINFO, False, platforms.CpuPlatform),  # no zentorch
    ("cpu", INTEL_CPUINFO, True, platforms.CpuPlatform),  # not AMD
    ("cpu", "vendor_id: AuthenticAMD\nflags: avx2\n", True, platforms.CpuPlatform),  # no avx512
    ("cuda", ZEN_CPUINFO, True, platforms.CudaPlatform),  # a CUDA wheel is never a CPU platform
    ("rocm", "", False, platforms.RocmPlatform),
    ("xpu", "", False, platforms.XpuPlatform),
    ("empty", "", False, platforms.CpuPlatform),
])
def test_platform_choice(device, cpuinfo, zen, expected):
    zen_ok = zen and platforms.is_zen_cpu(cpuinfo)
    assert type(platforms.choose_platform(device, cpuinfo, zen_ok)) is expected


def test_cpu_wheel_never_claims_cuda():
    import engine

    assert engine.BUILD_INFO.device == "cpu"
    assert platforms.current().device_type == "cpu"


def test_warns_once_when_preload_libraries_are_not_preloaded(tmp_path, monkeypatch, caplog):
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "libiomp5.so").write_text("")
    monkeypatch.setattr(cpu_preload, "search_dirs", lambda: [lib])
    monkeypatch.setattr(cpu_preload, "is_source_build", lambda: False)
    monkeypatch.delenv("LD_PRELOAD", raising=False)
    cpu_preload.warn_if_not_preloaded.cache_clear()
    try:
        with caplog.at_level(logging.WARNING, logger="engine"):
            cpu_preload.warn_if_not_preloaded()
            cpu_preload.warn_if_not_preloaded()
        warnings = [r.message for r in caplog.records if "not preloaded" in r.message]
        assert len(warnings) == 1 and f"export LD_PRELOAD={lib}/libiomp5.so" in warnings[0]
        caplog.clear()
        cpu_preload.warn_if_not_preloaded.cache_clear()
        monkeypatch.setenv("LD_PRELOAD", str(lib / "libiomp5.so"))
        with caplog.at_level(logging.WARNING, logger="engine"):
            cpu_preload.warn_if_not_preloaded()
        assert "not preloaded" not in caplog.text
    finally:
        cpu_preload.warn_if_not_preloaded.cache_clear()
