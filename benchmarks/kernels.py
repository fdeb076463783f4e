"""Each compiled kernel against its torch eager reference, same inputs, same process.

    python benchmarks/kernels.py [--isa auto|avx2|avx512|neon|neon_bf16] [--threads N] [--quick]

Under user-mode qemu (an aarch64 build on an x86_64 host, see ci/setup-aarch64.sh)
every ratio is marked "emulated" and no target applies: emulation says nothing
about real ARM speed, only that the benchmark runs there. --quick shrinks the
shapes so that an emulated run takes a minute or two.

Targets on the 2-core dev machine (fp32 and bf16): rms_norm and
fused_add_rms_norm >= 2x, silu_and_mul >= 1.5x, rotary_embedding >= 2x,
paged_attention (16 sequences of 1-2k tokens) >= 1.5x faster than gathering
the blocks and calling scaled_dot_product_attention.
"""
from __future__ import annotations

import os
import sys

# Run as a script, this folder would come first on the import path, and its
# bisect.py would shadow the standard library's; the repository root goes there.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [os.path.dirname(_HERE)] + [p for p in sys.path if os.path.abspath(p or ".") != _HERE]

import argparse
import math

import torch

from benchmarks.common import fmt_time, median_time  # noqa: E402

import engine  # noqa: E402
from engine import ops, reference  # noqa: E402

TARGETS = {"rms_norm": 2.0, "fused_add_rms_norm": 2.0, "silu_and_mul": 1.5,
           "rotary_embedding": 2.0, "paged_attention": 1.5, "reshape_and_cache": None}


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


def cases(dtype, quick=False):
    g = torch.Generator().manual_seed(0)
    tokens, hidden, inter = (32, 1024, 2816) if quick else (256, 4096, 11008)
    x = torch.randn(tokens, hidden, generator=g).to(dtype)
    w = torch.randn(hidden, generator=g).to(dtype)
    out = torch.empty_like(x)
    yield "rms_norm", f"[{tokens}, {hidden}]", (
        lambda: ops.rms_norm(out, x, w, 1e-6), lambda: reference.rms_norm(out, x, w, 1e-6))

    r = torch.randn(tokens, hidden, generator=g).to(dtype)
    x1, r1 = x.clone(), r.clone()
    yield "fused_add_rms_norm", f"[{tokens}, {hidden}]", (
        lambda: ops.fused_add_rms_norm(x1, r1, w, 1e-6),
        lambda: reference.fused_add_rms_norm(x1, r1, w, 1e-6))

    gu = torch.randn(tokens, 2 * inter, generator=g).to(dtype)
    act = torch.empty(tokens, inter, dtype=dtype)
    yield "silu_and_mul", f"[{tokens}, 2x{inter}]", (
        lambda: ops.silu_and_mul(act, gu), lambda: reference.silu_and_mul(act, gu))

    heads, kv, hs = 32, 8, 128
    inv = 1.0 / (10000 ** (torch.arange(0, hs, 2).float() / hs))
    f = torch.outer(torch.arange(4096).float(), inv)
    cache = torch.cat([f.cos(), f.sin()], -1).to(dtype)
    pos = torch.randint(0, 4096, (tokens,), generator=g)
    q = torch.randn(tokens, heads * hs, generator=g).to(dtype)
    k = torch.randn(tokens, kv * hs, generator=g).to(dtype)
    yield "rotary_embedding", f"{tokens} tok, {heads}/{kv} heads x {hs}", (
        lambda: ops.rotary_embedding(pos, q, k, hs, cache, True),
        lambda: reference.rotary_embedding(pos, q, k, hs, cache, True))

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
    yield "paged_attention", f"{seqs} seqs x {lo}-{hi - 1} tok, {heads}/{kv} heads", (
        lambda: ops.paged_attention(od, qd, kc, vc, tables, lens, hs ** -0.5),
        lambda: reference.paged_attention(od, qd, kc, vc, tables, lens, hs ** -0.5))

    kn = torch.randn(tokens, kv, hs, generator=g).to(dtype)
    slots = torch.randperm(total * bs, generator=g)[:tokens]
    kc2, vc2 = kc.clone(), vc.clone()
    yield "reshape_and_cache", f"{tokens} tok, {kv} kv heads", (
        lambda: ops.reshape_and_cache(kn, kn, kc2, vc2, slots),
        lambda: reference.reshape_and_cache(kn, kn, kc2, vc2, slots))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--isa", default="auto")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--dtype", choices=["float32", "bfloat16", "both"], default="both")
    p.add_argument("--quick", action="store_true", help="small shapes (emulated runs)")
    args = p.parse_args()
    emul = emulated()
    if args.threads:
        torch.set_num_threads(args.threads)
    if not engine.BUILD_INFO.has_kernels:
        sys.exit("engine has no compiled kernels; install the cpu variant first")
    isa = ops.select_cpu_isa(args.isa)
    print(f"vllm-engine {engine.__version__}  isa={isa}  torch {torch.__version__}  "
          f"threads={torch.get_num_threads()}"
          + ("  EMULATED (qemu): ratios say nothing about ARM speed; no targets" if emul else ""))
    print(f"{'op':<20} {'dtype':<9} {'shape':<34} {'kernel':>11} {'torch ref':>11} "
          f"{'speedup':>8} {'target':>7}")
    dtypes = {"float32": [torch.float32], "bfloat16": [torch.bfloat16],
              "both": [torch.float32, torch.bfloat16]}[args.dtype]
    missed = 0
    for dtype in dtypes:
        for name, shape, (ours, ref) in cases(dtype, args.quick):
            reps = dict(repeat=3, min_time=0.01) if emul else {}
            t_ours, t_ref = median_time(ours, **reps), median_time(ref, **reps)
            ratio = t_ref / t_ours
            target = None if emul else TARGETS[name]
            ok = "" if target is None else ("ok" if ratio >= target else "MISS")
            missed += ok == "MISS"
            print(f"{name:<20} {str(dtype)[6:]:<9} {shape:<34} {fmt_time(t_ours):>11} "
                  f"{fmt_time(t_ref):>11} {ratio:7.2f}x {('>=' + str(target)) if target else '-':>5} "
                  f"{'emulated' if emul else ok}")
    print(f"{missed} target(s) missed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
