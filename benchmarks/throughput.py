"""Offline generation throughput: this engine against transformers' generate()
(or, with --peer vllm, upstream vLLM's CPU engine), same checkpoint, same
prompts, same run; each engine in its own process so that start-up time and
peak memory (the summed RSS of its process tree, sampled) are its own. Also the
roofline: the tokens/s that this machine's measured memory bandwidth and matmul
speed allow.

    python benchmarks/throughput.py [--dtype float32|bfloat16] [--model-size smollm|small|large|tiny]
    python benchmarks/throughput.py --peer vllm [--model-size small|large]   # bash ci/setup-peer.sh first
    python benchmarks/throughput.py --arch qwen3_moe|mixtral --peer vllm --model-size small

--arch picks the architecture (benchmarks/models.py: a Llama, or a mixture of
experts of the same size: its roofline counts the experts a step is expected
to read). Targets: at 16 concurrent requests of 128 new tokens, at least 2x the
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

from benchmarks.common import Targets, Worker, add_record_argument
from benchmarks.models import (ARCHS, MAX_POS, MODEL_SIZES, active_params, make_model,
                               num_params, prompt_ids, read_params)

BATCHES = ((16, 2.0, 1.5), (1, 1.0, 1.0))  # (requests, target vs transformers, vs vllm)
BANDWIDTH_TARGET = 0.9  # at one request: weight bytes per second / read bandwidth


def child(kind: str, model: str, dtype: str, prompt_len: int, new: int) -> None:
    """Runs in its own process (for vllm: the peer's Python, without our engine):
    loads the model, prints READY, then one timed generate() per line of stdin
    (the number of requests), each answered with a RESULT line."""
    prompts = prompt_ids(max(b for b, _, _ in BATCHES), prompt_len - 1)
    t_start = time.perf_counter()
    if kind == "engine":
        from engine import LLM, SamplingParams

        llm = LLM(model=model, dtype=dtype, max_model_len=MAX_POS)
        startup = time.perf_counter() - t_start
        params = SamplingParams(temperature=0, max_tokens=new, ignore_eos=True)
        llm.generate(prompt_token_ids=prompts[:1],
                     sampling_params=SamplingParams(temperature=0, max_tokens=4))

        def run(batch):
            outs = llm.generate(prompt_token_ids=prompts[:batch], sampling_params=params)
            return [o.outputs[0].token_ids for o in outs]
    elif kind == "vllm":
        from vllm import LLM, SamplingParams

        llm = LLM(model=model, dtype=dtype, max_model_len=MAX_POS, seed=0)
        startup = time.perf_counter() - t_start
        inputs = [{"prompt_token_ids": p} for p in prompts]
        llm.generate(inputs[:1], SamplingParams(temperature=0, max_tokens=4), use_tqdm=False)
        params = SamplingParams(temperature=0, max_tokens=new, ignore_eos=True)

        def run(batch):
            outs = llm.generate(inputs[:batch], params, use_tqdm=False)
            return [list(o.outputs[0].token_ids) for o in outs]
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

        def run(batch):
            with torch.inference_mode():
                out = m.generate(x[:batch], max_new_tokens=new, min_new_tokens=new, **kw)
            return out[:, x.shape[1]:].tolist()
    print("READY " + json.dumps({"startup": startup}), flush=True)
    for line in sys.stdin:
        t0 = time.perf_counter()
        ids = run(int(line))
        dt = time.perf_counter() - t0
        print("RESULT " + json.dumps({"tokens": sum(len(i) for i in ids), "seconds": dt,
                                      "ids": ids}), flush=True)


class Side(Worker):
    """One engine's child process, loaded and waiting for runs."""

    def __init__(self, python: str, kind: str, args: list[str], env, log: Path):
        # RSS sampled less often than every 50 ms: the sampler's /proc walks cost this
        # benchmark's process about 6% of a core at 20 Hz, taken from the engines
        super().__init__([python, __file__, "--child", kind, *args], env, log, f"{kind} run",
                         rss_interval=0.25)
        self.startup = self.ready["startup"]
        self.best: dict[int, dict] = {}

    def run(self, batch: int) -> None:
        """One timed run; keeps the fastest per batch."""
        r = self.ask(str(batch))
        if batch not in self.best or r["seconds"] < self.best[batch]["seconds"]:
            self.best[batch] = r


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
    """A one-shot child's RESULT (the roofline)."""
    res = subprocess.run([python, __file__, *args], env=env, capture_output=True, text=True)
    results = [line for line in res.stdout.splitlines() if line.startswith("RESULT ")]
    if res.returncode != 0 or not results:
        sys.exit(f"{args[:2]} failed:\n{res.stderr[-3000:]}")
    return json.loads(results[-1][len("RESULT "):])


def roofline(read: int, active: int, itemsize: int, batch: int, machine: dict) -> float:
    """Decode tokens/s bound: each step reads `read` weights once and does 2
    flops per active weight per sequence (attention over 160 tokens is negligible)."""
    step = max(read * itemsize / machine["bandwidth"], batch * 2 * active / machine["flops"])
    return batch / step


def main() -> int:
    from benchmarks.peer import peer_env, require_peer

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--model-size", default="smollm", choices=sorted(MODEL_SIZES))
    p.add_argument("--arch", default="llama", choices=ARCHS,
                   help="a Llama, or a mixture of experts of that size (default: llama)")
    p.add_argument("--peer", choices=["transformers", "vllm"], default="transformers")
    p.add_argument("--threads", default="0-1", help="CPUs every engine runs on (default 0-1)")
    p.add_argument("--child")
    p.add_argument("--model")
    p.add_argument("--prompt-len", type=int, default=33)
    p.add_argument("--new", type=int, default=128)
    p.add_argument("--repeats", type=int, default=3,
                   help="timed runs per engine and batch, the engines taking turns; the "
                        "fastest counts")
    p.add_argument("--check", action="store_true", help="exit 1 when a target is missed")
    add_record_argument(p)
    a = p.parse_args()
    if a.child == "roofline":
        roofline_child(a.dtype)
        return 0
    if a.child:
        child(a.child, a.model, a.dtype, a.prompt_len, a.new)
        return 0
    env = peer_env(a.threads)
    peer_python = str(require_peer()) if a.peer == "vllm" else sys.executable
    with tempfile.TemporaryDirectory() as tmp:
        model = str(make_model(Path(tmp) / "m", a.model_size, arch=a.arch))
        params = num_params(a.model_size, a.arch)
        itemsize = 4 if a.dtype == "float32" else 2
        machine = run_child(sys.executable, ["--child", "roofline", "--dtype", a.dtype], env)
        print(f"checkpoint: random {a.arch} '{a.model_size}' (~{params / 1e6:.0f}M parameters, "
              f"{active_params(a.model_size, a.arch) / 1e6:.0f}M active a token), "
              f"{a.dtype}, prompts of {a.prompt_len} tokens, {a.new} new tokens each, CPUs "
              f"{a.threads}; machine: {machine['bandwidth'] / 1e9:.1f} GB/s read, "
              f"{machine['flops'] / 1e9:.0f} GFLOP/s matmul")
        args = ["--model", model, "--dtype", a.dtype, "--prompt-len", str(a.prompt_len),
                "--new", str(a.new)]
        sides = []
        try:
            sides.append(Side(sys.executable, "engine", args, {**env, "PYTHONPATH": str(
                Path(__file__).resolve().parent.parent)}, Path(tmp) / "engine.log"))
            sides.append(Side(peer_python, a.peer, args, env, Path(tmp) / "peer.log"))
            for batch, _, _ in BATCHES:
                for _ in range(a.repeats):
                    for side in sides:
                        side.run(batch)
        finally:
            for side in sides:
                side.close()
        e_side, h_side = sides
        print(f"{'requests':>8} {'engine tok/s':>13} {a.peer + ' tok/s':>19} {'ratio':>7} "
              f"{'roofline':>9} {'engine':>7} {a.peer:>12}  target")
        targets = Targets()
        for batch, target_hf, target_vllm in BATCHES:
            target = target_vllm if a.peer == "vllm" else target_hf
            e, h = e_side.best[batch], h_side.best[batch]
            te, th = e["tokens"] / e["seconds"], h["tokens"] / h["seconds"]
            read = read_params(a.model_size, a.arch, batch)
            roof = roofline(read, active_params(a.model_size, a.arch), itemsize, batch, machine)
            same = sum(x == y for x, y in zip(e["ids"], h["ids"]))
            print(f"{batch:>8} {te:>13.1f} {th:>19.1f} {te / th:>6.2f}x {roof:>9.0f} "
                  f"{te / roof:>6.0%} {th / roof:>12.0%}  "
                  f">= {target}x {'ok' if te / th >= target else 'MISS'}; greedy ids identical "
                  f"on {same}/{batch}")
            targets.record(f"{batch} requests: tok/s vs {a.peer}", te / th, target)
            if batch == 1:
                targets.record("1 request: weight bytes/s vs read bandwidth",
                               te * read * itemsize / machine["bandwidth"], BANDWIDTH_TARGET)
        print(f"start-up: engine {e_side.startup:.1f} s, {a.peer} {h_side.startup:.1f} s; "
              f"peak RSS over the run: engine {e_side.rss.peak:.0f} MB, {a.peer} "
              f"{h_side.rss.peak:.0f} MB")
    name = f"throughput --model-size {a.model_size} --dtype {a.dtype} --peer {a.peer}"
    name += f" --arch {a.arch}" if a.arch != "llama" else ""
    return targets.finish(a.check, record_as=name if a.record else None)


if __name__ == "__main__":
    sys.exit(main())
