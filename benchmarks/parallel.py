"""Tensor parallel on this machine: all-reduce latency between two ranks
(one CPU each), gloo against shared memory (engine.distributed.shm_all_reduce),
for one hidden state up to a batch of them, and decode
tok/s of -tp 2 (one core per rank) against one rank with two threads, at 1
and 16 requests, on the small random Llama of benchmarks/models.py.

    python benchmarks/parallel.py [--size small] [--output-len 64] [--check] [--record]

On a 2-core machine the point is overhead, not speed-up: target (--check)
-tp 2 >= 0.85x one rank at 16 requests. Other processes on the machine make
every figure noisy."""
from __future__ import annotations

import os
import sys

# Run as a script, this folder would come first on the import path, and its
# bisect.py would shadow the standard library's; the repository root goes there.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [os.path.dirname(_HERE)] + [p for p in sys.path if os.path.abspath(p or ".") != _HERE]

import argparse  # noqa: E402
import json  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402

from benchmarks.common import Targets, add_check_argument  # noqa: E402
from benchmarks.models import MODEL_SIZES, make_model, prompt_ids  # noqa: E402

REPO = Path(_HERE).parent
TP2_TARGET = 0.85  # -tp 2 vs one rank at 16 requests

ALLREDUCE = """
import os, sys, time, torch, torch.distributed as td
from engine.distributed.shm_all_reduce import ShmAllReduce
rank, port, sizes = int(sys.argv[1]), sys.argv[2], [int(s) for s in sys.argv[3].split(",")]
os.sched_setaffinity(0, {rank}); torch.set_num_threads(1)
td.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
path = f"/dev/shm/vllm-engine-bench-{port}"
if rank == 0: shm = ShmAllReduce(path, 0, 2, 60, True)
td.barrier()
if rank: shm = ShmAllReduce(path, 1, 2, 60, False)
td.barrier()
if rank == 0: os.unlink(path)
def timed(reduce, x, reps):
    for _ in range(20): reduce(x)
    td.barrier(); t0 = time.perf_counter()
    for _ in range(reps): reduce(x)
    return (time.perf_counter() - t0) / reps
for n in sizes:
    x = torch.ones(n)
    reps = 500 if n < 1 << 16 else 50
    gloo, mem = timed(td.all_reduce, x, reps), timed(shm.all_reduce, x, reps)
    if rank == 0: print(n, gloo, mem, flush=True)
"""

DECODE = """
import json, sys, time
from engine import LLM, SamplingParams
path, tp, n, out_len, prompts = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), json.loads(sys.argv[5])
llm = LLM(path, "float32", tensor_parallel_size=tp, max_model_len=1024)
p = SamplingParams(temperature=0, max_tokens=out_len, ignore_eos=True)
llm.generate(prompts[:1], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
t0 = time.perf_counter(); outs = llm.generate(prompts[:n], p); dt = time.perf_counter() - t0
print(sum(len(o.outputs[0].token_ids) for o in outs) / dt)
"""


def allreduce(hidden: int) -> list[tuple[int, float, float]]:
    """(floats, gloo seconds, shared-memory seconds) per size."""
    from engine.distributed.parallel_state import free_port

    port, sizes = str(free_port()), f"{hidden},{hidden * 16},{hidden * 256}"
    procs = [subprocess.Popen([sys.executable, "-c", ALLREDUCE, str(r), port, sizes],
                              stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(REPO)}) for r in (0, 1)]
    out = procs[0].communicate(timeout=300)[0]
    procs[1].wait(timeout=60)
    return [(int(a), float(b), float(c))
            for a, b, c in (line.split() for line in out.split("\n") if line)]


def decode(path: Path, tp: int, n: int, out_len: int) -> float:
    env = {**os.environ, "PYTHONPATH": str(REPO), "VLLM_CPU_KVCACHE_SPACE": "1",
           "VLLM_CPU_OMP_THREADS_BIND": "0|1" if tp == 2 else "0-1"}
    out = subprocess.run([sys.executable, "-c", DECODE, str(path), str(tp), str(n), str(out_len),
                          json.dumps(prompt_ids(16))], env=env, capture_output=True, text=True,
                         timeout=900)
    if out.returncode:
        raise SystemExit(out.stderr[-2000:])
    return float(out.stdout.split()[-1])


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", default="small", choices=sorted(MODEL_SIZES))
    ap.add_argument("--output-len", type=int, default=64)
    add_check_argument(ap)
    args = ap.parse_args()
    targets = Targets()
    hidden = MODEL_SIZES[args.size]["hidden"]
    print(f"all-reduce, 2 ranks (one CPU each), float32 (hidden {hidden}): gloo on 127.0.0.1 "
          "vs shared memory")
    for n, gloo, shm in allreduce(hidden):
        print(f"  {n:>9} floats ({n // hidden:>3} tokens): gloo {gloo * 1e6:9.1f} us "
              f"{n * 4 / gloo / 1e9:6.2f} GB/s | shm {shm * 1e6:9.1f} us "
              f"{n * 4 / shm / 1e9:6.2f} GB/s = {gloo / shm:5.1f}x")
        targets.record(f"all-reduce of {n} floats: shared memory vs gloo", gloo / shm, 1.0)
    with tempfile.TemporaryDirectory() as tmp:
        path = make_model(Path(tmp) / args.size, args.size)
        for n in (1, 16):
            one = decode(path, 1, n, args.output_len)
            two = decode(path, 2, n, args.output_len)
            print(f"decode {n:>2} request(s): -tp 1 (2 threads) {one:7.1f} tok/s, -tp 2 "
                  f"(1 core/rank) {two:7.1f} tok/s = {two / one:.2f}x")
            if n == 16:
                targets.record("decode 16 requests: -tp 2 vs one rank", two / one, TP2_TARGET)
    return targets.finish(args.check, record_as=f"parallel --size {args.size}"
                          if args.record else None)


if __name__ == "__main__":
    sys.exit(main())
