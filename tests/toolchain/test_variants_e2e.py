"""The GPU variants this machine can build (cu130: compile, link, repair,
import; no GPU to run on) and the ones it cannot (rocm, xpu: a clear stop)."""
from __future__ import annotations

import re
import sys
import zipfile
from pathlib import Path

import pytest

from engine.ops import OP_NAMES
from helpers import REPO, UV, copy_source_tree, make_venv, run

pytestmark = pytest.mark.slow

# ld-linux: the dynamic loader every process has, for __tls_get_addr (the dispatcher's
# inline calls in csrc/step_graph.cpp read c10's thread-locals); auditwheel repairs it as is
ALLOWED_NEEDED = {"libtorch.so", "libtorch_cpu.so", "libtorch_cuda.so", "libc10.so",
                  "libc10_cuda.so", "libcudart.so.13", "libstdc++.so.6", "libgcc_s.so.1",
                  "libc.so.6", "libm.so.6", "ld-linux-x86-64.so.2"}


def test_cu130_wheel_compiles_links_repairs_and_registers_cuda_ops(tmp_path: Path):
    if not Path("/usr/local/cuda/bin/nvcc").exists() and not run(["which", "nvcc"], check=False).stdout:
        pytest.fail("nvcc is required to build the cu130 variant (CUDA 13.0 toolkit)")
    out = tmp_path / "wheelhouse"
    # One architecture keeps the test short; the default list is in cmake/cuda.cmake.
    run(["bash", REPO / "ci" / "build-wheel.sh", "cu130", out],
        env={"TORCH_CUDA_ARCH_LIST": "9.0", "PYTHON": sys.executable, "UV": UV}, cwd=REPO)
    (wheel,) = out.glob("*.whl")
    assert re.fullmatch(r"vllm_engine-0\.1\.dev\d+\+g[0-9a-f]{7,}(\.d\d{8})?\.cu130-cp38-abi3-"
                        r"manylinux_2_\d+_x86_64\.whl", wheel.name), wheel.name
    names = zipfile.ZipFile(wheel).namelist()
    assert not [n for n in names if re.search(r"lib(torch|c10|cudart|cuda)", n)], names
    zipfile.ZipFile(wheel).extract("engine/_C.abi3.so", tmp_path)
    dyn = run(["readelf", "-d", tmp_path / "engine" / "_C.abi3.so"]).stdout
    needed = set(re.findall(r"\(NEEDED\)\s+Shared library: \[(.+?)\]", dyn))
    assert "libtorch_cuda.so" in needed and needed <= ALLOWED_NEEDED, needed

    py = make_venv(tmp_path / "venv", str(wheel))  # torch==2.13.0 (CUDA 13.0) from PyPI
    # the installed wheel's own op list (engine.ops.OP_NAMES, checked against the
    # registrations by tests/kernels/test_ops.py), each with a CUDA kernel
    check = ("import torch, engine; print(engine.BUILD_INFO.variant, torch.version.cuda); "
             "print(*[torch._C._dispatch_has_kernel_for_dispatch_key('_C::' + op, 'CUDA') "
             "for op in engine.ops.OP_NAMES])")
    lines = run([py, "-c", check], cwd=tmp_path).stdout.splitlines()
    assert lines[0].split() == ["cu130", "13.0"]
    assert lines[1].split() == ["True"] * len(OP_NAMES)


@pytest.fixture(scope="module")
def source_copy(tmp_path_factory) -> Path:
    return copy_source_tree(tmp_path_factory.mktemp("src") / "vllm-engine")


@pytest.mark.parametrize("device,env,message", [
    ("xpu", {}, "needs Intel's SYCL compiler 'icpx'"),
    ("rocm", {}, "install ROCm (it provides the hipcc compiler)"),
])
def test_unbuildable_variants_stop_at_once(source_copy, device, env, message, tmp_path):
    res = run([UV, "build", "--wheel", "--no-build-isolation", "--python", sys.executable,
               "--out-dir", tmp_path], env={"VLLM_TARGET_DEVICE": device, "PATH": "/usr/bin:/bin",
                                            **env}, cwd=source_copy, check=False)
    assert res.returncode != 0
    assert message in res.stdout + res.stderr, (res.stdout + res.stderr)[-3000:]
    assert not list(tmp_path.glob("*.whl"))
    # stopped at configure time: nothing was compiled
    assert not list((source_copy / "build").rglob("*.o"))
