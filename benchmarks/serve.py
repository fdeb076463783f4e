"""Served throughput: `engine serve` against this engine's own offline
LLM.generate on the same model and prompts (and, with --peer vllm, against
`vllm serve`), all measured in this run.

    python benchmarks/serve.py [--model-size small|large|tiny] [--peer vllm] [--check]
    python benchmarks/serve.py --workload shared-prefix|long-prompt|heavy-requests [--peer vllm]

(the second: long prompts and a shared system prompt, benchmarks/serve_workloads.py)

For 1, 16 and 64 concurrent streaming clients: output tokens/s, the ratio to
offline (target >= 0.95x at 16 clients, 0.9x else) and to vLLM (target
>= 1.0x at 1 and 16 clients), time to first token p50/p99 (target <= vLLM's
at 16 and 64 clients), tokens per streamed event (above 1 where the
server merged steps: `engine serve --stream-interval`, given through as
--stream-interval); start-up time to a healthy /health. Greedy, EOS
ignored, 32-word prompts, 128 new tokens, threads bound to CPUs 0-1.

The sides take turns, one round each (offline, engine serve, vllm serve,
offline, ...), every process loaded before the first round: this machine's
speed drifts by tens of percent over minutes, and a ratio of figures taken
minutes apart measures the drift. The fastest round of each side counts, of
at least --repeats rounds and --min-seconds of rounds a side.
"""
from __future__ import annotations

import os
import sys

# Run as a script, this folder would come first on the import path, and its
# bisect.py would shadow the standard library's; the repository root goes there.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [os.path.dirname(_HERE)] + [p for p in sys.path if os.path.abspath(p or ".") != _HERE]

import argparse
import asyncio
import json
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from benchmarks import serve_workloads
from benchmarks.common import (Worker, add_record_argument, cpu_seconds, join_turns,
                               leave_turns, process_tree, record, say_ready, take_turn)
from benchmarks.models import MAX_POS, MODEL_SIZES, make_model, prompt_ids
from benchmarks.peer import peer_env, require_peer

REPO = Path(__file__).resolve().parent.parent
CONCURRENCY = (1, 16, 64)
TARGET_VS_OFFLINE = {1: 0.9, 16: 0.95, 64: 0.9}
TARGET_VS_PEER = 1.0  # at 1 and 16 clients
PEER_CHECKED_AT = (1, 16)
TTFT_VS_PEER = 1.0  # p50 and p99, at these clients
TTFT_CHECKED_AT = (16, 64)
MAX_ROUNDS = 16


def offline_child(model: str, words: int) -> None:
    """Runs in its own process (a common.Worker): loads the model once, then
    runs one offline round per line "CLIENTS NEW" and answers its tokens/s."""
    from engine import LLM, SamplingParams

    llm = LLM(model=model, dtype="float32", max_model_len=MAX_POS)
    prompts = prompt_ids(max(CONCURRENCY), words)
    llm.generate(prompt_token_ids=prompts[:2], sampling_params=SamplingParams(temperature=0,
                                                                              max_tokens=4))
    say_ready()
    for line in sys.stdin:
        c, new = map(int, line.split())
        t0 = time.perf_counter()
        outs = llm.generate(prompt_token_ids=prompts[:c], sampling_params=SamplingParams(
            temperature=0, max_tokens=new, ignore_eos=True))
        dt = time.perf_counter() - t0
        tok_s = sum(len(o.outputs[0].token_ids) for o in outs) / dt
        print("RESULT " + json.dumps({"tok_s": tok_s}), flush=True)


class Offline(Worker):
    """The offline side: a loaded LLM in a child process, one round per call."""

    def __init__(self, model: str, words: int, env, log: Path):
        super().__init__([sys.executable, __file__, "--offline-child", "--model", model,
                          "--prompt-words", str(words)], env, log, "offline run")

    def round(self, clients: int, new: int) -> dict:
        before = sum(map(cpu_seconds, process_tree(self.proc.pid)))
        r = self.ask(f"{clients} {new}")
        after = sum(map(cpu_seconds, process_tree(self.proc.pid)))
        return {**r, "cpu": {"offline": (after - before) * 1000 / (clients * new)}}


class Served:
    """A server process (ours or the peer's) on 127.0.0.1, and its start-up time."""

    def __init__(self, cmd: list[str], env, port: int, log: Path):
        import httpx2 as httpx  # the HTTP client openai uses

        self.url = f"http://127.0.0.1:{port}"
        self.log = open(log, "w")
        t0 = time.perf_counter()
        self.proc = subprocess.Popen(cmd, env=env, stdout=self.log, stderr=subprocess.STDOUT)
        while True:
            if self.proc.poll() is not None:
                sys.exit(f"{cmd[0]} exited {self.proc.returncode}; see {log}:\n"
                         f"{log.read_text()[-3000:]}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.startup = time.perf_counter() - t0
        join_turns(self)

    def close(self):
        leave_turns(self)
        self.proc.terminate()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


async def _one(url: str, model: str, prompt: list[int], new: int):
    """(output tokens, seconds to the first token, events with text) of one
    streamed request.

    The load generator shares the server's CPUs here, and every cycle it
    spends is taken from the engine's threads, so it reads the stream with
    asyncio's own streams and byte searches (about a third of the CPU time per
    event of httpx's aiter_lines, which the openai client uses), on uvloop's
    loop where installed (run()): 16 clients, 2-core Zen 4, 2 runs each, 0.049
    CPU-s per 1000 tokens on asyncio's loop, 0.029 on uvloop's. Both servers
    are measured with it."""
    host, port = url.removeprefix("http://").split(":")
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": new, "temperature": 0,
                       "ignore_eos": True, "stream": True,
                       "stream_options": {"include_usage": True}}).encode()
    t0 = time.perf_counter()
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json"
                 b"\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s"
                 % (host.encode(), len(body), body))
    status = await reader.readline()
    if b" 200 " not in status:
        raise RuntimeError(f"{url}: {status.decode().strip()}: {(await reader.read()).decode()}")
    chunked = False
    while (line := await reader.readline()) not in (b"\r\n", b""):
        chunked |= line.lower().startswith(b"transfer-encoding:") and b"chunked" in line.lower()
    ttft, usage, pending, texts = None, None, b"", 0
    while True:
        if chunked:
            size = int((await reader.readline()).split(b";")[0], 16)
            data = await reader.readexactly(size + 2)
            data = data[:-2]
        else:
            data = await reader.read(65536)
        pending += data
        *events, pending = pending.split(b"\n\n")
        for event in events:
            if b'"text":""' not in event and b'"text":' in event:
                texts += 1
                if ttft is None:
                    ttft = time.perf_counter() - t0
            if b'"usage":{' in event:
                usage = json.loads(event.removeprefix(b"data: "))["usage"]
        if not data or b"data: [DONE]" in events:
            break
    writer.close()
    return usage["completion_tokens"], ttft, texts


def run(coro):
    """uvloop's run where installed (see _one), else asyncio's: the server's
    own choice (engine/entrypoints/openai/serve.py, _runner), written again
    because importing engine here would run its start-up choices (the OpenMP
    wait policy, written into the environment every side of the run inherits)."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


async def _round(url: str, model: str, prompts, new: int):
    """(tokens/s, each request's time to first token, tokens per text event)."""
    t0 = time.perf_counter()
    res = await asyncio.gather(*(_one(url, model, p, new) for p in prompts))
    tokens = sum(n for n, _, _ in res)
    return (tokens / (time.perf_counter() - t0), [t for _, t, _ in res],
            tokens / max(sum(e for _, _, e in res), 1))


def served_round(server: Served, model: str, prompts, new: int) -> dict:
    """One round's figures, and the CPU seconds per 1000 output tokens that the
    API server, the engine core (its other processes) and this load generator
    took in it: on 2 shared cores, every one of them is time the engine lacks."""
    take_turn(server)
    tree = process_tree(server.proc.pid)

    def used() -> list[float]:  # the server's processes, then this one
        return [cpu_seconds(p) for p in tree] + [sum(os.times()[:2])]

    before = used()
    tps, ttfts, per_event = run(_round(server.url, model, prompts, new))
    spent = [a - b for a, b in zip(used(), before)]
    per = 1000 / (len(prompts) * new)
    ttfts.sort()
    return {"tok_s": tps, "ttft_p50": statistics.median(ttfts),
            "ttft_p99": ttfts[min(len(ttfts) - 1, int(0.99 * len(ttfts)))],
            "tok_per_event": per_event,
            "cpu": {"API server": spent[0] * per, "engine core": sum(spent[1:-1]) * per,
                    "load generator": spent[-1] * per}}


def measure(sides: dict, new: int, repeats: int,
            min_seconds: float = 0.0) -> dict[str, dict[int, dict]]:
    """sides: name -> round(clients, new) -> {"tok_s": ...}. Per side and
    concurrency, the fastest of at least `repeats` rounds, the sides taking
    turns, and more until every side has run min_seconds of rounds (at most
    MAX_ROUNDS): this machine's speed swings 15% between 0.6 s rounds, and the
    fastest of 4 such rounds put one side 1.2x above the other either way."""
    out: dict[str, dict[int, dict]] = {name: {} for name in sides}
    for c in CONCURRENCY:
        spent = dict.fromkeys(sides, 0.0)
        rounds = 0
        while rounds < repeats or (min(spent.values()) < min_seconds and rounds < MAX_ROUNDS):
            rounds += 1
            for name, one_round in sides.items():
                t0 = time.perf_counter()
                r = one_round(c, new)
                spent[name] += time.perf_counter() - t0
                if r["tok_s"] > out[name].get(c, {}).get("tok_s", 0.0):
                    out[name][c] = r
    return out


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model-size", default="small", choices=sorted(MODEL_SIZES))
    p.add_argument("--peer", choices=["vllm"], default=None)
    p.add_argument("--check", action="store_true", help="exit 1 when a target is missed")
    add_record_argument(p)
    p.add_argument("--new", type=int, default=128)
    p.add_argument("--prompt-words", type=int, default=32)
    p.add_argument("--stream-interval", default=None,
                   help="engine serve's --stream-interval (default: the server's own)")
    p.add_argument("--threads", default="0-1", help="CPUs for both engines (default 0-1)")
    p.add_argument("--min-seconds", type=float, default=8.0,
                   help="then more rounds until each side has run this long (default 8)")
    p.add_argument("--repeats", type=int, default=3,
                   help="rounds per concurrency and side; the fastest counts (default 3)")
    p.add_argument("--offline-child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--model", help=argparse.SUPPRESS)
    serve_workloads.add_arguments(p)
    a = p.parse_args()
    if a.offline_child:
        offline_child(a.model, a.prompt_words)
        return 0
    if a.workload != "throughput":
        return serve_workloads.main(a, REPO, sys.modules[__name__])  # its Served, _one
    env = peer_env(a.threads)
    peer_python = require_peer() if a.peer else None
    servers: list[Served] = []
    with tempfile.TemporaryDirectory() as tmp:
        model = str(make_model(Path(tmp) / "model", a.model_size))
        print(f"model: random Llama '{a.model_size}' {MODEL_SIZES[a.model_size]}, float32; "
              f"{a.prompt_words}-word prompts, {a.new} new tokens, greedy, CPUs {a.threads}")
        offline = Offline(model, a.prompt_words, env, Path(tmp) / "offline.log")
        try:
            port = free_port()
            servers.append(Served(
                [sys.executable, "-m", "engine.cli", "serve", model, "--port", str(port),
                 "--dtype", "float32", "--max-model-len", str(MAX_POS),
                 "--served-model-name", "m", "--uvicorn-log-level", "warning",
                 *(["--stream-interval", a.stream_interval] if a.stream_interval else [])],
                {**env, "PYTHONPATH": str(REPO)}, port, Path(tmp) / "engine.log"))
            if peer_python:
                port = free_port()
                servers.append(Served(
                    [str(peer_python), "-m", "vllm.entrypoints.openai.api_server",
                     "--model", model, "--served-model-name", "m", "--dtype", "float32",
                     "--max-model-len", str(MAX_POS), "--port", str(port), "--host",
                     "127.0.0.1"], env, port, Path(tmp) / "vllm.log"))
            prompts = prompt_ids(max(CONCURRENCY), a.prompt_words)
            sides = {"offline": offline.round}
            for name, server in zip(("served", "peer"), servers):
                take_turn(server)
                run(_round(server.url, "m", prompts[:2], 4))  # warm-up
                sides[name] = (lambda server: lambda c, new: served_round(
                    server, "m", prompts[:c], new))(server)
            got = measure(sides, a.new, a.repeats, a.min_seconds)
        finally:
            for server in servers:
                server.close()
            offline.close()
    base = {c: r["tok_s"] for c, r in got["offline"].items()}
    base_cpu = {c: r["cpu"]["offline"] for c, r in got["offline"].items()}
    return report(a, base, got["served"], servers[0].startup, got.get("peer"),
                  servers[1].startup if peer_python else None, base_cpu)


def report(a, base, served, startup, peer, peer_startup, base_cpu) -> int:
    print(f"start-up to /health: engine serve {startup:.1f} s"
          + (f", vllm serve {peer_startup:.1f} s" if peer else ""))
    head = f"{'clients':>7} {'offline tok/s':>14} {'served tok/s':>13} {'vs offline':>11} " \
           f"{'TTFT p50':>9} {'TTFT p99':>9} {'tok/event':>9}"
    if peer:
        head += (f" {'vllm tok/s':>11} {'vs vllm':>8} {'vllm TTFT p50':>14} {'p99':>6}"
                 f" {'tok/event':>9}")
    print(head)
    missed, rows = [], []
    for c in CONCURRENCY:
        s = served[c]
        r, target = s["tok_s"] / base[c], TARGET_VS_OFFLINE[c]
        line = (f"{c:>7} {base[c]:>14.1f} {s['tok_s']:>13.1f} {r:>10.2f}x "
                f"{s['ttft_p50'] * 1e3:>7.0f}ms {s['ttft_p99'] * 1e3:>7.0f}ms "
                f"{s['tok_per_event']:>9.2f}")
        rows.append((f"{c} clients: served vs offline tok/s",
                     f"{r:.2f}x ({s['tok_s']:.0f} vs {base[c]:.0f}; TTFT p50 "
                     f"{s['ttft_p50'] * 1e3:.0f} ms; {s['tok_per_event']:.1f} tokens/event)",
                     f">= {target}x {'met' if r >= target else 'missed'}"))
        if r < target:
            missed.append(f"{c} clients: served/offline {r:.2f}x < {target}x")
        if peer:
            q = s["tok_s"] / peer[c]["tok_s"]
            line += (f" {peer[c]['tok_s']:>11.1f} {q:>7.2f}x {peer[c]['ttft_p50'] * 1e3:>12.0f}ms"
                     f" {peer[c]['ttft_p99'] * 1e3:>4.0f}ms {peer[c]['tok_per_event']:>9.2f}")
            for p in ("p50", "p99") if c in TTFT_CHECKED_AT else ():
                t = s[f"ttft_{p}"] / peer[c][f"ttft_{p}"]
                rows.append((f"{c} clients: TTFT {p} vs vllm serve",
                             f"{t:.2f}x ({s[f'ttft_{p}'] * 1e3:.0f} vs "
                             f"{peer[c][f'ttft_{p}'] * 1e3:.0f} ms)",
                             f"<= {TTFT_VS_PEER}x {'met' if t <= TTFT_VS_PEER else 'missed'}"))
                if t > TTFT_VS_PEER:
                    missed.append(f"{c} clients: TTFT {p} vs vllm {t:.2f}x > {TTFT_VS_PEER}x")
            rows.append((f"{c} clients: served vs vllm serve tok/s",
                         f"{q:.2f}x ({s['tok_s']:.0f} vs {peer[c]['tok_s']:.0f})",
                         (f">= {TARGET_VS_PEER}x {'met' if q >= TARGET_VS_PEER else 'missed'}"
                          if c in PEER_CHECKED_AT else "-")))
            if c in PEER_CHECKED_AT and q < TARGET_VS_PEER:
                missed.append(f"{c} clients: served/vllm {q:.2f}x < {TARGET_VS_PEER}x")
        print(line)
    print("CPU seconds per 1000 output tokens, fastest rounds (offline: its whole process):")
    for c in CONCURRENCY:
        cpu = served[c]["cpu"]
        print(f"{c:>7} clients: offline {base_cpu[c]:.3f}; served "
              + ", ".join(f"{k} {v:.3f}" for k, v in cpu.items())
              + f" (sum {sum(cpu.values()):.3f})")
    print(f"targets: served >= {TARGET_VS_OFFLINE} x offline (by clients)"
          + (f"; >= {TARGET_VS_PEER}x vllm serve at {PEER_CHECKED_AT} clients; TTFT p50/p99 "
             f"<= {TTFT_VS_PEER}x vllm's at {TTFT_CHECKED_AT} clients" if peer else ""))
    for m in missed:
        print(f"MISSED: {m}")
    if a.record:
        rows.append(("start-up to /health", f"{startup:.1f} s"
                     + (f" (vllm serve {peer_startup:.1f} s)" if peer else ""), "-"))
        record(f"serve --model-size {a.model_size}", rows)
    return 1 if (a.check and missed) else 0


if __name__ == "__main__":
    sys.exit(main())
