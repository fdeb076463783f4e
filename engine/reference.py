"""Pure-torch references of every op, with the ops' exact signatures.

The tests compare the kernels against these; the `empty` variant (no compiled
kernels) runs them; the benchmarks time the kernels against them. Norms,
activations and rotary embeddings compute in float32 and round once, as the
kernels do; paged attention gathers the blocks and calls SDPA, the baseline a
kernel-less engine would use.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

# Columns per panel of a packed linear weight (csrc/cpu/kernels.h kPanel): one
# AVX-512 vector, two AVX2 ones. The packed layout is the op's contract, so it
# lives with the op's reference; engine.ops re-exports it.
PANEL = 16


def rms_norm(out: torch.Tensor, input: torch.Tensor, weight: torch.Tensor, epsilon: float) -> None:
    x = input.float()
    var = x.pow(2).mean(-1, keepdim=True)
    out.copy_((x * torch.rsqrt(var + epsilon) * weight.float()).to(out.dtype))


def fused_add_rms_norm(input: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                       epsilon: float) -> None:
    residual.copy_((input.float() + residual.float()).to(residual.dtype))
    rms_norm(input, residual, weight, epsilon)


def silu_and_mul(out: torch.Tensor, input: torch.Tensor) -> None:
    d = input.shape[-1] // 2
    x = input.float()
    out.copy_((F.silu(x[..., :d]) * x[..., d:]).to(out.dtype))


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, tokens: int,
            head_size: int, is_neox: bool) -> None:
    v = x.reshape(tokens, -1, head_size).clone()
    rot = cos.shape[-1] * 2
    r = v[..., :rot].float()
    if is_neox:
        x1, x2 = r.chunk(2, dim=-1)
    else:
        x1, x2 = r[..., 0::2], r[..., 1::2]
    c, s = cos[:, None, :], sin[:, None, :]
    o1, o2 = x1 * c - x2 * s, x2 * c + x1 * s
    new = torch.cat([o1, o2], -1) if is_neox else torch.stack([o1, o2], -1).flatten(-2)
    v[..., :rot] = new.to(x.dtype)
    x.copy_(v.view(x.shape))


def rotary_embedding(positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor | None,
                     head_size: int, cos_sin_cache: torch.Tensor, is_neox: bool) -> None:
    tokens = positions.numel()
    cos, sin = cos_sin_cache[positions.reshape(-1)].float().chunk(2, dim=-1)
    _rotate(query, cos, sin, tokens, head_size, is_neox)
    if key is not None:
        _rotate(key, cos, sin, tokens, head_size, is_neox)


def reshape_and_cache(key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor,
                      value_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    block_size = key_cache.shape[2]
    keep = slot_mapping >= 0
    slots = slot_mapping[keep]
    blocks, offsets = slots // block_size, slots % block_size
    key_cache[blocks, :, offsets] = key[keep]
    value_cache[blocks, :, offsets] = value[keep]


def paged_attention(out: torch.Tensor, query: torch.Tensor, key_cache: torch.Tensor,
                    value_cache: torch.Tensor, block_tables: torch.Tensor,
                    seq_lens: torch.Tensor, scale: float) -> None:
    num_seqs, heads, head_size = query.shape
    _, kv_heads, block_size, _ = key_cache.shape
    max_len = int(seq_lens.max()) if num_seqs else 0
    if max_len == 0:
        out.zero_()
        return
    nblk = (max_len + block_size - 1) // block_size
    tables = block_tables[:, :nblk].long()

    def gather(cache: torch.Tensor) -> torch.Tensor:  # [seqs, kv_heads, max_len, head_size]
        g = cache[tables]  # [seqs, nblk, kv_heads, block_size, head_size]
        return g.permute(0, 2, 1, 3, 4).reshape(num_seqs, kv_heads, nblk * block_size,
                                                head_size)[:, :, :max_len]

    k, v = gather(key_cache), gather(value_cache)
    mask = torch.arange(max_len, device=seq_lens.device)[None, :] < seq_lens[:, None].long()
    o = F.scaled_dot_product_attention(query[:, :, None, :], k, v, attn_mask=mask[:, None, None, :],
                                       scale=scale, enable_gqa=kv_heads != heads)
    o = o[:, :, 0, :]
    o[seq_lens == 0] = 0
    out.copy_(o)


def paged_prefill_attention(out: torch.Tensor, query: torch.Tensor, key_cache: torch.Tensor,
                            value_cache: torch.Tensor, block_tables: torch.Tensor,
                            query_start_loc: torch.Tensor, seq_lens: torch.Tensor, scale: float,
                            sliding_window: int) -> None:
    """Sequence b's queries (rows query_start_loc[b]..[b+1]-1) are the last q_len of its
    seq_lens[b] cached tokens; each attends the cached keys at positions <= its own
    (and > its own - sliding_window when sliding_window > 0), in float32."""
    _, kv_heads, block_size, head_size = key_cache.shape
    heads = query.shape[1]
    starts, lens = query_start_loc.tolist(), seq_lens.tolist()
    for b, n in enumerate(lens):
        q0, q1 = starts[b], starts[b + 1]
        if q1 == q0:
            continue
        nblk = -(-n // block_size)
        blocks = block_tables[b, :nblk].long()

        k, v = (c[blocks].permute(1, 0, 2, 3).reshape(kv_heads, -1, head_size)[:, :n].float()
                for c in (key_cache, value_cache))  # [kv_heads, n, head_size]
        q_pos = torch.arange(n - (q1 - q0), n, device=query.device)[:, None]
        k_pos = torch.arange(n, device=query.device)[None, :]
        mask = k_pos <= q_pos
        if sliding_window > 0:
            mask &= k_pos > q_pos - sliding_window
        o = F.scaled_dot_product_attention(query[q0:q1].float().transpose(0, 1), k, v,
                                           attn_mask=mask, scale=scale,
                                           enable_gqa=kv_heads != heads)
        out[q0:q1] = o.transpose(0, 1).to(out.dtype)


def linear(out: torch.Tensor, input: torch.Tensor, packed_weight: torch.Tensor,
           bias: torch.Tensor | None) -> None:
    """The panel kernel's reference: unpack [ceil(N/16), K, 16] (or its k pairs,
    [ceil(N/16), ceil(K/2), 32]) and F.linear in float32."""
    w = unpack_panels(packed_weight, out.shape[1], input.shape[1])
    out.copy_(F.linear(input.float(), w.float(), None if bias is None else bias.float()))


def quant_int8_rows(input: torch.Tensor, input_scale: torch.Tensor | None = None):
    """int8 activations and their float32 scales [M, 1]: dynamic per row
    (max|x| / 127, 1 for a zero row) or one static scale; x / scale rounded to
    nearest even and clamped to [-128, 127], as the int8_linear kernel does."""
    x = input.float()
    if input_scale is None:
        s = x.abs().amax(-1, keepdim=True) / 127.0
        s = torch.where(s == 0, torch.ones_like(s), s)
    else:
        s = input_scale.float().reshape(1, 1).expand(x.shape[0], 1)
    return torch.round(x / s).clamp(-128, 127).to(torch.int8), s


def unpack_int8(packed_weight: torch.Tensor, n: int, k: int) -> torch.Tensor:
    """[ceil(N/16), ceil(K/4), 64] (16 columns by 4 k a step) back to [N, K]."""
    panels, steps, _ = packed_weight.shape
    return (packed_weight.view(panels, steps, PANEL, 4).permute(0, 2, 1, 3)
            .reshape(panels * PANEL, steps * 4)[:n, :k])


def int8_linear(out: torch.Tensor, input: torch.Tensor, packed_weight: torch.Tensor,
                weight_scale: torch.Tensor, weight_comp: torch.Tensor,
                input_scale: torch.Tensor | None) -> None:
    """W8A8: out = float(q @ W^T) * row scale * weight_scale, in that order
    (float64 holds every int32 sum exactly; weight_comp is the VNNI kernel's)."""
    q, s = quant_int8_rows(input, input_scale)
    w = unpack_int8(packed_weight, out.shape[1], input.shape[1])
    acc = (q.double() @ w.double().T).float()
    out.copy_((acc * s) * weight_scale.float()[None, :])


def unpack_panels(packed: torch.Tensor, n: int, k: int) -> torch.Tensor:
    """[ceil(N/16), steps, 16 * kp] panels (pack_panels) back to [N, K]."""
    panels, steps, width = packed.shape
    kp = width // PANEL
    return (packed.view(panels, steps, PANEL, kp).permute(0, 2, 1, 3)
            .reshape(panels * PANEL, steps * kp)[:n, :k])


def grouped_moe(out: torch.Tensor, input: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor,
                topk_weights: torch.Tensor, topk_ids: torch.Tensor) -> None:
    """Mixture-of-experts MLP over plain weights, w13 [E, 2I, H] (gate | up) and
    w2 [E, H, I]: rows grouped by expert (one sort, a loop over the experts
    used), float32 products, the activation rounded to the input's dtype as
    the unfused layers round it, each token's rows summed in float32."""
    t, h = input.shape
    k = topk_ids.shape[1]
    flat = topk_ids.reshape(-1).long()
    order = flat.argsort(stable=True)
    counts = torch.bincount(flat, minlength=w13.shape[0]).tolist()
    x = input.float()[order // k]
    y = torch.empty(t * k, h)
    start = 0
    for e, n in enumerate(counts):
        if n:
            rows = slice(start, start + n)
            gate, up = (x[rows] @ w13[e].float().T).chunk(2, -1)
            act = (F.silu(gate) * up).to(input.dtype).float()
            y[rows] = act @ w2[e].float().T
            start += n
    routed = torch.empty_like(y)
    routed[order] = y
    out.copy_((routed.view(t, k, h) * topk_weights.float().unsqueeze(-1)).sum(1))


def fused_moe(out: torch.Tensor, input: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor,
              topk_weights: torch.Tensor, topk_ids: torch.Tensor, intermediate: int) -> None:
    """The fused MoE kernel's reference: the packed experts unpacked, then grouped_moe."""
    h = input.shape[1]
    plain13 = torch.stack([unpack_panels(w, 2 * intermediate, h) for w in w13])
    plain2 = torch.stack([unpack_panels(w, h, intermediate) for w in w2])
    grouped_moe(out, input, plain13, plain2, topk_weights, topk_ids)


def unpack_wna16(packed_weight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor,
                 bits: int, group_size: int, n: int, k: int) -> torch.Tensor:
    """The float32 weight [N, K] a wna16 layout holds: (q - zero) * scale per
    group, q the bits-wide unsigned values of [ceil(N/16), steps, 16] int32 lanes
    (k = step * (32 / bits) + j at bits j * bits), scales and zeros [ceil(N/16),
    groups, 16]."""
    pf = 32 // bits
    panels, steps, _ = packed_weight.shape
    shifts = torch.arange(pf, dtype=torch.int32) * bits
    q = (packed_weight.unsqueeze(-1) >> shifts) & ((1 << bits) - 1)  # [panels, steps, 16, pf]
    q = q.permute(0, 2, 1, 3).reshape(panels * PANEL, steps * pf)
    groups = scales.shape[1]
    s = scales.permute(0, 2, 1).reshape(panels * PANEL, groups)
    z = zeros.permute(0, 2, 1).reshape(panels * PANEL, groups).to(torch.int32)
    g = torch.arange(steps * pf) // group_size
    return ((q - z[:, g]).float() * s[:, g])[:n, :k]


def gguf_int8_linear(out: torch.Tensor, input: torch.Tensor, packed_weight: torch.Tensor,
                     high_bits: torch.Tensor | None, terms: torch.Tensor, bits: int,
                     group_size: int, zero: int) -> None:
    """GGUF's int8-activation product (csrc/cpu/gguf_int8.h): input quantized per
    row and group of group_size (scale max|x| / 127, rounded half to even), each
    group's integer dot product with the unsigned q times d * scale, plus
    d * sum(q_x) times the group's term (or minus zero times it, one term)."""
    m, k = input.shape
    n, (panels, groups) = out.shape[1], terms.shape[:2]
    ones = torch.ones(panels, groups, PANEL, dtype=torch.float32)
    q = unpack_wna16(packed_weight, ones, torch.zeros_like(ones, dtype=torch.uint8),
                     8 if bits == 8 else 4, group_size, n, groups * group_size).double()
    if high_bits is not None:  # 5-/6-bit: the bits above the nibbles (gguf_int8.pack_high_bits)
        h = bits - 4
        chunk = 32 // h
        kk = torch.arange(chunk)
        pos = 8 * ((kk % 8) // 2) + 2 * h * (kk // 8) + h * (kk % 2)
        words = high_bits.long() & 0xFFFFFFFF  # [panels, chunks, 16]
        hi = (words.unsqueeze(-1) >> pos) & ((1 << h) - 1)  # [panels, chunks, 16, chunk]
        hi = hi.permute(0, 2, 1, 3).reshape(panels * PANEL, -1)[:n]
        q = q + 16 * hi.double()
    x = F.pad(input.float(), (0, groups * group_size - k)).view(m, groups, group_size)
    amax = x.abs().amax(-1, keepdim=True)
    qx = torch.round(x * torch.where(amax > 0, 127.0 / amax, 0.0)).double()
    d = (amax / 127.0).double().squeeze(-1)  # [m, groups]
    dot = torch.einsum("mgk,ngk->mgn", qx, q.view(n, groups, group_size))
    nt = terms.shape[2]
    t = terms.double().permute(0, 3, 1, 2).reshape(panels * PANEL, groups, nt)[:n]
    term = t[:, :, 1] if nt == 2 else -zero * t[:, :, 0]
    out.copy_(torch.einsum("mg,mgn->mn", d, dot * t[:, :, 0].T) + (d * qx.sum(-1)) @ term.T)


def wna16_linear(out: torch.Tensor, input: torch.Tensor, packed_weight: torch.Tensor,
                 scales: torch.Tensor, zeros: torch.Tensor, bits: int, group_size: int) -> None:
    """Weight-only quantized linear: the unpacked weight times input, in float32."""
    w = unpack_wna16(packed_weight, scales, zeros, bits, group_size, out.shape[1], input.shape[1])
    out.copy_(F.linear(input.float(), w))


def wna16_dequant(out: torch.Tensor, packed_weight: torch.Tensor, scales: torch.Tensor,
                  zeros: torch.Tensor, bits: int, group_size: int) -> None:
    """out [K, N] = the unpacked weight, transposed, rounded once to out's dtype."""
    k, n = out.shape
    out.copy_(unpack_wna16(packed_weight, scales, zeros, bits, group_size, n, k).T)


def wna16_dequant_panels(out: torch.Tensor, packed_weight: torch.Tensor, scales: torch.Tensor,
                         zeros: torch.Tensor, bits: int, group_size: int, n: int, k: int) -> None:
    """out = the unpacked weight [n, k] in the panel layout (pack_panels of
    engine.model_executor.layers.linear; k_pack = out.shape[2] / 16), rounded once."""
    panels, rows, width = out.shape
    k_pack = width // PANEL
    w = out.new_zeros(panels * PANEL, rows * k_pack)
    w[:n, :k] = unpack_wna16(packed_weight, scales, zeros, bits, group_size, n, k)
    out.view(panels, rows, PANEL, k_pack).copy_(
        w.view(panels, PANEL, rows, k_pack).permute(0, 2, 1, 3))


def lora_add(out: torch.Tensor, input: torch.Tensor, lora_a: torch.Tensor, lora_bt: torch.Tensor,
             token_slot: torch.Tensor, ranks: torch.Tensor, bounds: list[int]) -> None:
    """The LoRA term (csrc/cpu/lora.h) in float32, token by token: token t of
    slot s >= 0 gains, in each slice j's columns, its shrink by A[s, j, :rank]
    expanded by Bt[s, :rank, slice j], rank = ranks[s]; out rounded once."""
    for t, s in enumerate(token_slot.tolist()):
        rank = int(ranks[s]) if s >= 0 else 0
        if rank == 0:
            continue
        h = lora_a[s, :, :rank].float() @ input[t].float()  # [slices, rank]
        delta = torch.cat([h[j] @ lora_bt[s, :rank, lo:hi].float()
                           for j, (lo, hi) in enumerate(zip(bounds, bounds[1:]))])
        out[t] = (out[t].float() + delta).to(out.dtype)
