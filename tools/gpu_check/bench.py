"""The kernels against eager torch on one device, timed in the same run.

Baselines are the fair eager versions: torch.nn.functional.rms_norm beside the
hand-written reference, SiLU-and-mul in the input's dtype, and paged attention
as a per-sequence gather of exactly the blocks each sequence uses plus SDPA.
"""
from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F

from benchmarks.common import Targets, median_time
from engine import ops, reference
from tools.gpu_check.ops import _cos_sin_cache, make_paged


def _timer(device: str) -> Callable[[Callable[[], object]], float]:
    sync = torch.cuda.synchronize if torch.device(device).type == "cuda" else (lambda: None)

    def timed(fn):
        def call():
            fn()
            sync()
        return median_time(call, repeat=5, min_time=0.02)
    return timed


def _gather_sdpa(out, q, kc, vc, tables, lens_list, scale):
    """Per sequence: gather its own blocks, attend with SDPA (GQA)."""
    bs = kc.shape[2]
    for s, n in enumerate(lens_list):
        blocks = tables[s, :math.ceil(n / bs)].long()
        k = kc[blocks].transpose(0, 1).reshape(kc.shape[1], -1, kc.shape[3])[:, :n]
        v = vc[blocks].transpose(0, 1).reshape(vc.shape[1], -1, vc.shape[3])[:, :n]
        out[s] = F.scaled_dot_product_attention(q[s][:, None], k, v, scale=scale,
                                                enable_gqa=True)[:, 0]


def run(device: str, targets: Targets, small: bool = False, log=print) -> None:
    timed = _timer(device)
    rows, hidden, inter = (8, 256, 512) if small else (256, 4096, 11008)
    seq_lens = [33, 70] if small else [1024 + 64 * i for i in range(16)]
    for dtype in (torch.float32, torch.bfloat16):
        name = str(dtype).removeprefix("torch.")
        g = torch.Generator().manual_seed(0)
        x = torch.randn(rows, hidden, generator=g).to(dtype=dtype, device=device)
        w = torch.randn(hidden, generator=g).to(dtype=dtype, device=device)
        out = torch.empty_like(x)
        k = timed(lambda: ops.rms_norm(out, x, w, 1e-6))
        eager = min(timed(lambda: reference.rms_norm(out, x, w, 1e-6)),
                    timed(lambda: F.rms_norm(x, (hidden,), w, 1e-6)))
        targets.record(f"rms_norm {name} vs eager [{device}]", eager / k, 1.0)

        gu = torch.randn(rows, 2 * inter, generator=g).to(dtype=dtype, device=device)
        o = torch.empty(rows, inter, dtype=dtype, device=device)
        k = timed(lambda: ops.silu_and_mul(o, gu))
        eager = timed(lambda: F.silu(gu[:, :inter]) * gu[:, inter:])
        targets.record(f"silu_and_mul {name} vs eager [{device}]", eager / k, 1.0)

        heads, kv, hs = 32, 8, 128
        cache = _cos_sin_cache(4096, hs, dtype, device)
        pos = torch.randint(0, 4096, (rows,), generator=g).to(device)
        q = torch.randn(rows, heads * hs, generator=g).to(dtype=dtype, device=device)
        kk = torch.randn(rows, kv * hs, generator=g).to(dtype=dtype, device=device)
        k = timed(lambda: ops.rotary_embedding(pos, q, kk, hs, cache, True))
        eager = timed(lambda: reference.rotary_embedding(pos, q, kk, hs, cache, True))
        targets.record(f"rotary_embedding {name} vs eager [{device}]", eager / k, 1.0)

        q, kc, vc, tables, lens = make_paged(seq_lens, heads, kv, hs, 16, dtype, device)
        out = torch.empty_like(q)
        k = timed(lambda: ops.paged_attention(out, q, kc, vc, tables, lens, hs ** -0.5))
        eager = timed(lambda: _gather_sdpa(out, q, kc, vc, tables, seq_lens, hs ** -0.5))
        targets.record(f"paged_attention {name} vs gather+SDPA [{device}]", eager / k, 1.0)
    log(targets.table())
