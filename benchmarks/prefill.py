"""Prefill: time to first token for one prompt of 500 / 1500 / 3000 tokens, this
engine against itself before the prefill work (the baseline, measured in the same
run: VLLM_PREFILL_ATTENTION=sdpa and VLLM_CPU_LINEAR_LARGE_M=0, i.e. torch's SDPA
and the panel kernel for every GEMM) and, where it is installed, upstream vLLM's
CPU engine; each engine in its own process, same checkpoint, same prompts.

    python benchmarks/prefill.py [--model-size small|large|smollm] [--dtype float32|bfloat16]
    python benchmarks/prefill.py --all          # small float32 and large bfloat16
    python benchmarks/prefill.py --lengths 500  # fewer lengths

Prompt tokens/s = prompt length / time to first token (generate() of one new
token). Every timed prompt is fresh (a new seed), so no prefix cache helps the
peer. Targets (--check): >= 1.5x vLLM at every length where the peer runs
(issue 31).

The floor column is the least time any engine could take on this machine: the
prompt's linear-layer flops (2 per weight per token; attention's left out) at
the matmul rate torch reaches here for that dtype (a 2048^3 matmul,
throughput.py's roofline). vLLM's time over the floor is the most any engine
could beat vLLM by: where it is under the target, the target is past this
machine's arithmetic. Threads bound to CPUs 0-1 for every engine.
"""
from __future__ import annotations

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [os.path.dirname(_HERE)] + [p for p in sys.path if os.path.abspath(p or ".") != _HERE]

import argparse  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

from benchmarks.common import Targets, Worker, add_check_argument, say_ready  # noqa: E402
from benchmarks.models import MODEL_SIZES, make_model, prompt_ids  # noqa: E402

LENGTHS = (500, 1500, 3000)
MAX_LEN = 3072
PEER_TARGET = 1.5
#: the engine as it was before the prefill kernel and the large-M GEMM path
BASELINE_ENV = {"VLLM_PREFILL_ATTENTION": "sdpa", "VLLM_CPU_LINEAR_LARGE_M": "0"}


def child(kind: str, model: str, dtype: str) -> None:
    """Loads the model, prints READY, then per stdin line "LENGTH SEED" one
    timed generate() of one token for a fresh prompt, answered with RESULT."""
    if kind == "vllm":
        from vllm import LLM, SamplingParams

        llm = LLM(model=model, dtype=dtype, max_model_len=MAX_LEN, seed=0,
                  enable_prefix_caching=False, max_num_batched_tokens=MAX_LEN)

        def run(ids):
            llm.generate([{"prompt_token_ids": ids}], SamplingParams(temperature=0, max_tokens=1),
                         use_tqdm=False)
    else:
        from engine import LLM, SamplingParams

        llm = LLM(model=model, dtype=dtype, max_model_len=MAX_LEN)

        def run(ids):
            llm.generate(prompt_token_ids=[ids],
                         sampling_params=SamplingParams(temperature=0, max_tokens=1))
    run(prompt_ids(1, 64, seed=99)[0])  # warm-up
    info = {}
    if kind != "vllm":
        from engine import ops

        info["isa"] = ops.cpu_isa()
    say_ready(info)
    for line in sys.stdin:
        length, seed = map(int, line.split())
        ids = prompt_ids(1, length - 1, seed=seed)[0]
        t0 = time.perf_counter()
        run(ids)
        print("RESULT " + json.dumps({"seconds": time.perf_counter() - t0}), flush=True)


def cpu_name() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def linear_params(size: str) -> int:
    """Weights of the linear layers one prompt token multiplies with (the LM
    head runs for the last token only: left out)."""
    s = MODEL_SIZES[size]
    h, kv = s["hidden"], s["hidden"] // s["heads"] * s["kv_heads"]
    return s["layers"] * (2 * h * h + 2 * h * kv + 3 * h * s["inter"])


def floor_seconds(size: str, tokens: int, flops: float) -> float:
    return 2 * tokens * linear_params(size) / flops


def machine_flops(dtype: str, env) -> float:
    from benchmarks.throughput import run_child

    return run_child(sys.executable, ["--child", "roofline", "--dtype", dtype], env)["flops"]


def measure(size: str, dtype: str, lengths, repeats: int, peer_python, env, tmp: Path,
            targets: Targets) -> None:
    model = str(make_model(tmp / f"{size}-{dtype}", size, max_pos=MAX_LEN + 8))
    root = str(Path(__file__).resolve().parent.parent)
    kinds = [("engine", sys.executable, {}), ("baseline", sys.executable, BASELINE_ENV)]
    if peer_python:
        kinds.append(("vllm", peer_python, {}))
    sides = {}
    try:
        for name, python, extra in kinds:
            side_env = {**env, **extra}
            if name != "vllm":
                side_env["PYTHONPATH"] = root
            sides[name] = Worker([python, __file__, "--child", name, "--model", model,
                                  "--dtype", dtype], side_env, tmp / f"{name}.log",
                                 f"{name} run", rss_interval=0.25)
        print(f"engine code path: {sides['engine'].ready.get('isa')}")
        best = {name: {} for name in sides}
        seed = 0
        for n in lengths:
            for _ in range(repeats):
                for name, side in sides.items():  # the engines take turns
                    seed += 1
                    s = side.ask(f"{n} {seed}")["seconds"]
                    best[name][n] = min(best[name].get(n, s), s)
    finally:
        for side in sides.values():
            side.close()
    flops = machine_flops(dtype, env)
    print(f"\n{size} Llama, {dtype}: prompt tokens/s (time to first token); matmul "
          f"{flops / 1e9:.0f} GFLOP/s here")
    head = f"{'tokens':>7} {'engine':>18} {'baseline':>18} {'vs base':>8}"
    print(head + (f" {'vllm':>18} {'vs vllm':>8} {'floor':>7} {'vllm/floor':>10}"
                  if "vllm" in best else ""))
    for n in lengths:
        e, b = best["engine"][n], best["baseline"][n]
        row = f"{n:>7} {n / e:>9.0f} ({e * 1e3:>5.0f}ms) {n / b:>9.0f} ({b * 1e3:>5.0f}ms) {b / e:>7.2f}x"
        if "vllm" in best:
            v, floor = best["vllm"][n], floor_seconds(size, n, flops)
            row += f" {n / v:>9.0f} ({v * 1e3:>5.0f}ms) {v / e:>7.2f}x {floor * 1e3:>5.0f}ms {v / floor:>9.2f}x"
            targets.record(f"{size} {dtype} {n} tokens: prefill vs vLLM", v / e, PEER_TARGET)
            if v / floor < PEER_TARGET:
                row += f"  (>= {PEER_TARGET}x vLLM is under the floor)"
        print(row)
    # the baseline keeps one copy of each panel layer's weight (VLLM_CPU_LINEAR_LARGE_M=0)
    print("peak RSS: " + ", ".join(f"{name} {side.rss.peak:.0f} MB" for name, side in sides.items()))


def main() -> int:
    from benchmarks.peer import PEER_PYTHON, peer_env

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model-size", default="small", choices=["tiny", "small", "large", "smollm"])
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--all", action="store_true", help="small float32 and large bfloat16")
    p.add_argument("--lengths", default=",".join(map(str, LENGTHS)))
    p.add_argument("--repeats", type=int, default=2, help="timed prompts per engine and length")
    p.add_argument("--threads", default="0-1")
    p.add_argument("--no-peer", action="store_true", help="skip vLLM even where installed")
    p.add_argument("--child")
    p.add_argument("--model")
    add_check_argument(p)
    a = p.parse_args()
    if a.child:
        child(a.child, a.model, a.dtype)
        return 0
    lengths = [int(x) for x in a.lengths.split(",")]
    if max(lengths) > MAX_LEN:
        sys.exit(f"--lengths: at most {MAX_LEN} tokens")
    peer = str(PEER_PYTHON) if PEER_PYTHON.is_file() and not a.no_peer else None
    print(f"CPU: {cpu_name()}; CPUs {a.threads}; vLLM peer: "
          f"{'yes' if peer else 'not installed (bash ci/setup-peer.sh)'}")
    runs = [("small", "float32"), ("large", "bfloat16")] if a.all else [(a.model_size, a.dtype)]
    targets = Targets()
    with tempfile.TemporaryDirectory() as tmp:
        for size, dtype in runs:
            measure(size, dtype, lengths, a.repeats, peer, peer_env(a.threads), Path(tmp),
                    targets)
    if not targets.rows:
        print("no peer: no targets")
        return 0
    return targets.finish(a.check, record_as="prefill" if a.record else None)


if __name__ == "__main__":
    sys.exit(main())
