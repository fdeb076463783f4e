"""Structured-output decode against unconstrained decode on the same
`engine serve`, in the same run: 16 concurrent requests, each length-capped
(the grammars cannot end before max_tokens), rounds taking turns, the best
round of each kind kept. With --check, exit 1 unless each constrained kind
reaches 0.9x the unconstrained tok/s. With --peer vllm, `vllm serve` (0.32.0,
benchmarks/peer.py) runs the same rounds on the same model and schema, taking
turns with ours, and each constrained kind must reach 1.0x its tok/s.

    python benchmarks/structured.py [--model DIR] [--peer vllm] [--check] [--record]

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
PEER_TARGET = 1.0  # constrained tok/s over vLLM's with the same schema (issue 38)
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
    p.add_argument("--peer", choices=["vllm"], default=None)
    p.add_argument("--threads", default="0-1", help="the CPUs both servers run on with --peer")
    add_check_argument(p)
    a = p.parse_args(argv)
    from benchmarks.peer import peer_env, require_peer
    from benchmarks.serve import Served, free_port

    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "0.25"}
    if a.peer:  # the same CPUs, threads and environment for both
        env = {**peer_env(a.threads), "PYTHONPATH": str(Path(_HERE).parent)}  # vLLM: whole GiB
    with tempfile.TemporaryDirectory() as tmp:
        model = a.model or str(_tiny(Path(tmp), a.peer is not None))
        servers = {"ours": _server(Served, free_port(), [
            sys.executable, "-m", "engine.cli", "serve", model], env, Path(tmp) / "serve.log")}
        try:
            if a.peer:
                servers["vllm"] = _server(Served, free_port(), [
                    str(require_peer()), "-m", "vllm.entrypoints.openai.api_server", "--model",
                    model, "--host", "127.0.0.1"], env, Path(tmp) / "vllm.log")
            best = {(side, kind): 0.0 for side in servers for kind in KINDS}
            for server in servers.values():
                for extra in KINDS.values():  # warm-up: kernels, and each grammar compiled
                    asyncio.run(_round(server.url, extra, 8))
            for _ in range(a.rounds):
                for kind, extra in KINDS.items():
                    for side, server in servers.items():
                        best[side, kind] = max(best[side, kind],
                                               asyncio.run(_round(server.url, extra,
                                                                  a.max_tokens)))
        finally:
            for server in servers.values():
                server.close()
    print(json.dumps({f"{side} {kind}": round(v, 1) for (side, kind), v in best.items()}))
    targets = Targets()
    for kind in KINDS:
        if kind == "unconstrained":
            continue
        targets.record(f"{REQUESTS} requests, {kind} vs unconstrained tok/s",
                       best["ours", kind] / best["ours", "unconstrained"], TARGET)
        if a.peer:
            targets.record(f"{REQUESTS} requests, {kind} vs vllm's tok/s",
                           best["ours", kind] / best["vllm", kind], PEER_TARGET)
    return targets.finish(a.check, record_as="structured" if a.record else None)


def _tiny(tmp: Path, peer: bool) -> Path:
    """The tiny random model (byte-level BPE, vocabulary 512); for the peer,
    whose CPU attention has no head size 16, the same tokenizer on a random
    Llama of head size 32 (hidden 256, 4 layers)."""
    from engine.tiny_model import make_tiny_model

    tiny = make_tiny_model(tmp / "tiny")
    if not peer:
        return tiny
    sys.path.insert(0, str(Path(_HERE).parent / "tests"))
    from helpers import make_checkpoint

    folder = make_checkpoint(tmp / "tiny32", hidden=256, layers=4, heads=8, kv_heads=2,
                             inter=688, max_pos=1024, vocab_size=512, init_std=0.02)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (folder / name).write_bytes((tiny / name).read_bytes())
    return folder


def _server(served, port: int, cmd: list[str], env: dict, log: Path):
    return served([*cmd, "--port", str(port), "--served-model-name", "m", "--max-model-len",
                   "1024", "--uvicorn-log-level", "warning"], env, port, log)


if __name__ == "__main__":
    sys.exit(main())
