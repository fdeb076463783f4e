"""ci/gpu-check.sh and its Python part (tools.gpu_check), on the CPU: the same
checks the GPU run makes, run here on the cpu device, so they are known to
work before a GPU is at hand."""
from __future__ import annotations

import shutil

import pytest
import torch
from helpers import REPO, run

import engine
from engine import envs
from engine.ops import OP_NAMES
from tools.gpu_check import bench
from tools.gpu_check import ops as op_checks

needs_kernels = pytest.mark.skipif(not engine.BUILD_INFO.has_kernels,
                                   reason="no compiled kernels (run ci/setup-dev.sh)")


def test_every_op_has_a_check():
    assert set(OP_NAMES) <= {c.__name__ for c in op_checks.CHECKS}


@needs_kernels
def test_op_checks_pass_on_the_cpu():
    assert op_checks.run("cpu", log=lambda m: None) == []


@needs_kernels
def test_op_checks_catch_a_wrong_kernel(monkeypatch):
    # a kernel that is off by a little must be reported, by name, with both dtypes
    real = torch.ops._C.silu_and_mul

    def wrong(out, x):
        real(out, x)
        out.mul_(1.05)

    monkeypatch.setattr(op_checks.ops, "silu_and_mul", wrong)
    failures = op_checks.run("cpu", log=lambda m: None)
    assert [f.split(":")[0] for f in failures] == ["silu_and_mul [float32, cpu]",
                                                    "silu_and_mul [bfloat16, cpu]"]


@needs_kernels
def test_kernel_bench_runs_and_records_every_target():
    from benchmarks.common import Targets

    t = Targets()
    bench.run("cpu", t, small=True, log=lambda m: None)
    names = [r[0] for r in t.rows]
    assert len(names) == 8 and all("[cpu]" in n for n in names)


def test_check_bounds_setting():
    assert envs.check_bounds({}) is False
    assert envs.check_bounds({"VLLM_CHECK_BOUNDS": "1"}) is True
    with pytest.raises(envs.EnvError, match="VLLM_CHECK_BOUNDS='yes' is not valid"):
        envs.check_bounds({"VLLM_CHECK_BOUNDS": "yes"})


def test_without_a_gpu_it_stops_with_one_line(tmp_path):
    if shutil.which("nvidia-smi") and run(["nvidia-smi", "-L"], check=False).returncode == 0:
        pytest.skip("this machine has an NVIDIA GPU: run ci/gpu-check.sh itself")
    res = run(["bash", REPO / "ci" / "gpu-check.sh"], check=False)
    assert res.returncode == 1 and res.stdout == ""
    assert res.stderr.strip().splitlines() == [
        "error: no NVIDIA GPU here (nvidia-smi reports none); ci/gpu-check.sh needs a machine "
        "with one"]
