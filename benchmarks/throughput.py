"""Generation throughput: this engine against transformers' generate(), same
checkpoint, same prompts, same run; each in its own process so that peak
memory (max RSS) is its own.

    python benchmarks/throughput.py [--dtype float32|bfloat16] [--preset small|tiny]

Targets: at 16 concurrent requests of 128 new tokens, at least 2x the
transformers tokens/s; at one request, not slower. Greedy, EOS ignored.
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
import resource
import subprocess
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(1, str(REPO / "tests"))

# The shape of SmolLM-135M (a real small Llama), with random weights.
PRESETS = {
    "small": dict(hidden=576, layers=30, heads=9, kv_heads=3, inter=1536, vocab_size=49152),
    "tiny": dict(hidden=256, layers=4, heads=8, kv_heads=2, inter=688, vocab_size=8192),
}


def child(kind: str, model: str, dtype: str, batch: int, prompt_len: int, new: int) -> None:
    import torch

    g = torch.Generator().manual_seed(0)
    prompts = torch.randint(3, 100, (batch, prompt_len), generator=g)
    if kind == "engine":
        from engine import LLM, SamplingParams

        llm = LLM(model=model, dtype=dtype)
        params = SamplingParams(temperature=0, max_tokens=new, ignore_eos=True)
        llm.generate(prompt_token_ids=prompts[:1].tolist(),
                     sampling_params=SamplingParams(temperature=0, max_tokens=4))
        t0 = time.perf_counter()
        outs = llm.generate(prompt_token_ids=prompts.tolist(), sampling_params=params)
        dt = time.perf_counter() - t0
        n = sum(len(o.outputs[0].token_ids) for o in outs)
    else:
        import transformers

        m = transformers.AutoModelForCausalLM.from_pretrained(
            model, dtype=getattr(torch, dtype)).eval()
        kw = dict(do_sample=False, eos_token_id=None, pad_token_id=0)
        with torch.inference_mode():
            m.generate(prompts[:1], max_new_tokens=4, min_new_tokens=4, **kw)
            t0 = time.perf_counter()
            out = m.generate(prompts, max_new_tokens=new, min_new_tokens=new, **kw)
            dt = time.perf_counter() - t0
        n = (out.shape[1] - prompt_len) * batch
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps({"tokens": n, "seconds": dt, "peak_bytes": peak}))


def measure(kind, model, dtype, batch, prompt_len, new) -> dict:
    res = subprocess.run([sys.executable, __file__, "--child", kind, "--model", model, "--dtype",
                          dtype, "--batch", str(batch), "--prompt-len", str(prompt_len),
                          "--new", str(new)], capture_output=True, text=True,
                         env={**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"})
    if res.returncode != 0:
        sys.exit(f"{kind} failed:\n{res.stderr[-3000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--preset", default="small", choices=sorted(PRESETS))
    p.add_argument("--child")
    p.add_argument("--model")
    p.add_argument("--batch", type=int)
    p.add_argument("--prompt-len", type=int, default=32)
    p.add_argument("--new", type=int, default=128)
    a = p.parse_args()
    if a.child:
        child(a.child, a.model, a.dtype, a.batch, a.prompt_len, a.new)
        return 0
    from helpers import make_checkpoint

    with tempfile.TemporaryDirectory() as tmp:
        model = str(make_checkpoint(Path(tmp) / "m", "llama", max_pos=1024, init_std=0.02,
                                    **PRESETS[a.preset]))
        nparams = sum(os.path.getsize(f) for f in Path(model).glob("*.safetensors")) // 4
        print(f"checkpoint: Llama shape '{a.preset}' (~{nparams / 1e6:.0f}M parameters), "
              f"{a.dtype}, prompts of {a.prompt_len} tokens, {a.new} new tokens each, "
              f"{os.cpu_count()} cores")
        print(f"{'requests':>8} {'engine tok/s':>13} {'transformers tok/s':>19} {'ratio':>7} "
              f"{'engine peak':>12} {'hf peak':>9}  target")
        for batch, target in ((16, 2.0), (1, 1.0)):
            e = measure("engine", model, a.dtype, batch, a.prompt_len, a.new)
            h = measure("transformers", model, a.dtype, batch, a.prompt_len, a.new)
            te, th = e["tokens"] / e["seconds"], h["tokens"] / h["seconds"]
            print(f"{batch:>8} {te:>13.1f} {th:>19.1f} {te / th:>6.2f}x "
                  f"{e['peak_bytes'] / 2**20:>10.0f}MB {h['peak_bytes'] / 2**20:>7.0f}MB  "
                  f">= {target}x {'ok' if te / th >= target else 'MISS'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
