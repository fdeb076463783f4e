"""distributed_executor_backend="ray": -tp 2 on a local two-node Ray cluster
(two `ray start` processes on this machine, one CPU each, started and stopped
here) gives one rank's greedy ids."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
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
    """Two Ray nodes of one CPU each; each `ray start --block` is stopped
    (SIGTERM, which takes its node's processes down) whatever the test did;
    never `ray stop`, which would stop every Ray on the machine."""
    port = free_port()
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    def common():  # two nodes on one machine: every port of their own (defaults would collide)
        # (those left to the raylet are chosen by it, race-free)
        ports = ["--metrics-export-port", "--dashboard-agent-listen-port",
                 "--dashboard-agent-grpc-port", "--runtime-env-agent-port"]
        return ["--num-cpus", "1", "--block", "--disable-usage-stats",
                *[arg for flag in ports for arg in (flag, str(free_port()))]]

    nodes = [subprocess.Popen([str(RAY), "start", "--head", "--port", str(port),
                               "--include-dashboard=false",
                               *common()], env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, start_new_session=True)]
    try:
        deadline = time.monotonic() + 120
        while True:  # the second node's ports are chosen once the head holds all of its own
            assert nodes[0].poll() is None and time.monotonic() < deadline, "ray head did not start"
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.5)
        time.sleep(5)
        nodes.append(subprocess.Popen([str(RAY), "start", "--address", f"127.0.0.1:{port}",
                                       *common()], env=env,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                      start_new_session=True))
        yield f"127.0.0.1:{port}"
    finally:
        for node in reversed(nodes):
            if node.poll() is None:
                os.killpg(node.pid, signal.SIGTERM)
        for node in nodes:
            try:
                node.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(node.pid, signal.SIGKILL)
                node.wait()


@pytest.mark.slow
def test_tp2_on_a_two_node_ray_cluster_equals_one_rank(ray_cluster, tmp_path):
    model = make_checkpoint(tmp_path / "m", "llama", heads=4, kv_heads=2)
    env = {**os.environ, "PYTHONPATH": str(REPO), "VLLM_CPU_OMP_THREADS_BIND": "0"}
    one = _ids(model, 1, "", env)
    two = _ids(model, 2, "ray", {**env, "RAY_ADDRESS": ray_cluster})
    assert one and one[0] and two == one
