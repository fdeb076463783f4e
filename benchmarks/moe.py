"""The fused MoE kernel (engine.ops.fused_moe) against the per-expert eager
loop it replaces (transformers' MixtralExperts.forward: one_hot mask, a Python
loop over the experts hit, two F.linear and an index_add_ each), same weights,
same routing, same process, in turn.

    python benchmarks/moe.py [--check] [--record]

Shapes: a Qwen3-MoE-like layer scaled down (hidden 1024, 64 experts of 384
columns, top 8) and a Mixtral-like one (hidden 1024, 8 experts of 2816, top 2);
tokens 1 and 16 (decode) and 512 (a prefill chunk); float32 and bfloat16.
Target (--check): >= 3x the eager loop in every cell. Threads: torch's default
(OMP_NUM_THREADS); the CPU and the kernel's code path are printed.
"""
from __future__ import annotations

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [os.path.dirname(_HERE)] + [p for p in sys.path if os.path.abspath(p or ".") != _HERE]

import argparse  # noqa: E402

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from benchmarks.common import Targets, add_check_argument, cpu_model, median_time  # noqa: E402
from engine import ops  # noqa: E402
from engine.model_executor.layers.fused_moe import pack_experts, select_experts  # noqa: E402

TARGET = 3.0
# name -> (hidden, experts, intermediate, top_k)
SHAPES = {"qwen3-moe-like": (1024, 64, 384, 8), "mixtral-like": (1024, 8, 2816, 2)}
TOKENS = (1, 16, 512)


def eager(x, w13, w2, weights, ids):
    """transformers' MixtralExperts.forward, as written there."""
    out = torch.zeros_like(x)
    num_experts = w13.shape[0]
    with torch.no_grad():
        mask = F.one_hot(ids.long(), num_classes=num_experts + 1).permute(2, 1, 0)
        hit = torch.greater(mask.sum(dim=(-1, -2)), 0).nonzero()
    for e in hit:
        e = e[0]
        if e == num_experts:
            continue
        pos, tok = torch.where(mask[e])
        gate, up = F.linear(x[tok], w13[e]).chunk(2, dim=-1)
        h = F.linear(F.silu(gate) * up, w2[e]) * weights[tok, pos, None]
        out.index_add_(0, tok, h.to(out.dtype))
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_check_argument(p)
    a = p.parse_args()
    if not ops.has_fused_moe():
        sys.exit("no fused MoE kernel on this build / CPU code path; nothing to measure")
    print(f"CPU: {cpu_model()}; kernel code path {ops.cpu_isa()}; "
          f"{torch.get_num_threads()} threads")
    print(f"{'shape':<16} {'dtype':<9} {'tokens':>6} {'fused ms':>9} {'eager ms':>9} {'ratio':>7}")
    targets = Targets()
    g = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        for name, (h, e, i, k) in SHAPES.items():
            for dtype in (torch.float32, torch.bfloat16):
                w13 = (torch.randn(e, 2 * i, h, generator=g) * 0.02).to(dtype)
                w2 = (torch.randn(e, h, i, generator=g) * 0.02).to(dtype)
                kp = ops.panel_k_pack(dtype)
                p13, p2 = pack_experts(w13, kp), pack_experts(w2, kp)
                for t in TOKENS:
                    x = torch.randn(t, h, generator=g).to(dtype)
                    weights, ids = select_experts(torch.randn(t, e, generator=g), k, True)
                    out = torch.empty_like(x)
                    fused = median_time(lambda: ops.fused_moe(out, x, p13, p2, weights, ids, i))
                    slow = median_time(lambda: eager(x, w13, w2, weights, ids))
                    dt = str(dtype).removeprefix("torch.")
                    print(f"{name:<16} {dt:<9} {t:>6} {fused * 1e3:>9.2f} {slow * 1e3:>9.2f} "
                          f"{slow / fused:>6.2f}x")
                    targets.record(f"{name} {dt} {t} tokens: fused vs eager loop", slow / fused,
                                   TARGET)
    return targets.finish(a.check, record_as="moe" if a.record else None)


if __name__ == "__main__":
    sys.exit(main())
