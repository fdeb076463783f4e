"""Structured-output decode against unconstrained decode on the same
`engine serve`, in the same run: 16 concurrent requests, each length-capped
(the grammars cannot end before max_tokens), rounds taking turns, the best
round of each kind kept. With --check, exit 1 unless each constrained kind
reaches 0.9x the unconstrained tok/s.

    python benchmarks/structured.py [--model DIR] [--check] [--record]

Without --model it makes a tiny random model (vocabulary 512); a real model
weighs the bitmask (vocabulary / 32 words a row) against a real forward."""
from __future__ import annotations

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [os.path.dirname(_HERE)] + [p for p in sys.path if os.path.abspath(p or ".") != _HERE]

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path

from benchmarks.common import Targets, add_check_argument

REQUESTS = 16
TARGET = 0.9  # constrained tok/s over unconstrained (issue 38)
# neither can end within max_tokens, so every request runs its full length
KINDS = {
    "unconstrained": {},
    "json schema": {"structured_outputs": {"json": {
        "type": "array", "minItems": 10000,
        "items": {"type": "object", "properties": {"id": {"type": "integer"},
                                                   "ok": {"type": "boolean"}},
                  "required": ["id", "ok"]}}}},
    "regex": {"structured_outputs": {"regex": "[a-z ,.]{10000}"}},
}


async def _round(url: str, extra: dict, new: int) -> float:
    import httpx2 as httpx  # the HTTP client openai uses

    body = {"model": "m", "prompt": "one two three", "max_tokens": new, "temperature": 1.0,
            "ignore_eos": True, **extra}
    async with httpx.AsyncClient(base_url=url, timeout=600) as c:
        t0 = time.perf_counter()
        rs = await asyncio.gather(*(c.post("/v1/completions", json={**body, "seed": i})
                                    for i in range(REQUESTS)))
        dt = time.perf_counter() - t0
    for r in rs:
        if r.status_code != 200:
            sys.exit(f"{r.status_code}: {r.text[:500]}")
    return sum(r.json()["usage"]["completion_tokens"] for r in rs) / dt


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", help="a checkpoint folder (default: a tiny random model)")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--rounds", type=int, default=5, help="of each kind, taking turns")
    add_check_argument(p)
    a = p.parse_args(argv)
    from benchmarks.serve import Served, free_port

    with tempfile.TemporaryDirectory() as tmp:
        model = a.model
        if model is None:
            from engine.tiny_model import make_tiny_model

            model = str(make_tiny_model(Path(tmp) / "tiny"))
        port = free_port()
        server = Served([sys.executable, "-m", "engine.cli", "serve", model, "--port",
                         str(port), "--served-model-name", "m", "--max-model-len", "1024",
                         "--uvicorn-log-level", "warning"],
                        {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "0.25"}, port,
                        Path(tmp) / "serve.log")
        try:
            best = dict.fromkeys(KINDS, 0.0)
            for kind, extra in KINDS.items():  # warm-up: kernels, and each grammar compiled
                asyncio.run(_round(server.url, extra, 8))
            for _ in range(a.rounds):
                for kind, extra in KINDS.items():
                    best[kind] = max(best[kind], asyncio.run(_round(server.url, extra,
                                                                    a.max_tokens)))
        finally:
            server.close()
    print(json.dumps({k: round(v, 1) for k, v in best.items()}))
    targets = Targets()
    for kind in KINDS:
        if kind != "unconstrained":
            targets.record(f"{REQUESTS} requests, {kind} vs unconstrained tok/s",
                           best[kind] / best["unconstrained"], TARGET)
    return targets.finish(a.check, record_as="structured" if a.record else None)


if __name__ == "__main__":
    sys.exit(main())
