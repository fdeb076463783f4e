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
- heavy-requests: one client sends a heavy request (a 10 MB /tokenize,
  100,000 prompts in one completion, a chat whose template takes seconds to
  render) while another polls /health and asks for a one-token completion:
  their worst latency (target <= 100 ms) and the API server's peak memory
  against its idle size (target < 2x).

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

from benchmarks.common import record, take_turn
from benchmarks.models import MODEL_SIZES, make_model
from benchmarks.peer import peer_env, require_peer

WARM_VS_COLD = 0.3
HEALTH_P99_S = 0.020
HEALTH_CLIENTS = 64  # streaming while /health is polled
HEALTH_ROUNDS = 5  # prefills while /health is polled: ~300 polls
SHARED_CLIENTS = (16, 64)
HEAVY_LATENCY_S = 0.100  # /health and a plain request beside a heavy one
HEAVY_RSS = 2.0  # the API server's peak memory meanwhile, x its idle size
# Slow, not endless (the peer would never answer again): ~10^7 loop turns.
SLOW_TEMPLATE = ("{% for i in range(3000) %}{% for j in range(3000) %}{% endfor %}{% endfor %}"
                 "{{ messages[0]['content'] }}")
HEAVY_BODY_LIMIT = 40 << 20  # ours refuses 10 MB bodies for a 4096-token context by default


def add_arguments(p) -> None:
    p.add_argument("--workload", choices=["throughput", "shared-prefix", "long-prompt",
                                            "heavy-requests"],
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


def _rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) << 10
    return 0


def heavy_requests(url: str, a, seed: int, pid: int) -> dict:
    """Per heavy request: the worst /health and one-token completion latency
    while it was in flight, its status, and peak / idle RSS of pid."""
    import httpx2 as httpx

    big = "hello world, this is a test. " * 360_000  # ~10 MB
    heavy = {
        "10 MB /tokenize": ("/tokenize", {"model": "m", "prompt": big}),
        "100,000 prompts": ("/v1/completions", {"model": "m", "prompt": ["hi"] * 100_000,
                                                "max_tokens": 1}),
        "a slow chat template": ("/v1/chat/completions", {
            "model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}),
    }
    plain = {"model": "m", "prompt": [1, 5, 6], "max_tokens": 1, "temperature": 0}
    out = {}
    for name, (path, body) in heavy.items():
        idle = _rss(pid)

        async def run():
            async with httpx.AsyncClient(timeout=600) as client:
                request = asyncio.ensure_future(client.post(url + path, json=body))
                health, completion, peak = [], [], idle
                await asyncio.sleep(0.05)
                while not request.done():
                    t0 = time.perf_counter()
                    await client.get(url + "/health")
                    health.append(time.perf_counter() - t0)
                    t0 = time.perf_counter()
                    await client.post(url + "/v1/completions", json=plain)
                    completion.append(time.perf_counter() - t0)
                    peak = max(peak, _rss(pid))
                    await asyncio.sleep(0.02)
                return (await request).status_code, health, completion, peak

        status, health, completion, peak = asyncio.run(run())
        out[name] = {"status": status, "health": max(health, default=0.0),
                     "plain": max(completion, default=0.0), "polls": len(health),
                     "rss": peak / max(idle, 1)}
    return out


def main(a, repo: Path, serve) -> int:
    """serve: the benchmarks/serve.py module (its Served servers, its client)."""
    global _serve
    _serve = serve
    Served, free_port = serve.Served, serve.free_port
    env = peer_env(a.threads)
    peer_python = require_peer() if a.peer else None
    run = {"shared-prefix": shared_prefix, "long-prompt": long_prompt,
           "heavy-requests": heavy_requests}[a.workload]
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
        if a.workload == "heavy-requests":
            template = Path(tmp) / "slow.jinja"
            template.write_text(SLOW_TEMPLATE)
            for cmd in sides.values():
                cmd += ["--chat-template", str(template)]
            sides["engine"] += ["--max-request-body-bytes", str(HEAVY_BODY_LIMIT)]
        try:
            for name, cmd in sides.items():
                port = free_port()
                servers.append(Served(
                    cmd + ["--port", str(port), "--dtype", "float32", "--served-model-name",
                           "m", "--max-model-len", str(a.max_model_len)],
                    {**env, "PYTHONPATH": str(repo)}, port, Path(tmp) / f"{name}.log"))
            for seed, (name, server) in enumerate(zip(sides, servers)):
                take_turn(server)  # the other server stopped (benchmarks/common.py)
                asyncio.run(_clients(server.url, [[1] + _ids(16, random.Random(99))], 4))
                extra = (server.proc.pid,) if a.workload == "heavy-requests" else ()
                got[name] = run(server.url, a, 1000 + seed, *extra)
        finally:
            for server in servers:
                server.close()
    return _report(a, got)


def _report_heavy(got: dict, rows: list, missed: list) -> None:
    peer = got.get("vllm")
    for name, r in got.items():
        for what, h in r.items():
            print(f"{name}: during {what} (answered {h['status']}): worst /health "
                  f"{h['health'] * 1e3:.0f} ms, worst one-token completion {h['plain'] * 1e3:.0f} "
                  f"ms of {h['polls']} polls; peak RSS {h['rss']:.2f}x idle (targets <= "
                  f"{HEAVY_LATENCY_S * 1e3:.0f} ms, < {HEAVY_RSS}x)")
            if name != "engine":
                continue
            vs = peer[what] if peer else None
            rows.append((f"worst /health, plain request during {what}",
                         f"{h['health'] * 1e3:.0f}, {h['plain'] * 1e3:.0f} ms" + (
                             f" (vllm {vs['health'] * 1e3:.0f}, {vs['plain'] * 1e3:.0f} ms)"
                             if vs else ""), f"<= {HEAVY_LATENCY_S * 1e3:.0f} ms"))
            rows.append((f"API server peak RSS during {what}", f"{h['rss']:.2f}x idle"
                         + (f" (vllm {vs['rss']:.2f}x)" if vs else ""), f"< {HEAVY_RSS}x"))
            if max(h["health"], h["plain"]) > HEAVY_LATENCY_S:
                missed.append(f"latency during {what}")
            if h["rss"] >= HEAVY_RSS:
                missed.append(f"memory during {what}")


def _report(a, got: dict) -> int:
    rows: list = []
    missed: list = []
    peer = got.get("vllm")
    if a.workload == "heavy-requests":
        _report_heavy(got, rows, missed)
    for name, r in got.items() if a.workload != "heavy-requests" else ():
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
