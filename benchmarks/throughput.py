"""Offline generation throughput: this engine against transformers' generate()
(or, with --peer vllm, upstream vLLM's CPU engine), same checkpoint, same
prompts, same run; each engine in its own process so that start-up time and
peak memory (the summed RSS of its process tree, sampled) are its own. Also the
roofline: the tokens/s that this machine's measured memory bandwidth and matmul
speed allow.

    python benchmarks/throughput.py [--dtype float32|bfloat16] [--model-size smollm|small|large|tiny]
    python benchmarks/throughput.py --peer vllm [--model-size small|large]   # bash ci/setup-peer.sh first
    python benchmarks/throughput.py --arch qwen3_moe|mixtral --peer vllm --model-size small
    python benchmarks/throughput.py --dtype bfloat16 --quant w4a16 --peer none   # 4-bit weights
    python benchmarks/throughput.py --eager-baseline ...   # decode graphs vs --enforce-eager

--arch picks the architecture (benchmarks/models.py: a Llama, or a mixture of
experts of the same size: its roofline counts the experts a step is expected
to read). --quant w4a16 runs the checkpoint `engine quantize` makes of it
(--peer none: ours alone). Targets: at 16 concurrent requests of 128 new
tokens, at least 2x the transformers tokens/s and 1.5x vLLM's; at one request,
not slower than either, and a decode step's bytes (the weights it reads, as the
checkpoint holds them, and the KV cache rows its attention reads) streamed at
>= 80% of the machine's read bandwidth (measured here: the sum of a 1 GiB
tensor), reported in GB/s. Greedy, EOS ignored; threads bound to CPUs 0-1 for
every engine. --eager-baseline runs ours a second time with --enforce-eager
(docs/decode-graphs.md) and reports the graphs' ratio over it. --check exits 1
on a missed target.
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

from benchmarks.common import Targets, Worker, add_record_argument, say_ready
from benchmarks.models import (ARCHS, MAX_POS, MODEL_SIZES, active_params, make_model,
                               num_params, prompt_ids, read_params)

BATCHES = ((16, 2.0, 1.5), (1, 1.0, 1.0))  # (requests, target vs transformers, vs vllm)
BANDWIDTH_TARGET = 0.8  # at one request: bytes a step reads per second / read bandwidth


def child(kind: str, model: str, dtype: str, prompt_len: int, new: int) -> None:
    """Runs in its own process (for vllm: the peer's Python, without our engine):
    loads the model, prints READY, then one timed generate() per line of stdin
    (the number of requests), each answered with a RESULT line."""
    prompts = prompt_ids(max(b for b, _, _ in BATCHES), prompt_len - 1)
    t_start = time.perf_counter()
    if kind in ("engine", "engine-eager"):
        from engine import LLM, SamplingParams

        llm = LLM(model=model, dtype=dtype, max_model_len=MAX_POS,
                  enforce_eager=kind == "engine-eager")
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
    say_ready({"startup": startup})
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
        self.kind = kind
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
    # random, not ones (pages of equal bytes a host may merge). On the 2-core AMD
    # VMs this reads 35-37 GB/s in most runs and 60-65 GB/s in a few (ones or
    # random alike): a step's GB/s is printed beside it, so a ratio can be read
    # against either
    src = torch.rand(256 << 20, dtype=torch.float32)  # 1 GiB
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


def weight_bytes(folder: Path, itemsize: int) -> int:
    """Bytes of weights a one-request decode step reads: every tensor of the
    checkpoint (its floating-point ones at the run's dtype) but the embedding
    table, of which a step reads one row, unless the LM head is that table."""
    tied = json.loads((folder / "config.json").read_text()).get("tie_word_embeddings", False)
    floats = {"F32": 4, "F16": 2, "BF16": 2}
    total = 0
    for f in folder.glob("*.safetensors"):
        with open(f, "rb") as fh:  # the header: name -> dtype, shape, byte offsets
            header = json.loads(fh.read(int.from_bytes(fh.read(8), "little")))
        for name, t in header.items():
            if name == "__metadata__" or (name.endswith("embed_tokens.weight") and not tied):
                continue
            size = t["data_offsets"][1] - t["data_offsets"][0]
            total += size * itemsize // floats[t["dtype"]] if t["dtype"] in floats else size
    return total


def kv_bytes(folder: Path, itemsize: int, context: float) -> float:
    """KV cache bytes one sequence's decode step reads over `context` tokens."""
    c = json.loads((folder / "config.json").read_text())
    head_dim = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
    return 2 * c["num_hidden_layers"] * c["num_key_value_heads"] * head_dim * itemsize * context


def roofline(read: int, active: int, itemsize: int, batch: int, machine: dict) -> float:
    """Decode tokens/s bound: each step reads `read` weights once and does 2
    flops per active weight per sequence (attention over 160 tokens is negligible)."""
    step = max(read * itemsize / machine["bandwidth"], batch * 2 * active / machine["flops"])
    return batch / step


def tokens_per_s(r: dict) -> float:
    return r["tokens"] / r["seconds"]


def step_bytes(a, folder: Path, itemsize: int) -> float:
    """Bytes one request's decode step reads: weights, and KV rows over the
    run's mean context (prompt and half the new tokens)."""
    if a.arch == "llama":
        weights = weight_bytes(folder, itemsize)
    else:  # the experts a step is expected to read
        weights = read_params(a.model_size, a.arch, 1) * itemsize
    return weights + kv_bytes(folder, itemsize, a.prompt_len + a.new / 2)


def report(a, sides: list, machine: dict, folder: Path, itemsize: int) -> None:
    """The table: tok/s of each side, against the roofline; at one request,
    the GB/s a decode step streams."""
    e_side = sides[0]
    peer = sides[1] if a.peer != "none" else None
    print(f"{'requests':>8} {'engine tok/s':>13} {a.peer + ' tok/s':>19} {'ratio':>7} "
          f"{'roofline':>9} {'engine':>7} {a.peer:>12}")
    for batch, _, _ in BATCHES:
        e = e_side.best[batch]
        te = tokens_per_s(e)
        read = read_params(a.model_size, a.arch, batch)
        roof = roofline(read, active_params(a.model_size, a.arch), itemsize, batch, machine)
        line = f"{batch:>8} {te:>13.1f} "
        if peer is not None:
            h = peer.best[batch]
            th = tokens_per_s(h)
            same = sum(x == y for x, y in zip(e["ids"], h["ids"]))
            line += (f"{th:>19.1f} {te / th:>6.2f}x {roof:>9.0f} {te / roof:>6.0%} "
                     f"{th / roof:>12.0%}  greedy ids identical on {same}/{batch}")
        else:
            line += f"{'-':>19} {'-':>7} {roof:>9.0f} {te / roof:>6.0%}"
        print(line)
    step = step_bytes(a, folder, itemsize)
    streamed = tokens_per_s(e_side.best[1]) * step
    print(f"1 request: a step reads {step / 1e6:.1f} MB (weights and KV rows); streamed "
          f"{streamed / 1e9:.1f} GB/s of the {machine['bandwidth'] / 1e9:.1f} GB/s read "
          f"bandwidth: {streamed / machine['bandwidth']:.0%} (target >= {BANDWIDTH_TARGET:.0%})")


def main() -> int:
    from benchmarks.peer import peer_env, require_peer

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--model-size", default="smollm", choices=sorted(MODEL_SIZES))
    p.add_argument("--arch", default="llama", choices=ARCHS,
                   help="a Llama, or a mixture of experts of that size (default: llama)")
    p.add_argument("--peer", choices=["transformers", "vllm", "none"], default="transformers",
                   help="the engine compared with (none: ours alone)")
    p.add_argument("--quant", choices=["w4a16"],
                   help="run the checkpoint `engine quantize --scheme` makes (bfloat16 only)")
    p.add_argument("--threads", default="0-1", help="CPUs every engine runs on (default 0-1)")
    p.add_argument("--eager-baseline", action="store_true",
                   help="also run ours with --enforce-eager: the decode graphs' ratio over it")
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
    if a.quant and a.dtype != "bfloat16":
        p.error("--quant runs in bfloat16: add --dtype bfloat16")
    env = peer_env(a.threads)
    peer_python = str(require_peer()) if a.peer == "vllm" else sys.executable
    with tempfile.TemporaryDirectory() as tmp:
        folder = make_model(Path(tmp) / "m", a.model_size, arch=a.arch)
        if a.quant:
            from engine.model_executor.layers.quantization.rtn import quantize

            folder = quantize(folder, Path(tmp) / a.quant, scheme=a.quant)
        model = str(folder)
        params = num_params(a.model_size, a.arch)
        itemsize = 4 if a.dtype == "float32" else 2
        machine = run_child(sys.executable, ["--child", "roofline", "--dtype", a.dtype], env)
        print(f"checkpoint: random {a.arch} '{a.model_size}' (~{params / 1e6:.0f}M parameters, "
              f"{active_params(a.model_size, a.arch) / 1e6:.0f}M active a token), "
              f"{a.dtype}{' ' + a.quant if a.quant else ''}, prompts of {a.prompt_len} tokens, "
              f"{a.new} new tokens each, CPUs {a.threads}; "
              f"machine: {machine['bandwidth'] / 1e9:.1f} GB/s read, "
              f"{machine['flops'] / 1e9:.0f} GFLOP/s matmul")
        args = ["--model", model, "--dtype", a.dtype, "--prompt-len", str(a.prompt_len),
                "--new", str(a.new)]
        sides = []
        try:
            engine_env = {**env, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
            sides.append(Side(sys.executable, "engine", args, engine_env,
                              Path(tmp) / "engine.log"))
            if a.peer != "none":
                sides.append(Side(peer_python, a.peer, args, env, Path(tmp) / "peer.log"))
            if a.eager_baseline:
                sides.append(Side(sys.executable, "engine-eager", args, engine_env,
                                  Path(tmp) / "eager.log"))
            for batch, _, _ in BATCHES:
                for _ in range(a.repeats):
                    for side in sides:
                        side.run(batch)
        finally:
            for side in sides:
                side.close()
        report(a, sides, machine, folder, itemsize)
        targets = Targets()
        e_side = sides[0]
        for batch, target_hf, target_vllm in BATCHES:
            te = tokens_per_s(e_side.best[batch])
            if a.eager_baseline:
                eager = tokens_per_s(sides[-1].best[batch])
                print(f"{batch} requests: decode graphs {te:.1f} tok/s, --enforce-eager "
                      f"{eager:.1f}: {te / eager:.2f}x")
                targets.record(f"{batch} requests: decode graphs vs --enforce-eager",
                               te / eager, 1.0)
            if a.peer != "none":
                th = tokens_per_s(sides[1].best[batch])
                target = target_vllm if a.peer == "vllm" else target_hf
                targets.record(f"{batch} requests: tok/s vs {a.peer}", te / th, target)
            if batch == 1:
                streamed = te * step_bytes(a, folder, itemsize)
                targets.record("1 request: bytes a step reads /s vs read bandwidth",
                               streamed / machine["bandwidth"], BANDWIDTH_TARGET)
        print("start-up: " + ", ".join(f"{s.kind} {s.startup:.1f} s" for s in sides)
              + "; peak RSS over the run: "
              + ", ".join(f"{s.kind} {s.rss.peak:.0f} MB" for s in sides))
    name = f"throughput --model-size {a.model_size} --dtype {a.dtype} --peer {a.peer}"
    name += f" --arch {a.arch}" if a.arch != "llama" else ""
    name += f" --quant {a.quant}" if a.quant else ""
    return targets.finish(a.check, record_as=name if a.record else None)


if __name__ == "__main__":
    sys.exit(main())
