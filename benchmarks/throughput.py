"""Offline generation throughput: this engine against transformers' generate()
(or, with --peer vllm, upstream vLLM's CPU engine), same checkpoint, same
prompts, same run; each engine in its own process so that start-up time and
peak memory (the summed RSS of its process tree, sampled) are its own. Also the
roofline: the tokens/s that this machine's measured memory bandwidth and matmul
speed allow.

    python benchmarks/throughput.py [--dtype float32|bfloat16] [--model-size smollm|small|large|tiny]
    python benchmarks/throughput.py --peer vllm [--model-size small|large]   # bash ci/setup-peer.sh first

Targets: at 16 concurrent requests of 128 new tokens, at least 2x the
transformers tokens/s and 1.5x vLLM's; at one request, not slower than either,
and the weights streamed at >= 90% of the machine's read bandwidth (measured
here: the sum of a 1 GiB tensor). Greedy, EOS ignored; threads bound to CPUs
0-1 for every engine. --check exits 1 on a missed target.
"""
from __future__ import annotations

import os
import sys

# Run as a script, this folder would come first on the import path, and its
# bisect.py would shadow the standard library's; the repository root goes there.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [os.path.dirname(_HERE)] + [p for p in sys.path if os.path.abspath(p or ".") != _HERE]

import argparse
import json
import subprocess
import tempfile
import time
from pathlib import Path

from benchmarks.common import Targets, run_with_peak_rss
from benchmarks.models import MAX_POS, MODEL_SIZES, make_model, num_params, prompt_ids

BATCHES = ((16, 2.0, 1.5), (1, 1.0, 1.0))  # (requests, target vs transformers, vs vllm)
BANDWIDTH_TARGET = 0.9  # at one request: weight bytes per second / read bandwidth


def child(kind: str, model: str, dtype: str, batch: int, prompt_len: int, new: int,
          repeats: int) -> None:
    """Runs in its own process (for vllm: the peer's Python, without our engine);
    the fastest of `repeats` timed runs (this machine's speed drifts by tens of
    percent over minutes, shared as it is)."""
    prompts = prompt_ids(batch, prompt_len - 1)
    t_start = time.perf_counter()
    if kind == "engine":
        from engine import LLM, SamplingParams

        llm = LLM(model=model, dtype=dtype, max_model_len=MAX_POS)
        startup = time.perf_counter() - t_start
        params = SamplingParams(temperature=0, max_tokens=new, ignore_eos=True)
        llm.generate(prompt_token_ids=prompts[:1],
                     sampling_params=SamplingParams(temperature=0, max_tokens=4))
        dt = float("inf")
        for _ in range(repeats):
            t0 = time.perf_counter()
            outs = llm.generate(prompt_token_ids=prompts, sampling_params=params)
            dt = min(dt, time.perf_counter() - t0)
        ids = [o.outputs[0].token_ids for o in outs]
    elif kind == "vllm":
        from vllm import LLM, SamplingParams

        llm = LLM(model=model, dtype=dtype, max_model_len=MAX_POS, seed=0)
        startup = time.perf_counter() - t_start
        inputs = [{"prompt_token_ids": p} for p in prompts]
        llm.generate(inputs[:1], SamplingParams(temperature=0, max_tokens=4), use_tqdm=False)
        dt = float("inf")
        for _ in range(repeats):
            t0 = time.perf_counter()
            outs = llm.generate(inputs, SamplingParams(temperature=0, max_tokens=new,
                                                       ignore_eos=True), use_tqdm=False)
            dt = min(dt, time.perf_counter() - t0)
        ids = [list(o.outputs[0].token_ids) for o in outs]
    else:
        import torch
        import transformers

        m = transformers.AutoModelForCausalLM.from_pretrained(
            model, dtype=getattr(torch, dtype)).eval()
        startup = time.perf_counter() - t_start
        kw = dict(do_sample=False, eos_token_id=None, pad_token_id=0)
        x = torch.tensor(prompts)
        with torch.inference_mode():
            m.generate(x[:1], max_new_tokens=4, min_new_tokens=4, **kw)
            dt = float("inf")
            for _ in range(repeats):
                t0 = time.perf_counter()
                out = m.generate(x, max_new_tokens=new, min_new_tokens=new, **kw)
                dt = min(dt, time.perf_counter() - t0)
        ids = out[:, x.shape[1]:].tolist()
    n = sum(len(i) for i in ids)
    print("RESULT " + json.dumps({"tokens": n, "seconds": dt,
                                  "startup": startup, "ids": ids}))


def roofline_child(dtype: str) -> None:
    """This machine's read bandwidth (the sum of 1 GiB) and matmul speed."""
    import torch

    dt = getattr(torch, dtype)
    src = torch.ones(256 << 20, dtype=torch.float32)  # 1 GiB
    best = min(_timed(lambda: src.sum()) for _ in range(5))
    bw = src.numel() * 4 / best
    a = torch.randn(2048, 2048, dtype=dt)
    b = torch.randn(2048, 2048, dtype=dt)
    flops = 2 * 2048 ** 3 / min(_timed(lambda: a @ b) for _ in range(5))
    print("RESULT " + json.dumps({"bandwidth": bw, "flops": flops}))


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def run_child(python: str, args: list[str], env) -> dict:
    """The child's RESULT, with peak_mb: its process tree's peak RSS."""
    res, peak = run_with_peak_rss([python, __file__, *args], env=env)
    results = [line for line in res.stdout.splitlines() if line.startswith("RESULT ")]
    if res.returncode != 0 or not results:
        sys.exit(f"{args[:2]} failed:\n{res.stderr[-3000:]}")
    return {**json.loads(results[-1][len("RESULT "):]), "peak_mb": peak}


def roofline(params: int, itemsize: int, batch: int, machine: dict) -> float:
    """Decode tokens/s bound: each step reads every weight once and does
    2 flops per weight per sequence (attention over 160 tokens is negligible)."""
    step = max(params * itemsize / machine["bandwidth"], batch * 2 * params / machine["flops"])
    return batch / step


def main() -> int:
    from benchmarks.peer import peer_env, require_peer

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--model-size", default="smollm", choices=sorted(MODEL_SIZES))
    p.add_argument("--peer", choices=["transformers", "vllm"], default="transformers")
    p.add_argument("--threads", default="0-1", help="CPUs every engine runs on (default 0-1)")
    p.add_argument("--child")
    p.add_argument("--model")
    p.add_argument("--batch", type=int)
    p.add_argument("--prompt-len", type=int, default=33)
    p.add_argument("--new", type=int, default=128)
    p.add_argument("--repeats", type=int, default=3,
                   help="timed runs per engine and batch after start-up; the fastest counts")
    p.add_argument("--check", action="store_true", help="exit 1 when a target is missed")
    a = p.parse_args()
    if a.child == "roofline":
        roofline_child(a.dtype)
        return 0
    if a.child:
        child(a.child, a.model, a.dtype, a.batch, a.prompt_len, a.new, a.repeats)
        return 0
    env = peer_env(a.threads)
    peer_python = str(require_peer()) if a.peer == "vllm" else sys.executable
    with tempfile.TemporaryDirectory() as tmp:
        model = str(make_model(Path(tmp) / "m", a.model_size))
        params = num_params(a.model_size)
        itemsize = 4 if a.dtype == "float32" else 2
        machine = run_child(sys.executable, ["--child", "roofline", "--dtype", a.dtype], env)
        print(f"checkpoint: random Llama '{a.model_size}' (~{params / 1e6:.0f}M parameters), "
              f"{a.dtype}, prompts of {a.prompt_len} tokens, {a.new} new tokens each, CPUs "
              f"{a.threads}; machine: {machine['bandwidth'] / 1e9:.1f} GB/s read, "
              f"{machine['flops'] / 1e9:.0f} GFLOP/s matmul")
        print(f"{'requests':>8} {'engine tok/s':>13} {a.peer + ' tok/s':>19} {'ratio':>7} "
              f"{'roofline':>9} {'engine':>7} {a.peer:>12} {'start-up':>17} {'peak RSS':>15}"
              f"  target")
        targets = Targets()
        for batch, target_hf, target_vllm in BATCHES:
            target = target_vllm if a.peer == "vllm" else target_hf
            args = ["--model", model, "--dtype", a.dtype, "--batch", str(batch),
                    "--prompt-len", str(a.prompt_len), "--new", str(a.new),
                    "--repeats", str(a.repeats)]
            e = run_child(sys.executable, ["--child", "engine", *args],
                          {**env, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)})
            h = run_child(peer_python, ["--child", a.peer, *args], env)
            te, th = e["tokens"] / e["seconds"], h["tokens"] / h["seconds"]
            roof = roofline(params, itemsize, batch, machine)
            same = sum(x == y for x, y in zip(e["ids"], h["ids"]))
            print(f"{batch:>8} {te:>13.1f} {th:>19.1f} {te / th:>6.2f}x {roof:>9.0f} "
                  f"{te / roof:>6.0%} {th / roof:>12.0%} "
                  f"{e['startup']:>6.1f}s/{h['startup']:>6.1f}s "
                  f"{e['peak_mb']:>6.0f}/{h['peak_mb']:>6.0f}MB  "
                  f">= {target}x {'ok' if te / th >= target else 'MISS'}; greedy ids identical "
                  f"on {same}/{batch}")
            targets.record(f"{batch} requests: tok/s vs {a.peer}", te / th, target)
            if batch == 1:
                targets.record("1 request: weight bytes/s vs read bandwidth",
                               te * params * itemsize / machine["bandwidth"], BANDWIDTH_TARGET)
    return targets.finish(a.check)


if __name__ == "__main__":
    sys.exit(main())
