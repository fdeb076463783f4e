"""Every compiled op against its pure-torch twin (engine.reference) on one
device: float32 and bfloat16, odd sizes, GQA, strided views, padding slots,
and the bound checks (on a GPU they run only with VLLM_CHECK_BOUNDS=1)."""
from __future__ import annotations

import math
from collections.abc import Callable

import torch

from engine import ops, reference

DTYPES = (torch.float32, torch.bfloat16)
# float32 differs by summation order only; bfloat16 is rounded once from float32.
TOL = {torch.float32: (2e-5, 2e-5), torch.bfloat16: (1.6e-2, 1.6e-2)}  # (atol, rtol)


def _close(a: torch.Tensor, b: torch.Tensor, dtype: torch.dtype) -> None:
    atol, rtol = TOL[dtype]
    torch.testing.assert_close(a.float().cpu(), b.float().cpu(), atol=atol, rtol=rtol)


def _rand(seed: int, dtype, device):
    """A generator, and randn(*shape) of the dtype on the device, reproducible (drawn on
    the CPU, so every device gets the same numbers)."""
    g = torch.Generator().manual_seed(seed)
    return g, lambda *shape: torch.randn(*shape, generator=g).to(dtype=dtype, device=device)


def rms_norm(device, dtype):
    g, randn = _rand(0, dtype, device)
    for rows, hidden in ((1, 1), (7, 17), (33, 4097), (3, 4096)):
        x, w = randn(rows, hidden), randn(hidden)
        out, ref = torch.empty_like(x), torch.empty_like(x)
        ops.rms_norm(out, x, w, 1e-6)
        reference.rms_norm(ref, x, w, 1e-6)
        _close(out, ref, dtype)
    wide = randn(5, 3 * 96)[:, 96:192]  # a strided view
    w = randn(96)
    out = torch.empty(5, 96, dtype=dtype, device=device)
    ref = torch.empty_like(out)
    ops.rms_norm(out, wide, w, 1e-5)
    reference.rms_norm(ref, wide, w, 1e-5)
    _close(out, ref, dtype)


def fused_add_rms_norm(device, dtype):
    g, randn = _rand(1, dtype, device)
    for rows, hidden in ((1, 3), (9, 257), (16, 4096)):
        x, r = randn(rows, hidden), randn(rows, hidden)
        w = randn(hidden)
        x2, r2 = x.clone(), r.clone()
        ops.fused_add_rms_norm(x, r, w, 1e-6)
        reference.fused_add_rms_norm(x2, r2, w, 1e-6)
        _close(x, x2, dtype)
        _close(r, r2, dtype)


def silu_and_mul(device, dtype):
    g, randn = _rand(2, dtype, device)
    for shape in ((1, 2), (5, 2 * 17), (3, 4, 2 * 1000), (64, 2 * 5504)):
        x = randn(*shape)
        out = torch.empty_like(x[..., : shape[-1] // 2])
        ref = torch.empty_like(out)
        ops.silu_and_mul(out, x)
        reference.silu_and_mul(ref, x)
        _close(out, ref, dtype)


def _cos_sin_cache(max_pos: int, rot_dim: int, dtype, device) -> torch.Tensor:
    inv = 1.0 / (10000 ** (torch.arange(0, rot_dim, 2).float() / rot_dim))
    freqs = torch.outer(torch.arange(max_pos).float(), inv)
    return torch.cat([freqs.cos(), freqs.sin()], -1).to(dtype=dtype, device=device)


def rotary_embedding(device, dtype):
    g, randn = _rand(3, dtype, device)
    for is_neox in (True, False):
        # GQA (8 query heads over 2 key heads), odd head sizes, partial rotation
        for tokens, qh, kh, hs, rot in ((1, 1, 1, 64, 64), (13, 8, 2, 80, 80), (33, 3, 1, 36, 36),
                                        (7, 4, 4, 64, 32)):
            cache = _cos_sin_cache(4096, rot, dtype, device)
            pos = torch.randint(0, 4096, (tokens,), generator=g).to(device)
            q = randn(tokens, qh * hs)
            k = randn(tokens, kh, hs)
            q2, k2 = q.clone(), k.clone()
            ops.rotary_embedding(pos, q, k, hs, cache, is_neox)
            reference.rotary_embedding(pos, q2, k2, hs, cache, is_neox)
            _close(q, q2, dtype)
            _close(k, k2, dtype)
    # strided views of one fused qkv projection, batched positions
    heads, kv, hs, b, s = 4, 2, 64, 2, 5
    qkv = randn(b, s, (heads + 2 * kv) * hs)
    q, k, _ = qkv.split([heads * hs, kv * hs, kv * hs], dim=-1)
    pos = torch.randint(0, 100, (b, s), generator=g).to(device)
    cache = _cos_sin_cache(100, hs, dtype, device)
    q2, k2 = q.clone(), k.clone()
    ops.rotary_embedding(pos, q, k, hs, cache, True)
    reference.rotary_embedding(pos, q2, k2, hs, cache, True)
    _close(q, q2, dtype)
    _close(k, k2, dtype)


def reshape_and_cache(device, dtype):
    g, randn = _rand(4, dtype, device)
    blocks, kv_heads, bs, hs, tokens = 6, 3, 16, 40, 37
    key = randn(tokens, kv_heads, hs)
    value = randn(tokens, kv_heads, hs)
    slots = torch.randperm(blocks * bs, generator=g)[:tokens]
    slots[::5] = -1  # padding tokens are not stored
    slots = slots.to(device)
    kc = torch.zeros(blocks, kv_heads, bs, hs, dtype=dtype, device=device)
    vc = torch.zeros_like(kc)
    kc2, vc2 = kc.clone(), vc.clone()
    ops.reshape_and_cache(key, value, kc, vc, slots)
    reference.reshape_and_cache(key, value, kc2, vc2, slots)
    assert torch.equal(kc, kc2) and torch.equal(vc, vc2), "caches differ from the reference"


def make_paged(seq_lens, heads, kv_heads, head_size, block_size, dtype, device, seed=0):
    g, randn = _rand(seed, dtype, device)
    nblk = [math.ceil(n / block_size) for n in seq_lens]
    total = sum(nblk) + 3
    kc = randn(total, kv_heads, block_size, head_size)
    vc = randn(total, kv_heads, block_size, head_size)
    perm = torch.randperm(total, generator=g).tolist()
    tables = torch.zeros(len(seq_lens), max(nblk + [1]), dtype=torch.int32)
    i = 0
    for s, n in enumerate(nblk):
        tables[s, :n] = torch.tensor(perm[i:i + n], dtype=torch.int32)
        i += n
    q = randn(len(seq_lens), heads, head_size)
    return q, kc, vc, tables.to(device), torch.tensor(seq_lens, dtype=torch.int32, device=device)


def paged_attention(device, dtype):
    for gqa in (1, 4, 8):
        for seq_lens, hs, bs in (([1], 64, 16), ([5, 17, 100, 1, 33, 0], 80, 16),
                                 ([300, 129, 2, 64], 128, 32), ([7] * 20, 36, 32)):
            q, kc, vc, tables, lens = make_paged(seq_lens, 2 * gqa, 2, hs, bs, dtype, device,
                                                 seed=len(seq_lens))
            out, ref = torch.empty_like(q), torch.empty_like(q)
            ops.paged_attention(out, q, kc, vc, tables, lens, hs ** -0.5)
            reference.paged_attention(ref, q.float(), kc.float(), vc.float(), tables, lens,
                                      hs ** -0.5)
            _close(out, ref, dtype)


def bound_checks(device, dtype):
    """With the checks on (always on the CPU), an index past the cache is an
    IndexError naming the argument, not an out-of-bounds access."""
    on_gpu = torch.device(device).type != "cpu"
    if on_gpu:
        torch.ops._C.set_device_bound_checks(True)
    try:
        q, kc, vc, tables, lens = make_paged([20, 9], 4, 2, 64, 16, dtype, device)
        bad = tables.clone().fill_(kc.shape[0])
        try:
            ops.paged_attention(torch.empty_like(q), q, kc, vc, bad, lens, 0.125)
        except IndexError as exc:
            assert "block_tables" in str(exc), exc
        else:
            raise AssertionError("paged_attention accepted a block table past the cache")
        key = torch.zeros(3, 2, 64, dtype=dtype, device=device)
        slots = torch.tensor([0, 1, kc.shape[0] * 16], device=device)
        try:
            ops.reshape_and_cache(key, key, kc, vc, slots)
        except IndexError as exc:
            assert "slot_mapping" in str(exc), exc
        else:
            raise AssertionError("reshape_and_cache accepted a slot past the cache")
    finally:
        if on_gpu:
            from engine import envs

            torch.ops._C.set_device_bound_checks(envs.check_bounds())


CHECKS: tuple[Callable, ...] = (rms_norm, fused_add_rms_norm, silu_and_mul, rotary_embedding,
                                reshape_and_cache, paged_attention, bound_checks)


def run(device: str, log=print) -> list[str]:
    """Run every check in both dtypes; return the failures (empty: all passed)."""
    failures = []
    for check in CHECKS:
        for dtype in DTYPES:
            name = f"{check.__name__} [{str(dtype).removeprefix('torch.')}, {device}]"
            try:
                check(device, dtype)
                if torch.device(device).type == "cuda":
                    torch.cuda.synchronize()  # an asynchronous kernel fault surfaces here
            except Exception as exc:  # each failure is reported, the others still run
                failures.append(f"{name}: {type(exc).__name__}: {str(exc).splitlines()[0]}")
                log(f"FAIL {failures[-1]}")
            else:
                log(f"ok   {name}")
    return failures
