"""distributed_executor_backend="ray": -tp 2 on a local two-node Ray
cluster (two `ray start` processes on this machine, one CPU each, started
and stopped here) puts one rank on each node and gives one rank's greedy ids.

The nodes stay on the loopback: Ray turns 127.0.0.1 (and localhost) into the
machine's outward address, but not its IPv4-mapped form ::ffff:127.0.0.1,
which still connects over 127.0.0.1. Every port a node opens is chosen here,
distinct per node (two nodes on one machine otherwise collide on Ray's
default ports, the dashboard's 8265 among them)."""
from __future__ import annotations

import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import make_checkpoint

pytest.importorskip("ray", reason="ray is a dev requirement (requirements/ray.txt)")

REPO = Path(__file__).resolve().parents[2]
RAY = Path(sys.executable).parent / "ray"
PROMPTS = [[1, 5, 6, 7], [1, 9, 10, 11, 12, 13]]
LOOPBACK = "::ffff:127.0.0.1"
SCRIPT = """
import json, logging, sys
from engine import LLM, SamplingParams
logging.basicConfig(level=logging.INFO, format="%(message)s")
llm = LLM(sys.argv[1], "float32", tensor_parallel_size=int(sys.argv[2]), num_kv_blocks=16,
          max_model_len=256, distributed_executor_backend=sys.argv[3] or None)
outs = llm.generate(json.loads(sys.argv[4]), SamplingParams(temperature=0, max_tokens=8,
                                                            ignore_eos=True))
print(json.dumps([o.outputs[0].token_ids for o in outs]))
"""


def _run(model: Path, tp: int, backend: str, env: dict) -> subprocess.CompletedProcess:
    out = subprocess.run([sys.executable, "-c", SCRIPT, str(model), str(tp), backend,
                          json.dumps(PROMPTS)], env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return out


def _ids(out: subprocess.CompletedProcess) -> list:
    return json.loads(out.stdout.strip().splitlines()[-1])


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _worker_ports(taken: set[int]) -> tuple[int, int]:
    """100 ports for a node's Ray workers, below the kernel's ephemeral range
    (where _free_ports' picks fall) and free now."""
    while True:
        low = random.randrange(10000, 32000, 100)
        if not taken & set(range(low, low + 100)) and all(_can_bind(p) for p in
                                                          range(low, low + 100)):
            taken.update(range(low, low + 100))
            return low, low + 99


def _can_bind(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _node_args(taken: set[int]) -> list[str]:
    ports = _free_ports(6)
    low, high = _worker_ports(taken)
    return ["--node-ip-address", LOOPBACK, "--num-cpus", "1", "--block",
            "--disable-usage-stats",
            "--node-manager-port", str(ports[0]), "--object-manager-port", str(ports[1]),
            "--runtime-env-agent-port", str(ports[2]), "--metrics-export-port", str(ports[3]),
            "--dashboard-agent-listen-port", str(ports[4]),
            "--dashboard-agent-grpc-port", str(ports[5]),
            "--min-worker-port", str(low), "--max-worker-port", str(high)]


def _ray(*args: str, env: dict, log: Path) -> subprocess.Popen:
    return subprocess.Popen([str(RAY), "start", *args], env=env, stdout=open(log, "w"),
                            stderr=subprocess.STDOUT, start_new_session=True)


def _wait_for_nodes(address: str, n: int, env: dict, procs: list, logs: list) -> None:
    deadline = time.monotonic() + 120
    while True:
        for proc, log in zip(procs, logs):
            assert proc.poll() is None, f"a ray node exited:\n{log.read_text()[-3000:]}"
        out = subprocess.run([str(RAY), "status", "--address", address], env=env,
                             capture_output=True, text=True, timeout=60)
        if len(re.findall(r"^ *1 node_", out.stdout, re.M)) == n:
            return
        assert time.monotonic() < deadline, out.stdout + out.stderr
        time.sleep(1)


@pytest.fixture
def ray_cluster(tmp_path):
    """A head node and a worker node of one CPU each on this machine. Stopped
    whatever the test did by SIGTERM to each `ray start --block` process
    group, which takes that node's processes down: `ray stop --force` would
    stop every Ray on the machine, other users' too."""
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    port, dashboard = _free_ports(2)
    address = f"[{LOOPBACK}]:{port}"
    taken: set[int] = set()
    logs = [tmp_path / "ray-head.log", tmp_path / "ray-worker.log"]
    procs = [_ray("--head", "--port", str(port), "--include-dashboard=false",
                  "--dashboard-port", str(dashboard), *_node_args(taken), env=env, log=logs[0])]
    try:
        _wait_for_nodes(address, 1, env, procs, logs[:1])
        procs.append(_ray("--address", address, *_node_args(taken), env=env, log=logs[1]))
        _wait_for_nodes(address, 2, env, procs, logs)
        yield address
    finally:
        for proc in reversed(procs):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in reversed(procs):
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


@pytest.mark.slow
def test_tp2_on_a_two_node_ray_cluster_equals_one_rank(ray_cluster, tmp_path):
    model = make_checkpoint(tmp_path / "m", "llama", heads=4, kv_heads=2)
    env = {**os.environ, "PYTHONPATH": str(REPO), "VLLM_CPU_OMP_THREADS_BIND": "0"}
    one = _ids(_run(model, 1, "", env))
    two = _run(model, 2, "ray", {**env, "RAY_ADDRESS": ray_cluster})
    assert one and one[0] and _ids(two) == one
    placed = re.search(r"tensor parallel: 2 ranks on Ray .*, on nodes (\S+) (\S+)", two.stderr)
    assert placed, two.stderr[-3000:]
    assert placed[1] != placed[2]  # one rank on each node
