"""Shared cores: offline tokens/s of this engine, transformers' generate() and
(where installed) upstream vLLM's CPU engine while another process keeps one of
the two CPUs busy (a spin loop pinned to it with sched_setaffinity, as `taskset
-c 1 python -c 'while True: pass'` would). The same checkpoint, prompts and
CPUs for every engine, each in its own process, loaded while the spinner
already runs (as a server started on a busy machine would be); the engines
take turns, the fastest of --repeats runs counts.

    python benchmarks/contention.py [--model-size small] [--dtype float32] [--check] [--record]

Targets (--check): >= 1.0x transformers and >= 1.0x vLLM at 16 requests and at
1, under the same contention (issue: shared cores). docs/shared-cores.md says
what the engine does about it.
"""
from __future__ import annotations

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [os.path.dirname(_HERE)] + [p for p in sys.path if os.path.abspath(p or ".") != _HERE]

import argparse  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402

from benchmarks.common import Targets, add_check_argument, cpu_model  # noqa: E402
from benchmarks.models import MODEL_SIZES, make_model  # noqa: E402
from benchmarks.peer import PEER_PYTHON, peer_env  # noqa: E402
from benchmarks.throughput import Side  # noqa: E402

BATCHES = (16, 1)
TARGET = 1.0
SPIN = "import os, sys\nos.sched_setaffinity(0, {int(sys.argv[1])})\nwhile True: pass\n"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model-size", default="small", choices=sorted(MODEL_SIZES))
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--busy-cpu", type=int, default=1, help="the CPU the spinner keeps busy")
    p.add_argument("--threads", default="0-1", help="CPUs every engine runs on (default 0-1)")
    p.add_argument("--new", type=int, default=64)
    p.add_argument("--repeats", type=int, default=2)
    add_check_argument(p)
    a = p.parse_args()
    env = peer_env(a.threads)
    peers = ["transformers"] + (["vllm"] if PEER_PYTHON.exists() else [])
    if "vllm" not in peers:
        print("vLLM peer not installed (bash ci/setup-peer.sh): comparing with transformers only")
    spinner = subprocess.Popen([sys.executable, "-c", SPIN, str(a.busy_cpu)])
    sides: dict[str, Side] = {}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            model = str(make_model(Path(tmp) / "m", a.model_size))
            args = ["--model", model, "--dtype", a.dtype, "--new", str(a.new)]
            repo_env = {**env, "PYTHONPATH": os.path.dirname(_HERE)}
            sides["engine"] = Side(sys.executable, "engine", args, repo_env, Path(tmp) / "e.log")
            for peer in peers:
                python = str(PEER_PYTHON) if peer == "vllm" else sys.executable
                sides[peer] = Side(python, peer, args, env, Path(tmp) / f"{peer}.log")
            for batch in BATCHES:
                for _ in range(a.repeats):
                    for side in sides.values():
                        side.run(batch)
    finally:
        spinner.kill()
        for side in sides.values():
            side.close()
    rate = {k: {b: s.best[b]["tokens"] / s.best[b]["seconds"] for b in BATCHES}
            for k, s in sides.items()}
    print(f"CPU {cpu_model()}; engines on CPUs {a.threads}, CPU {a.busy_cpu} kept busy by a "
          f"spin loop; random Llama '{a.model_size}', {a.dtype}, {a.new} new tokens")
    print(f"{'requests':>8} {'engine tok/s':>13}" + "".join(f" {p + ' tok/s':>19} {'ratio':>6}"
                                                          for p in peers))
    targets = Targets()
    for batch in BATCHES:
        e = rate["engine"][batch]
        print(f"{batch:>8} {e:>13.1f}" + "".join(
            f" {rate[p][batch]:>19.1f} {e / rate[p][batch]:>5.2f}x" for p in peers))
        for peer in peers:
            targets.record(f"{batch} requests, one CPU busy: tok/s vs {peer}",
                           e / rate[peer][batch], TARGET)
    name = f"contention --model-size {a.model_size} --dtype {a.dtype}"
    return targets.finish(a.check, record_as=name if a.record else None)


if __name__ == "__main__":
    sys.exit(main())
