"""This engine against llama.cpp (llama-cpp-python) on the same GGUF files: a
random Llama of SmolLM-135M's deep narrow shape (30 layers x 576, GQA 9/3,
vocab 49152) written as GGUF in each type (tests/gguf_files.py: K-quant rows
that are not whole 256-value blocks fall back as llama.cpp's quantizer does,
Q4_K -> Q5_0, Q6_K -> Q8_0), each engine in its own process on the same
CPUs; the engine's float baseline the same weights dequantized.

    python benchmarks/llamacpp.py [--types Q4_0,Q4_K,Q8_0] [--dtype bfloat16] [--check]

Targets (issue 40): one-request decode >= 1.2x llama.cpp, prefill of 500 and
2000 tokens >= 2x, 16 concurrent requests >= 3x llama.cpp's best (its server's
way: 16 sequences in one context, one batched llama_decode a step;
llamacpp_batch.py). llama-cpp-python is taken from this Python when it imports
(`CMAKE_ARGS=-DGGML_NATIVE=ON pip install llama-cpp-python`, ~10 minutes of
two cores); without it only this engine's figures are printed.
"""
from __future__ import annotations

import os
import sys

# this folder's bisect.py would shadow the standard library's (see throughput.py)
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [os.path.dirname(_HERE)] + [p for p in sys.path if os.path.abspath(p or ".") != _HERE]

import argparse
import importlib.util
import json
import tempfile
import time
from pathlib import Path

from benchmarks.common import BestOfWorker, Targets, add_check_argument, say_ready
from benchmarks.models import MAX_POS, make_model, prompt_ids

REPO = Path(_HERE).parent
DECODE_TARGET, PREFILL_TARGET, BATCH_TARGET = 1.2, 2.0, 3.0  # vs llama.cpp, same file
PREFILLS = (500, 2000)
CONCURRENT = 16


def child(kind: str, model: str, tokenizer: str, dtype: str, new: int, threads: int) -> None:
    """Loads, prints READY, then answers "decode" / "prefill N" lines."""
    t0 = time.perf_counter()
    if kind == "engine":
        from engine import LLM, SamplingParams

        llm = LLM(model=model, dtype=dtype, max_model_len=max(PREFILLS) + 16,
                  tokenizer=tokenizer if model.endswith(".gguf") else None)

        def gen_many(prompts: list[list[int]], n: int) -> list[list[int]]:
            out = llm.generate(prompt_token_ids=prompts, sampling_params=SamplingParams(
                temperature=0, max_tokens=n, ignore_eos=True))
            return [list(o.outputs[0].token_ids) for o in out]

        def gen(prompt: list[int], n: int) -> list[int]:
            return gen_many([prompt], n)[0]
    else:
        from llama_cpp import Llama

        sys.path.insert(0, str(REPO / "tests"))
        from llamacpp_compat import patch_defaults

        patch_defaults()  # where its AMX buffers crash, without them
        cpp = Llama(model_path=model, n_ctx=max(PREFILLS) + 16, n_batch=512, n_threads=threads,
                    n_threads_batch=threads, verbose=False)

        def gen(prompt: list[int], n: int) -> list[int]:
            cpp.reset()
            ids = []
            for tok in cpp.generate(prompt, top_k=1, top_p=1.0, temp=0.0, reset=True):
                ids.append(tok)
                if len(ids) == n:
                    break
            return ids

        from benchmarks.llamacpp_batch import BatchedLlamaCpp

        batched = BatchedLlamaCpp(model, CONCURRENT, 32 + new + 8, threads)
        gen_many = batched.generate
    startup = time.perf_counter() - t0
    gen(prompt_ids(1, 8)[0], 4)
    say_ready({"startup": startup})
    fresh = iter(range(2, 1 << 30))  # new prompts every time: no prefix-cache hits
    for line in sys.stdin:
        what = line.split()
        if what[0] == "concurrent":  # fresh prompts, so neither side reuses a cache
            prompts = prompt_ids(CONCURRENT, 32, seed=next(fresh))
            t = time.perf_counter()
            many = gen_many(prompts, new)
            dt = time.perf_counter() - t
            print("RESULT " + json.dumps({"tokens": sum(map(len, many)), "seconds": dt,
                                          "ids": many[0]}), flush=True)
            continue
        if what[0] == "prefill":
            prompt, n = prompt_ids(1, int(what[1]) - 1, seed=next(fresh))[0], 1
        else:
            prompt, n = prompt_ids(1, 32)[0], new
        t = time.perf_counter()
        ids = gen(prompt, n)
        dt = time.perf_counter() - t
        tokens = len(prompt) if what[0] == "prefill" else len(ids)
        print("RESULT " + json.dumps({"tokens": tokens, "seconds": dt, "ids": ids}), flush=True)


class Side(BestOfWorker):
    def __init__(self, kind: str, model: Path, a, env, log: Path, name: str):
        super().__init__([sys.executable, __file__, "--child", kind, "--model", str(model),
                          "--tokenizer", str(a.tokenizer), "--dtype", a.dtype, "--new",
                          str(a.new), "--nthreads", str(a.nthreads)], env, log, name)


def main() -> int:
    from benchmarks.peer import peer_env

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--types", default="Q4_0,Q4_K,Q8_0")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    p.add_argument("--model-size", default="smollm")
    p.add_argument("--threads", default="0-1")
    p.add_argument("--new", type=int, default=64)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--child")
    p.add_argument("--model")
    p.add_argument("--tokenizer")
    p.add_argument("--nthreads", type=int, default=2)
    add_check_argument(p)
    a = p.parse_args()
    if a.child:
        child(a.child, a.model, a.tokenizer, a.dtype, a.new, a.nthreads)
        return 0
    sys.path.insert(0, str(REPO / "tests"))
    from gguf_files import write_gguf

    from engine import ops

    env = {**peer_env(a.threads, kv_gib="0.5"), "PYTHONPATH": str(REPO)}
    cpus = a.threads.split("-")
    a.nthreads = int(cpus[-1]) - int(cpus[0]) + 1 if len(cpus) == 2 else len(a.threads.split(","))
    have_cpp = importlib.util.find_spec("llama_cpp") is not None
    requests = ["decode", "concurrent"] + [f"prefill {n}" for n in PREFILLS]
    targets = Targets()
    with tempfile.TemporaryDirectory() as tmp:
        src = make_model(Path(tmp) / "src", a.model_size, max_pos=max(MAX_POS, 2048 + 64))
        a.tokenizer = src
        print(f"random Llama '{a.model_size}' as GGUF ({a.types}); CPUs {a.threads}, our code "
              f"path {ops.cpu_isa()}, dtype {a.dtype}; llama.cpp: "
              + ("llama-cpp-python" if have_cpp else "not installed, left out"))
        for qtype in [t for t in a.types.split(",") if t]:
            file = write_gguf(src, Path(tmp) / f"m-{qtype}.gguf", qtype,
                              dequantized_dir=Path(tmp) / f"deq-{qtype}")
            specs = [("engine", file, f"engine {qtype}"),
                     ("engine", Path(tmp) / f"deq-{qtype}", f"engine {a.dtype} (dequantized)")]
            if have_cpp:
                specs.append(("llamacpp", file, f"llama.cpp {qtype}"))
            sides = []
            try:
                for kind, model, name in specs:
                    sides.append(Side(kind, model, a, env, Path(tmp) / f"{len(sides)}.log", name))
                for req in requests:
                    for _ in range(a.repeats):
                        for side in sides:
                            side.run(req)
            finally:
                for side in sides:
                    side.close()
            report(targets, qtype, sides, requests)
    return targets.finish(a.check, record_as="llamacpp" if a.record else None)


def report(targets: Targets, qtype: str, sides: list[Side], requests: list[str]) -> None:
    ours, cpp = sides[0], (sides[2] if len(sides) > 2 else None)
    for req in requests:
        cells = ", ".join(f"{s.name} {s.rate(req):8.1f}" for s in sides)
        print(f"{qtype} {req:<12} tok/s: {cells}")
        if cpp is not None:
            target = {"decode": DECODE_TARGET, "concurrent": BATCH_TARGET}.get(req, PREFILL_TARGET)
            targets.record(f"{qtype} {req} vs llama.cpp", ours.rate(req) / cpp.rate(req), target)


if __name__ == "__main__":
    sys.exit(main())
