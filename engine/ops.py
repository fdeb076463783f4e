"""Typed wrappers over torch.ops._C.*, falling back to engine.reference when
this installation carries no compiled kernels (the `empty` variant).

Signatures follow upstream vLLM's ops (output first, in place where upstream
is), so code written against upstream runs unchanged.
"""
from __future__ import annotations

import functools

import torch

from engine import reference
from engine._kernels import load

#: Every kernel op, as csrc/torch_bindings.cpp registers it for each device
#: (tests/kernels/test_ops.py checks the two agree; ci/smoke-test.sh reads this list).
OP_NAMES = ("rms_norm", "fused_add_rms_norm", "silu_and_mul", "rotary_embedding",
            "reshape_and_cache", "paged_attention")
#: Ops registered for one device only.
DEVICE_OP_NAMES = {"cpu": ("linear", "int8_linear", "paged_prefill_attention", "fused_moe",
                           "wna16_linear", "wna16_dequant", "wna16_dequant_panels",
                           "gguf_int8_linear", "lora_add", "argmax_rows")}
#: Columns per panel of a packed linear weight.
PANEL = reference.PANEL

BUILD_INFO = load()
_ops = torch.ops._C if BUILD_INFO.has_kernels else reference


def rms_norm(out: torch.Tensor, input: torch.Tensor, weight: torch.Tensor,
             epsilon: float) -> None:
    """out = input / sqrt(mean(input**2, -1) + epsilon) * weight."""
    _ops.rms_norm(out, input, weight, epsilon)


def fused_add_rms_norm(input: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                       epsilon: float) -> None:
    """residual += input; input = rms_norm(residual) * weight (both in place)."""
    _ops.fused_add_rms_norm(input, residual, weight, epsilon)


def silu_and_mul(out: torch.Tensor, input: torch.Tensor) -> None:
    """out = silu(input[..., :d]) * input[..., d:], with d = input.shape[-1] // 2."""
    _ops.silu_and_mul(out, input)


def rotary_embedding(positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor | None,
                     head_size: int, cos_sin_cache: torch.Tensor, is_neox: bool) -> None:
    """Rotate query (and key) in place; cos_sin_cache is [max_position, rot_dim] (cos | sin)."""
    _ops.rotary_embedding(positions, query, key, head_size, cos_sin_cache, is_neox)


def reshape_and_cache(key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor,
                      value_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Store key/value [tokens, kv_heads, head_size] into the paged caches
    [num_blocks, kv_heads, block_size, head_size] at slot_mapping (-1: skip)."""
    _ops.reshape_and_cache(key, value, key_cache, value_cache, slot_mapping)


def paged_attention(out: torch.Tensor, query: torch.Tensor, key_cache: torch.Tensor,
                    value_cache: torch.Tensor, block_tables: torch.Tensor,
                    seq_lens: torch.Tensor, scale: float) -> None:
    """Decode attention: one query token per sequence over its cached blocks.
    query [seqs, heads, head_size] is read in place where each row's heads are
    contiguous (a fused qkv output's q part), else copied first."""
    _ops.paged_attention(out, query, key_cache, value_cache, block_tables, seq_lens, scale)


def paged_prefill_attention(out: torch.Tensor, query: torch.Tensor, key_cache: torch.Tensor,
                            value_cache: torch.Tensor, block_tables: torch.Tensor,
                            query_start_loc: torch.Tensor, seq_lens: torch.Tensor, scale: float,
                            sliding_window: int = -1) -> None:
    """Prefill (or chunked prefill) attention over the paged cache, written there first by
    reshape_and_cache: sequence b's queries are rows query_start_loc[b]..[b+1]-1 of
    query [T, heads, head_size], the last tokens of its seq_lens[b] cached ones; each
    attends the keys at positions <= its own (and > its own - sliding_window; -1: none).
    block_tables, query_start_loc and seq_lens are int32. The CPU kernel where the code
    path in use has it, else the torch reference."""
    impl = torch.ops._C if has_paged_prefill_attention() else reference
    impl.paged_prefill_attention(out, query, key_cache, value_cache, block_tables,
                                 query_start_loc, seq_lens, scale, sliding_window)


def has_paged_prefill_attention() -> bool:
    """Whether the CPU code path in use has the prefill attention kernel (every x86 path)."""
    return BUILD_INFO.device == "cpu" and bool(torch.ops._C.cpu_has_paged_prefill_attention())


def linear(out: torch.Tensor, input: torch.Tensor, packed_weight: torch.Tensor,
           bias: torch.Tensor | None) -> None:
    """out[M, N] = input[M, K] @ W^T (+ bias), W packed by
    engine.model_executor.layers.linear.pack_panels as [ceil(N/16), K, 16], or for bfloat16
    in k pairs as [ceil(N/16), ceil(K/2), 32] where panel_k_pack says so (CPU
    only: see has_panel_linear)."""
    _ops.linear(out, input, packed_weight, bias)


def int8_linear(out: torch.Tensor, input: torch.Tensor, packed_weight: torch.Tensor,
                weight_scale: torch.Tensor, weight_comp: torch.Tensor,
                input_scale: torch.Tensor | None = None) -> None:
    """W8A8: out[M, N] = (int8(input) @ W^T) * row scale * weight_scale[N], input
    quantised per row (dynamic) or with the static input_scale; W int8 packed
    by engine.model_executor.layers.quantization.w8a8.pack_int8. The reference
    where the code path in use has no kernel (see has_int8_linear)."""
    fn = torch.ops._C.int8_linear if has_int8_linear() else reference.int8_linear
    fn(out, input, packed_weight, weight_scale, weight_comp, input_scale)


def set_amx(enable: bool) -> bool:
    """Let the kernels use AMX tiles (int8_linear, bfloat16 prefill attention;
    engine._kernels turns them on where the CPU, as VLLM_CPU_MAX_ISA caps it, has
    cpu_features.AMX_FLAGS); whether they now run."""
    return BUILD_INFO.device == "cpu" and bool(torch.ops._C.cpu_set_amx(enable))


def amx_in_use() -> bool:
    """Whether the kernels run AMX tiles now (set_amx, on a code path that has them)."""
    return BUILD_INFO.device == "cpu" and bool(torch.ops._C.cpu_amx())


def has_int8_linear() -> bool:
    """Whether the CPU code path in use has the int8 linear kernel (x86 AVX2/AVX-512)."""
    return BUILD_INFO.device == "cpu" and bool(torch.ops._C.cpu_has_int8_linear())


def fused_moe(out: torch.Tensor, input: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor,
              topk_weights: torch.Tensor, topk_ids: torch.Tensor, intermediate: int) -> None:
    """Mixture-of-experts MLP: out[t] = sum_j topk_weights[t, j] *
    down_e(silu(gate_e(input[t])) * up_e(input[t])), e = topk_ids[t, j] (int32),
    over experts packed by engine.model_executor.layers.fused_moe.pack_experts.
    The reference where the code path in use has no kernel (see has_fused_moe)."""
    fn = torch.ops._C.fused_moe if has_fused_moe() else reference.fused_moe
    fn(out, input, w13, w2, topk_weights, topk_ids, intermediate)


def has_fused_moe() -> bool:
    """Whether the CPU code path in use has the fused MoE kernel (x86 AVX2/AVX-512)."""
    return BUILD_INFO.device == "cpu" and bool(torch.ops._C.cpu_has_fused_moe())


def wna16_linear(out: torch.Tensor, input: torch.Tensor, packed_weight: torch.Tensor,
                 scales: torch.Tensor, zeros: torch.Tensor, bits: int, group_size: int) -> None:
    """Weight-only quantized (W4A16, W8A16): out[M, N] = input @ W^T in float32,
    W[n, k] = (q - zero) * scale per group of group_size k, packed by
    engine.model_executor.layers.quantization.wna16.pack_wna16. For few rows:
    the weight is read once a call. The reference where the code path in use
    has no kernel (see has_wna16_linear)."""
    fn = torch.ops._C.wna16_linear if has_wna16_linear() else reference.wna16_linear
    fn(out, input, packed_weight, scales, zeros, bits, group_size)


def wna16_dequant(out: torch.Tensor, packed_weight: torch.Tensor, scales: torch.Tensor,
                  zeros: torch.Tensor, bits: int, group_size: int) -> None:
    """out[K, N] = W^T of a wna16_linear weight, in out's dtype (float32 or
    bfloat16): the panel a large-M GEMM multiplies."""
    fn = torch.ops._C.wna16_dequant if has_wna16_linear() else reference.wna16_dequant
    fn(out, packed_weight, scales, zeros, bits, group_size)


def wna16_dequant_panels(out: torch.Tensor, packed_weight: torch.Tensor, scales: torch.Tensor,
                         zeros: torch.Tensor, bits: int, group_size: int, n: int, k: int) -> None:
    """out = the [n, k] weight of a wna16_linear layer in the panel layout
    linear() multiplies: [ceil(n/16), k, 16], or [ceil(n/16), ceil(k/2), 32] in k
    pairs (bfloat16, panel_k_pack 2); rounded once to out's dtype."""
    fn = torch.ops._C.wna16_dequant_panels if has_wna16_linear() else reference.wna16_dequant_panels
    fn(out, packed_weight, scales, zeros, bits, group_size, n, k)


def has_wna16_linear() -> bool:
    """Whether the CPU code path in use has the wna16 kernels (x86 AVX2/AVX-512)."""
    return BUILD_INFO.device == "cpu" and bool(torch.ops._C.cpu_has_wna16_linear())


def gguf_int8_linear(out: torch.Tensor, input: torch.Tensor, packed_weight: torch.Tensor,
                     high_bits: torch.Tensor | None, terms: torch.Tensor, bits: int,
                     group_size: int, zero: int) -> None:
    """GGUF's few-row product as llama.cpp runs it: input quantized to int8 per
    row and group, times a weight of `bits` (4, 5, 6, 8) a value in integer dot
    products, each group's sum scaled by its float16 factors; the layout is
    engine.model_executor.layers.quantization.gguf_int8.pack's. The reference
    where the code path in use has no kernel."""
    fn = torch.ops._C.gguf_int8_linear if has_gguf_int8_linear() else reference.gguf_int8_linear
    fn(out, input, packed_weight, high_bits, terms, bits, group_size, zero)


def has_gguf_int8_linear() -> bool:
    """Whether the CPU code path in use has the GGUF int8 kernel (x86 AVX2/AVX-512,
    AArch64 NEON).
    Kept until select_cpu_isa: a decode step asks 120 times (0.7 us each)."""
    global _has_gguf_int8
    if _has_gguf_int8 is None:
        _has_gguf_int8 = BUILD_INFO.device == "cpu" and bool(
            torch.ops._C.cpu_has_gguf_int8_linear())
    return _has_gguf_int8


_has_gguf_int8: bool | None = None


def lora_add(out: torch.Tensor, input: torch.Tensor, lora_a: torch.Tensor,
             lora_bt: torch.Tensor, token_slot: torch.Tensor, ranks: torch.Tensor,
             bounds: list[int]) -> None:
    """The LoRA term of a linear layer for few tokens (punica's bgmv): each
    token of slot token_slot[t] >= 0 (int32; -1: the base model) gains, in
    slice j's columns bounds[j]:bounds[j + 1] of out, input[t] @ lora_a[s, j,
    :r].T @ lora_bt[s, :r, slice j], r = ranks[s] (int32 [max_loras]);
    lora_a [max_loras, slices, max_rank, K], lora_bt [max_loras, max_rank, N].
    The reference where the build has no CPU kernels."""
    fn = lora_add_kernel() or reference.lora_add
    fn(out, input, lora_a, lora_bt, token_slot, ranks, bounds)


def lora_add_kernel():
    """lora_add's compiled op itself, for a caller that checked its arguments
    once and calls it every step (a decode step's layers); None where the
    build has no CPU kernels."""
    return torch.ops._C.lora_add.default if has_lora_kernel() else None


def has_lora_kernel() -> bool:
    """Whether the build has the LoRA kernel (every CPU code path does)."""
    return BUILD_INFO.device == "cpu" and BUILD_INFO.has_kernels


def has_panel_linear() -> bool:
    """Whether the CPU code path in use has the panel linear kernel (x86 AVX2/AVX-512)."""
    return BUILD_INFO.device == "cpu" and bool(torch.ops._C.cpu_has_linear())


def panel_k_pack(dtype: torch.dtype) -> int:
    """k values per step of the panel layout the kernel in use reads for
    `dtype`: 2 for bfloat16 on the avx512_bf16 code path (its AVX512_BF16 dot
    products), else 1."""
    return 2 if dtype == torch.bfloat16 and has_bf16_pair_linear() else 1


def has_bf16_pair_linear() -> bool:
    """Whether the CPU code path in use multiplies bfloat16 in k pairs
    (avx512_bf16 only, chosen where the CPU has AVX512_BF16 and
    VLLM_CPU_MAX_ISA does not hide it)."""
    return has_panel_linear() and bool(torch.ops._C.cpu_has_linear_bf16_pairs())


def cpu_isa() -> str | None:
    """The CPU code path in use (avx512_bf16, avx512, avx2, neon_bf16, neon, generic), or None
    without CPU kernels."""
    return torch.ops._C.cpu_isa() if BUILD_INFO.device == "cpu" else None


def compiled_cpu_isas() -> list[str]:
    """The CPU code paths compiled into this build, best first ([] without CPU kernels)."""
    if BUILD_INFO.device != "cpu":
        return []
    return [i for i in torch.ops._C.cpu_compiled_isas().split(",") if i]


def select_cpu_isa(name: str) -> str:
    """Switch the CPU code path at run time (auto, avx512_bf16, avx512, avx2, neon_bf16,
    neon, generic); returns the
    one in use. Raises engine.platforms.cpu_features.CpuIsaError (one line) where `name` is
    not compiled in or this CPU (as VLLM_CPU_MAX_ISA caps it) cannot run it."""
    from engine.platforms import cpu_features

    if BUILD_INFO.device != "cpu":
        raise RuntimeError(f"this is a {BUILD_INFO.variant} build; it has no CPU kernels")
    chosen = cpu_features.choose_isa(name, cpu_features.current(), compiled_cpu_isas())
    global _has_gguf_int8
    _has_gguf_int8 = None
    return torch.ops._C.select_cpu_isa(chosen)


def argmax_rows(logits: torch.Tensor) -> list[int]:
    """Each row's first index of its maximum (a NaN counting as the maximum),
    as torch.max(logits, -1).indices: greedy sampling. The CPU kernel reads
    float32 or bfloat16 rows in place (one 49152-token bfloat16 row: ~9 us
    against ~60 us for torch's float copy and max)."""
    kernel = _argmax_kernel()
    if kernel is None or logits.device.type != "cpu" or logits.dim() != 2 or \
            logits.dtype not in (torch.float32, torch.bfloat16) or logits.stride(-1) != 1:
        return torch.max(logits, dim=-1).indices.tolist()
    out = torch.empty(logits.shape[0], dtype=torch.long)
    kernel(out, logits)
    return out.tolist()


@functools.cache
def _argmax_kernel():
    if BUILD_INFO.device == "cpu" and BUILD_INFO.has_kernels:
        try:
            return torch.ops._C.argmax_rows.default
        except (AttributeError, RuntimeError):
            pass  # a build from before the op (precompiled mode's older wheels): torch's
    return None
