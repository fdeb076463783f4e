"""The served workloads beside `vllm serve` (benchmarks/serve.py --workload):

- shared-prefix: many clients, one long system prompt (--prefix tokens) and a
  short question each. A cold request (a prefix neither server has seen) and a
  warm one (the same prefix, another question) time the prefix cache (target:
  warm <= 0.3x cold); then 16 and 64 clients at once, TTFT p50/p99 (target:
  <= vLLM's).
- long-prompt: --long-clients clients, each its own --long-tokens prompt,
  at once: TTFT p50/p99 and output tokens/s; and /health's latency (polled
  every 10 ms; target: p99 <= 20 ms) while --health-prefill-token prompts are
  prefilled (5, one after another), and while 64 clients stream 128 tokens
  each.

Both servers run the same random model, max_model_len --max-model-len, their
defaults otherwise (chunked prefill and prefix caching on in both); greedy,
EOS ignored, token-id prompts. One round each, the sides in turn: figures on
busy cores are coarse."""
from __future__ import annotations

import asyncio
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import record
from benchmarks.models import MODEL_SIZES, make_model
from benchmarks.peer import peer_env, require_peer

WARM_VS_COLD = 0.3
HEALTH_P99_S = 0.020
HEALTH_CLIENTS = 64  # streaming while /health is polled
HEALTH_ROUNDS = 5  # prefills while /health is polled: ~300 polls
SHARED_CLIENTS = (16, 64)


def add_arguments(p) -> None:
    p.add_argument("--workload", choices=["throughput", "shared-prefix", "long-prompt"],
                   default="throughput", help="throughput (default): the 1/16/64-client "
                   "decode rounds against offline; the others: serve_workloads.py")
    p.add_argument("--prefix", type=int, default=1500, help="shared-prefix: its tokens")
    p.add_argument("--long-tokens", type=int, default=1500, help="long-prompt: tokens each")
    p.add_argument("--long-clients", type=int, default=4, help="long-prompt: clients")
    p.add_argument("--health-prefill", type=int, default=3000,
                   help="long-prompt: the prompt prefilled while /health is polled")
    p.add_argument("--max-model-len", type=int, default=4096)


def _ids(n: int, rng: random.Random) -> list[int]:
    return [rng.randrange(3, 105) for _ in range(n)]


def _ttft(results) -> dict:
    t = sorted(r[1] for r in results)
    return {"p50": statistics.median(t), "p99": t[min(len(t) - 1, int(0.99 * len(t)))]}


_serve = None  # benchmarks/serve.py, handed to main() (importing it would make a circle)


async def _clients(url: str, prompts, new: int):
    """((tokens, time to first token, events) per prompt, seconds for all)."""
    t0 = time.perf_counter()
    res = await asyncio.gather(*(_serve._one(url, "m", p, new) for p in prompts))
    return res, time.perf_counter() - t0


def shared_prefix(url: str, a, seed: int) -> dict:
    rng = random.Random(seed)  # a prefix of this side's own: cold on both servers
    prefix = [1] + _ids(a.prefix, rng)
    out = {}
    for name in ("cold", "warm"):
        t0 = time.perf_counter()
        asyncio.run(_clients(url, [prefix + _ids(32, rng)], 1))
        out[name] = time.perf_counter() - t0
    for c in SHARED_CLIENTS:
        res, _ = asyncio.run(_clients(url, [prefix + _ids(32, rng) for _ in range(c)], a.new))
        out[c] = _ttft(res)
    return out


async def _health_during(url: str, rounds: list[list[list[int]]], new: int) -> dict:
    """/health's latency p50, p99 and worst while each round's prompts are
    answered, one round after another (a p99 needs a few hundred polls)."""
    import httpx2 as httpx

    took = []
    async with httpx.AsyncClient(timeout=600) as client:
        for prompts in rounds:
            request = asyncio.ensure_future(_clients(url, prompts, new))
            while not request.done():
                t0 = time.perf_counter()
                await client.get(url + "/health")
                took.append(time.perf_counter() - t0)
                await asyncio.sleep(0.01)
            await request
    took.sort()
    return {"p50": statistics.median(took), "p99": took[min(len(took) - 1, int(0.99 * len(took)))],
            "worst": took[-1], "polls": len(took)}


def long_prompt(url: str, a, seed: int) -> dict:
    rng = random.Random(seed)
    prompts = [[1] + _ids(a.long_tokens, rng) for _ in range(a.long_clients)]
    res, took = asyncio.run(_clients(url, prompts, a.new))
    out = {"ttft": _ttft(res), "tok_s": sum(r[0] for r in res) / took}
    out["health_prefill"] = asyncio.run(_health_during(
        url, [[[1] + _ids(a.health_prefill, rng)] for _ in range(HEALTH_ROUNDS)], 1))
    out["health_streams"] = asyncio.run(_health_during(
        url, [[[1] + _ids(32, rng) for _ in range(HEALTH_CLIENTS)]], a.new))
    return out


def main(a, repo: Path, serve) -> int:
    """serve: the benchmarks/serve.py module (its Served servers, its client)."""
    global _serve
    _serve = serve
    Served, free_port = serve.Served, serve.free_port
    env = peer_env(a.threads)
    peer_python = require_peer() if a.peer else None
    run = shared_prefix if a.workload == "shared-prefix" else long_prompt
    got, servers = {}, []
    with tempfile.TemporaryDirectory() as tmp:
        model = str(make_model(Path(tmp) / "model", a.model_size, max_pos=a.max_model_len))
        print(f"{a.workload}: random Llama '{a.model_size}' {MODEL_SIZES[a.model_size]}, "
              f"float32, max_model_len {a.max_model_len}, {a.new} new tokens, CPUs {a.threads}")
        sides = {"engine": [sys.executable, "-m", "engine.cli", "serve", model,
                            "--uvicorn-log-level", "warning"]}
        if peer_python:
            sides["vllm"] = [str(peer_python), "-m", "vllm.entrypoints.openai.api_server",
                             "--model", model, "--host", "127.0.0.1"]
        try:
            for name, cmd in sides.items():
                port = free_port()
                servers.append(Served(
                    cmd + ["--port", str(port), "--dtype", "float32", "--served-model-name",
                           "m", "--max-model-len", str(a.max_model_len)],
                    {**env, "PYTHONPATH": str(repo)}, port, Path(tmp) / f"{name}.log"))
            for seed, (name, server) in enumerate(zip(sides, servers)):
                asyncio.run(_clients(server.url, [[1] + _ids(16, random.Random(99))], 4))
                got[name] = run(server.url, a, 1000 + seed)
        finally:
            for server in servers:
                server.close()
    return _report(a, got)


def _report(a, got: dict) -> int:
    rows, missed = [], []
    peer = got.get("vllm")
    for name, r in got.items():
        if a.workload == "shared-prefix":
            ratio = r["warm"] / r["cold"]
            print(f"{name}: {a.prefix}-token prefix cold {r['cold'] * 1e3:.0f} ms, warm "
                  f"{r['warm'] * 1e3:.0f} ms ({ratio:.2f}x; target <= {WARM_VS_COLD}x)")
            for c in SHARED_CLIENTS:
                print(f"  {c:>3} clients: TTFT p50 {r[c]['p50'] * 1e3:.0f} ms, "
                      f"p99 {r[c]['p99'] * 1e3:.0f} ms")
            if name == "engine":
                rows.append((f"shared {a.prefix}-token prefix: warm vs cold", f"{ratio:.2f}x",
                             f"<= {WARM_VS_COLD}x"))
                missed += [] if ratio <= WARM_VS_COLD else ["warm vs cold"]
                for c in SHARED_CLIENTS if peer else ():
                    for q in ("p50", "p99"):
                        v = r[c][q] / peer[c][q]
                        rows.append((f"shared prefix, {c} clients: TTFT {q} vs vllm",
                                     f"{v:.2f}x", "<= 1.0x"))
                        missed += [] if v <= 1.0 else [f"{c} clients TTFT {q}"]
        else:
            print(f"{name}: {a.long_clients} x {a.long_tokens}-token prompts: TTFT p50 "
                  f"{r['ttft']['p50'] * 1e3:.0f} ms, p99 {r['ttft']['p99'] * 1e3:.0f} ms, "
                  f"{r['tok_s']:.1f} tok/s")
            during = {"health_prefill": f"{HEALTH_ROUNDS} {a.health_prefill}-token prefills",
                      "health_streams": f"{HEALTH_CLIENTS} streams of {a.new} tokens"}
            for key, what in during.items():
                h = r[key]
                print(f"  /health during {what}: p50 {h['p50'] * 1e3:.1f} ms, p99 "
                      f"{h['p99'] * 1e3:.1f} ms, worst {h['worst'] * 1e3:.1f} ms of {h['polls']} "
                      f"polls (target p99 <= {HEALTH_P99_S * 1e3:.0f} ms)")
                if name == "engine":
                    rows.append((f"/health p99 during {what}",
                                 f"{h['p99'] * 1e3:.1f} ms"
                                 + (f" (vllm {peer[key]['p99'] * 1e3:.1f} ms)" if peer else ""),
                                 f"<= {HEALTH_P99_S * 1e3:.0f} ms"))
                    missed += [] if h["p99"] <= HEALTH_P99_S else [f"/health during {what}"]
            if name == "engine" and peer:
                for q in ("p50", "p99"):
                    v = r["ttft"][q] / peer["ttft"][q]
                    rows.append((f"{a.long_clients} x {a.long_tokens}-token prompts: TTFT {q} "
                                 "vs vllm", f"{v:.2f}x", "<= 1.0x"))
    for m in missed:
        print(f"MISSED: {m}")
    if a.record:
        record(f"serve --workload {a.workload} --model-size {a.model_size}", rows)
    return 1 if (a.check and missed) else 0
