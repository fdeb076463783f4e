"""W8A8 and W4A16 against bfloat16: this engine on compressed-tensors W8A8
and W4A16 checkpoints (made by `engine quantize` from the random Llama)
against this engine on the bfloat16 original and, with --peer vllm, upstream
vLLM on the same quantized checkpoints; each engine in its own process, taking
turns, threads bound to the same CPUs.

    python benchmarks/quant.py [--model-size large] [--schemes w8a8,w4a16] [--peer vllm] [--check]

Targets (issue 28): W8A8 decode >= 1.5x our bf16 at 1 request and >= 1.0x
vLLM's W8A8 at 1 and 16 requests; W4A16 decode >= 2x our bf16 at 1 request;
prefill >= 1.0x our bf16; peak RSS with W8A8 <= 0.6x bf16's. Also how many
prompts' first tokens agree with vLLM's.
--check exits 1 on a missed target. On a shared machine the figures are noisy:
the fastest of --repeats runs counts.
"""
from __future__ import annotations

import os
import sys

# this folder's bisect.py would shadow the standard library's (see throughput.py)
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [os.path.dirname(_HERE)] + [p for p in sys.path if os.path.abspath(p or ".") != _HERE]

import argparse
import json
import tempfile
import time
from pathlib import Path

from benchmarks.common import BestOfWorker, Targets, add_check_argument, say_ready
from benchmarks.models import MAX_POS, MODEL_SIZES, make_model, prompt_ids

BATCHES = (1, 16)  # decode requests
# scheme -> {requests: (target vs our bf16, vs vLLM on the same scheme)}
DECODE = {"w8a8": {1: (1.5, 1.0), 16: (None, 1.0)}, "w4a16": {1: (2.0, None), 16: (None, None)}}
PREFILL_TARGET = 1.0  # quantized prefill tokens/s vs our bf16
RSS_TARGET = {"w8a8": 0.6}  # quantized peak RSS vs bf16
PREFILL = (4, 480)  # prompts, tokens each
AGREE = 4  # first tokens compared with vLLM's


def child(kind: str, model: str, new: int) -> None:
    """Loads, prints READY, then answers "decode B" / "prefill" lines."""
    decode = prompt_ids(16, 32)
    t0 = time.perf_counter()
    if kind == "engine":
        from engine import LLM, SamplingParams

        llm = LLM(model=model, dtype="bfloat16", max_model_len=MAX_POS)

        def gen(prompts, n):
            outs = llm.generate(prompt_token_ids=prompts, sampling_params=SamplingParams(
                temperature=0, max_tokens=n, ignore_eos=True))
            return [o.outputs[0].token_ids for o in outs]
    else:
        from vllm import LLM, SamplingParams

        llm = LLM(model=model, dtype="bfloat16", max_model_len=MAX_POS, seed=0)

        def gen(prompts, n):
            outs = llm.generate([{"prompt_token_ids": p} for p in prompts], SamplingParams(
                temperature=0, max_tokens=n, ignore_eos=True), use_tqdm=False)
            return [list(o.outputs[0].token_ids) for o in outs]
    startup = time.perf_counter() - t0
    gen(decode[:1], 4)
    say_ready({"startup": startup})
    fresh = iter(range(2, 1 << 30))  # every prefill new prompts: no prefix-cache hits
    for line in sys.stdin:
        what = line.split()
        if what[0] == "prefill":
            prompts, n = prompt_ids(PREFILL[0], PREFILL[1] - 1, seed=next(fresh)), 1
        else:
            prompts, n = decode[:int(what[1])], new
        t = time.perf_counter()
        ids = gen(prompts, n)
        dt = time.perf_counter() - t
        tokens = sum(map(len, prompts)) if what[0] == "prefill" else sum(map(len, ids))
        print("RESULT " + json.dumps({"tokens": tokens, "seconds": dt, "ids": ids}), flush=True)


class Side(BestOfWorker):
    def __init__(self, python: str, kind: str, model: str, new: int, env, log: Path, name: str):
        super().__init__([python, __file__, "--child", kind, "--model", model, "--new", str(new)],
                         env, log, name, rss_interval=0.25)


def main() -> int:
    from benchmarks.peer import peer_env, require_peer

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model-size", default="large", choices=sorted(MODEL_SIZES))
    p.add_argument("--peer", choices=["none", "vllm"], default="none")
    p.add_argument("--threads", default="0-1")
    p.add_argument("--new", type=int, default=64)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--schemes", default="w8a8,w4a16", help="comma-separated: w8a8, w4a16")
    p.add_argument("--child")
    p.add_argument("--model")
    add_check_argument(p)
    a = p.parse_args()
    if a.child:
        child(a.child, a.model, a.new)
        return 0
    from engine import ops
    from engine.model_executor.layers.quantization.rtn import quantize

    schemes = [x for x in a.schemes.split(",") if x]
    if not schemes or set(schemes) - set(DECODE):
        raise SystemExit(f"--schemes takes some of {', '.join(DECODE)}, got {a.schemes!r}")
    env = peer_env(a.threads)  # vLLM takes whole GiB
    # ours: the KV cache the runs need (16 x 96 tokens, 4 x 480); engines commit theirs at
    # start, and the RSS compared is mostly the weights'
    ours = {**env, "PYTHONPATH": str(Path(__file__).resolve().parent.parent),
            "VLLM_CPU_KVCACHE_SPACE": "0.25"}
    requests = [f"decode {b}" for b in BATCHES] + ["prefill"]
    with tempfile.TemporaryDirectory() as tmp:
        bf16 = make_model(Path(tmp) / "bf16", a.model_size)
        ckpt = {s: quantize(bf16, Path(tmp) / s, scheme=s) for s in schemes}
        print(f"checkpoint: random Llama '{a.model_size}', bfloat16 and {', '.join(schemes)} "
              f"(engine quantize); CPUs {a.threads}, our code path {ops.cpu_isa()}; {a.new} new "
              f"tokens a request, prefill {PREFILL[0]} prompts of {PREFILL[1]} tokens")
        specs = [(sys.executable, "engine", bf16, ours, "engine bf16")]
        specs += [(sys.executable, "engine", ckpt[s], ours, f"engine {s}") for s in schemes]
        if a.peer == "vllm":
            specs += [(str(require_peer()), "vllm", ckpt[s], env, f"vllm {s}") for s in schemes]
        sides = []
        try:
            for python, kind, model, e, name in specs:
                log = Path(tmp) / f"{name.replace(' ', '-')}.log"
                try:
                    sides.append(Side(python, kind, str(model), a.new, e, log, name))
                except SystemExit:
                    if kind != "vllm":
                        raise
                    print(f"{name} did not start, left out: {peer_failure(log)}")
            for req in requests:
                for _ in range(a.repeats):
                    for side in sides:
                        side.run(req)
        finally:
            for side in sides:
                side.close()
    targets = Targets()
    base = sides[0]
    by_name = {side.name: side for side in sides}
    for s in schemes:
        q, peer = by_name[f"engine {s}"], by_name.get(f"vllm {s}")
        report(targets, s, q, base, peer, requests)
    return targets.finish(a.check, record_as="quant" if a.record else None)


def peer_failure(log: Path) -> str:
    """The root cause a peer that failed to start logged: its first error
    line that is not a wrapper's, with the reasons vLLM gives per kernel."""
    import re

    lines = [re.sub(r"^\(\w+ pid=\d+\) ERROR \S+ \S+ \[[^]]*\]\s*", "", ln).strip()
             for ln in log.read_text(errors="replace").splitlines()]
    errors = [ln for ln in lines if re.match(r"\w*(Error|Exception): ", ln)
              and "initialization failed" not in ln]
    reasons = [ln for ln in lines if "cannot implement due to" in ln]
    if not errors:
        return f"see {log}"
    return " ".join([errors[0]] + reasons)[:600]


def report(targets, s: str, q: Side, base: Side, peer: Side | None, requests) -> None:
    for batch, req in zip(BATCHES, requests):
        t_bf16, t_peer = DECODE[s][batch]
        line = (f"decode, {batch:>2} requests: {s} {q.rate(req):7.1f} tok/s, bf16 "
                f"{base.rate(req):7.1f} ({q.rate(req) / base.rate(req):.2f}x)")
        if t_bf16 is not None:
            targets.record(f"{batch} requests: {s} decode vs our bf16",
                           q.rate(req) / base.rate(req), t_bf16)
        if peer is not None:
            same = sum(x[:AGREE] == y[:AGREE] for x, y in zip(q.best[req]["ids"],
                                                              peer.best[req]["ids"]))
            line += (f", vllm {s} {peer.rate(req):7.1f} ({q.rate(req) / peer.rate(req):.2f}x); "
                     f"first {AGREE} ids agree with vllm on {same}/{batch}")
            if t_peer is not None:
                targets.record(f"{batch} requests: {s} decode vs vllm {s}",
                               q.rate(req) / peer.rate(req), t_peer)
        print(line)
    print(f"prefill: {s} {q.rate('prefill'):7.1f} tok/s, bf16 {base.rate('prefill'):7.1f} "
          f"({q.rate('prefill') / base.rate('prefill'):.2f}x)"
          + (f", vllm {s} {peer.rate('prefill'):7.1f}" if peer else ""))
    targets.record(f"prefill: {s} vs our bf16", q.rate("prefill") / base.rate("prefill"),
                   PREFILL_TARGET)
    print(f"peak RSS: {s} {q.rss.peak:.0f} MB, bf16 {base.rss.peak:.0f} MB "
          f"({q.rss.peak / base.rss.peak:.2f}x)" + (f", vllm {s} {peer.rss.peak:.0f} MB"
                                                     if peer else ""))
    if s in RSS_TARGET:
        targets.record(f"peak RSS: {s} vs bf16", q.rss.peak / base.rss.peak, RSS_TARGET[s],
                       higher_is_better=False)


if __name__ == "__main__":
    sys.exit(main())
