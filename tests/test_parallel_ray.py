"""distributed_executor_backend="ray": -tp 2 on a local Ray cluster (started
and stopped here; one node of two CPUs, each rank an actor of one CPU) gives
one rank's greedy ids."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from engine.distributed.parallel_state import free_port
from helpers import make_checkpoint

pytest.importorskip("ray", reason="ray is a dev requirement (requirements/ray.txt)")

REPO = Path(__file__).resolve().parent.parent
RAY = Path(sys.executable).parent / "ray"
PROMPTS = [[1, 5, 6, 7], [1, 9, 10, 11, 12, 13]]
SCRIPT = """
import json, sys
from engine import LLM, SamplingParams
llm = LLM(sys.argv[1], "float32", tensor_parallel_size=int(sys.argv[2]), num_kv_blocks=16,
          max_model_len=256, distributed_executor_backend=sys.argv[3] or None)
outs = llm.generate(json.loads(sys.argv[4]), SamplingParams(temperature=0, max_tokens=8,
                                                            ignore_eos=True))
print(json.dumps([o.outputs[0].token_ids for o in outs]))
"""


def _ids(model: Path, tp: int, backend: str, env: dict) -> list:
    out = subprocess.run([sys.executable, "-c", SCRIPT, str(model), str(tp), backend,
                          json.dumps(PROMPTS)], env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.fixture
def ray_cluster(tmp_path):
    """A one-node Ray cluster of two CPUs (a second `ray start` node on the same
    machine crashes its raylet on a port collision: see docs/parallel.md); the
    `ray start --block` process is stopped (SIGTERM, which takes its node's
    processes down) whatever the test did; never `ray stop`, which would stop
    every Ray on the machine."""
    port = free_port()
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    node = subprocess.Popen([str(RAY), "start", "--head", "--port", str(port), "--num-cpus", "2",
                             "--include-dashboard=false", "--block", "--disable-usage-stats"],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        yield f"127.0.0.1:{port}"
    finally:
        if node.poll() is None:
            os.killpg(node.pid, signal.SIGTERM)
        try:
            node.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(node.pid, signal.SIGKILL)
            node.wait()


@pytest.mark.slow
def test_tp2_on_a_ray_cluster_equals_one_rank(ray_cluster, tmp_path):
    model = make_checkpoint(tmp_path / "m", "llama", heads=4, kv_heads=2)
    env = {**os.environ, "PYTHONPATH": str(REPO), "VLLM_CPU_OMP_THREADS_BIND": "0"}
    one = _ids(model, 1, "", env)
    two = _ids(model, 2, "ray", {**env, "RAY_ADDRESS": ray_cluster})
    assert one and one[0] and two == one
