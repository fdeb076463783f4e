// The boundary between the torch-facing glue (compiled for the baseline ISA)
// and the kernels (compiled once per ISA: avx2, avx512, avx512_bf16, or generic).
//
// Deliberately torch-free and STL-free: a kernel translation unit compiled
// with -mavx512f must not instantiate any inline function with external
// linkage (std::vector, c10 helpers, ...). The linker keeps one copy of such
// a function for the whole library, and if it kept the AVX-512 copy the
// baseline code would execute AVX-512 instructions on an AVX2-only CPU.
#pragma once

#include <stdint.h>

namespace engine::cpu {

enum class DType : int32_t { kFloat32 = 0, kBFloat16 = 1 };

// Columns per panel of a packed linear weight (engine.model_executor.layers.linear.PANEL).
constexpr int64_t kPanel = 16;

// Every pointer is to the first element; strides are in elements.
// Signatures a kernel and its AMX variant share (R: void; bool for the variant,
// false where it did not run).
template <typename R>
using Int8LinearFn = R (*)(DType dt, void* out, const void* x, const float* static_scale,
                           const int8_t* packed, const float* w_scale, const int32_t* comp,
                           int64_t M, int64_t N, int64_t K, int64_t ldx, int64_t ldo);
template <typename R>
using PrefillAttentionFn = R (*)(DType dt, void* out, const void* query, const void* key_cache,
                                 const void* value_cache, const int32_t* block_tables,
                                 const int32_t* query_start_loc, const int32_t* seq_lens,
                                 int64_t seqs, int64_t heads, int64_t kv_heads,
                                 int64_t head_size, int64_t block_size, int64_t max_blocks,
                                 float scale, int64_t sliding_window);

// A GGUF layer's weight as the int8-activation kernel reads it (gguf_int8.h):
// the packed q (4-bit nibbles or bytes), the high bits of 5- and 6-bit values
// in a plane of their own (null for 4 and 8 bits), float16 terms per group.
struct GgufInt8Weight {
  const uint32_t* packed;
  const uint32_t* high;
  const uint16_t* terms;
  int bits;     // of a value: 4, 5, 6 or 8
  int n_terms;  // 1: the scale (W = (q - zero) * scale); 2: scale and term
  int zero;     // with one term: the zero point of every group
  int64_t N, K, group_size;
};

// Kernels that allocate return int64_t: 0, or the bytes of scratch that could
// not be allocated (nothing is then left to trust in the output: the glue
// raises, cpu_ops.cpp check_scratch).
struct KernelTable {
  const char* isa;

  // out[r, :] = in[r, :] / rms(in[r, :]) * w
  int64_t (*rms_norm)(DType dt, void* out, const void* in, const void* weight,
                   int64_t rows, int64_t hidden, int64_t in_stride,
                   int64_t out_stride, float eps);

  // res[r, :] += in[r, :]; in[r, :] = res[r, :] / rms(res[r, :]) * w
  int64_t (*fused_add_rms_norm)(DType dt, void* in, void* res, const void* weight,
                             int64_t rows, int64_t hidden, int64_t in_stride,
                             int64_t res_stride, float eps);

  // out[r, i] = silu(in[r, i]) * in[r, d + i]
  void (*silu_and_mul)(DType dt, void* out, const void* in, int64_t rows,
                       int64_t d, int64_t in_stride, int64_t out_stride);

  // In place on x[t, h, :rot_dim] for every token t and head h.
  // cache[p, :rot_dim/2] holds cos, cache[p, rot_dim/2:] holds sin.
  void (*rotary_embedding)(DType dt, const int64_t* positions, void* x,
                           const void* cache, int64_t tokens, int64_t heads,
                           int64_t token_stride, int64_t head_stride,
                           int64_t rot_dim, int64_t cache_stride, bool neox);

  // cache layout: [num_blocks, kv_heads, block_size, head_size]
  // src layout:   [tokens, kv_heads, head_size] with the given strides.
  // slot < 0 means "padding token, do not store".
  void (*reshape_and_cache)(int64_t elem_size, const void* key,
                            const void* value, void* key_cache,
                            void* value_cache, const int64_t* slots,
                            int64_t tokens, int64_t kv_heads,
                            int64_t head_size, int64_t block_size,
                            int64_t key_token_stride, int64_t key_head_stride,
                            int64_t value_token_stride,
                            int64_t value_head_stride);

  // Decode attention, one query token per sequence.
  // query: [seqs, heads, head_size], a sequence's row query_stride elements
  // after the last's (the q part of a fused qkv row, uncopied); out contiguous.
  // block_tables: [seqs, max_blocks] int32, seq_lens: [seqs] int32; both
  // already validated by the caller against the cache size. Returns 0, or the
  // bytes of per-thread scratch a thread could not allocate (nothing is then
  // left to trust in out: the caller raises).
  int64_t (*paged_attention)(DType dt, void* out, const void* query, int64_t query_stride,
                          const void* key_cache, const void* value_cache,
                          const int32_t* block_tables, const int32_t* seq_lens,
                          int64_t seqs, int64_t heads, int64_t kv_heads,
                          int64_t head_size, int64_t block_size,
                          int64_t max_blocks, float scale);

  // out[m, :N] = x[m, :K] @ W^T (+ bias[:N]) with W packed as panels of kPanel
  // columns, [ceil(N/16), K, 16] contiguous (linear_impl.h). Null on the code
  // paths without it (the caller then uses torch's linear).
  int64_t (*linear)(DType dt, void* out, const void* x, const void* packed,
                 const void* bias, int64_t M, int64_t N, int64_t K, int64_t ldx,
                 int64_t ldo);

  // The same for bfloat16 with W packed in k pairs, [ceil(N/16), ceil(K/2),
  // 16, 2], multiplied with AVX512_BF16's dot products: avx512_bf16 only,
  // null on the other code paths.
  int64_t (*linear_bf16_pairs)(void* out, const void* x, const void* packed,
                            const void* bias, int64_t M, int64_t N, int64_t K,
                            int64_t ldx, int64_t ldo);

  // W8A8 (int8_linear_impl.h): x[M, K] quantised to int8 per row (dynamic,
  // or with *static_scale when non-null), times an int8 W packed as
  // [ceil(N/16), ceil(K/4), 16, 4] with int32 accumulation, scaled by the
  // row's scale and w_scale[n]. comp[n] = 128 * sum_k W[n, k], padded to the
  // panels. Null on the code paths without it (the caller then uses torch).
  Int8LinearFn<int64_t> int8_linear;
  // The same with AMX-INT8 tiles (comp unused): on the avx512_bf16 path of a
  // compiler with AMX, null elsewhere. Only for a CPU with amx_int8 (the caller
  // checks); false when the OS refuses the tile state or its scratch cannot be
  // allocated (the caller then runs int8_linear, which writes all of out).
  Int8LinearFn<bool> int8_linear_amx;
  // Prefill (and chunked-prefill) attention over the paged cache. query/out:
  // [T, heads, head_size] contiguous; sequence b's queries are rows
  // query_start_loc[b] .. query_start_loc[b + 1] - 1 and sit at the last
  // q_len positions of its seq_lens[b] cached tokens; each attends the cached
  // keys at positions <= its own (and > its own - sliding_window when
  // sliding_window > 0). Validated by the caller. Null where not compiled
  // (NEON: the caller runs the torch reference).
  PrefillAttentionFn<int64_t> paged_prefill_attention;
  // The same with AMX bfloat16 tiles (avx512_bf16 path, a compiler with AMX;
  // null elsewhere), for a CPU the caller has checked. False (nothing written)
  // for float32, a shape it does not take, when the OS refuses the tile state
  // or its scratch cannot be allocated (the caller then runs the one above).
  PrefillAttentionFn<bool> paged_prefill_attention_amx;

  // Mixture-of-experts MLP (moe_impl.h): out[t, :H] = sum over j < topk of
  // topk_weights[t, j] * down_e(silu(gate_e(x[t])) * up_e(x[t])), e =
  // topk_ids[t, j] (validated by the caller). Per expert, w13 holds gate and
  // up as one [2I, H] weight and w2 down as [H, I], each packed as the linear
  // kernel's panels: [E, ceil(2I/16), steps, 16 * kp] and [E, ceil(H/16),
  // steps, 16 * kp], kp = 2 (bfloat16 k pairs, `pairs`, avx512_bf16 only)
  // or 1. Null where not compiled (the caller runs the torch reference).
  int64_t (*fused_moe)(DType dt, bool pairs, void* out, const void* x, const void* w13,
                    const void* w2, const float* topk_weights, const int32_t* topk_ids,
                    int64_t tokens, int64_t H, int64_t I, int64_t E, int64_t topk,
                    int64_t ldx, int64_t ldo);

  // Weight-only quantized linear layers, W4A16 and W8A16 (layout and math:
  // wna16.h); the x86 code paths only, null elsewhere (engine.ops then runs
  // engine.reference's).
  // out[m, :N] = x[m, :K] @ W^T, in float32 (bfloat16 x converted), out rounded
  // once to its dtype. For few rows (decode): the weight is read once a call.
  int64_t (*wna16_linear)(DType dt, int bits, void* out, const void* x, const uint32_t* packed,
                          const float* scales, const uint8_t* zeros, int64_t M, int64_t N,
                          int64_t K, int64_t group_size, int64_t ldx, int64_t ldo);
  // wt[k, n] = W[n, k] ([K, N] contiguous, rounded once to dt): the panel for
  // a large-M GEMM (prefill), run by torch.
  void (*wna16_dequant)(DType dt, int bits, void* wt, const uint32_t* packed, const float* scales,
                        const uint8_t* zeros, int64_t N, int64_t K, int64_t group_size);
  // wna16_linear with AMX tiles, bfloat16 only (avx512_bf16 path; null
  // elsewhere), for a CPU the caller has checked; false (nothing written) where
  // it does not run: float32, a group size not a multiple of 32, no tile state,
  // no scratch.
  bool (*wna16_linear_amx)(DType dt, int bits, void* out, const void* x, const uint32_t* packed,
                           const float* scales, const uint8_t* zeros, int64_t M, int64_t N,
                           int64_t K, int64_t group_size, int64_t ldx, int64_t ldo);
  // the weight in the panel kernel's layout (linear_impl.h): k_pack 1,
  // [ceil(N/16), K, 16]; k_pack 2 (bfloat16 only), [ceil(N/16), ceil(K/2), 16]
  // k pairs; the B of a large-M GEMM by the engine's own panel kernel.
  void (*wna16_dequant_panels)(DType dt, int bits, int k_pack, void* wp, const uint32_t* packed,
                               const float* scales, const uint8_t* zeros, int64_t N, int64_t K,
                               int64_t group_size);
  // GGUF's quantized linear layers for few rows (decode), x quantized to int8
  // per group and multiplied with integer dot products as llama.cpp does
  // (gguf_int8.h): out[m, :N] = x[m, :K] @ W^T. x86 and NEON, null on the
  // generic table (the caller then runs wna16_linear).
  int64_t (*gguf_int8_linear)(DType dt, const GgufInt8Weight& w, void* out, const void* x,
                              int64_t M, int64_t ldx, int64_t ldo);
  // The LoRA term of a linear layer for few tokens, as punica's bgmv (lora.h;
  // every code path): for each token t of slot s = token_slot[t] (< 0: none)
  // and each slice j < slices (columns bounds[j] .. bounds[j + 1] - 1 of out),
  //   out[t, cols_j] += (x[t, :K] @ A[s, j, :rank]^T) @ Bt[s, :rank, cols_j],
  // rank = ranks[s] (0: nothing), in float32. A is [max_loras, slices, max_rank,
  // K] and Bt [max_loras, max_rank, bounds[slices]], contiguous; validated by
  // the caller.
  int64_t (*lora_add)(DType dt, void* out, const void* x, const void* lora_a,
                      const void* lora_bt, const int32_t* token_slot, const int32_t* ranks,
                      const int64_t* bounds, int64_t tokens, int64_t slices, int64_t max_rank,
                      int64_t K, int64_t ldx, int64_t ldo);
};

// Defined by kernels_impl.cpp, once per compiled ISA. Which of these exist is
// decided by CMake (ENGINE_HAS_AVX2 / ENGINE_HAS_AVX512 / ENGINE_HAS_AVX512_BF16 /
// ENGINE_HAS_GENERIC).
const KernelTable* kernels_avx2();
const KernelTable* kernels_avx512();
const KernelTable* kernels_avx512_bf16();
const KernelTable* kernels_generic();

}  // namespace engine::cpu
