// CPU kernels, written once and compiled once per instruction set.
//
// CMake compiles this file with ENGINE_ISA set to avx2, avx512, avx512_bf16 or
// generic and the matching -m flags: the kernels, each in its *_impl.h, are
// written against the per-ISA vector types of cpu_types_x86.h (or as `omp simd`
// loops the compiler vectorizes for that ISA). Here they become the ISA's
// KernelTable. Everything except the exported table getter has internal
// linkage (see kernels.h for why), and only C headers are included.
#include "kernels.h"
#include "scalar.h"
#include "amx.h"
#include "scratch.h"
#include "wna16.h"
#include "gguf_int8.h"
#include "lora.h"
#include "cpu_types.h"
#include "layernorm_impl.h"
#include "pos_encoding_impl.h"
#include "activation_impl.h"
#include "attention_impl.h"
#include "common_ops.h"
#include "prefill_attention_impl.h"
#ifdef ENGINE_VEC_WIDTH
#include "linear_impl.h"
#include "int8_linear_impl.h"
#include "int8_linear_amx.h"
#include "prefill_attention_amx.h"
#include "moe_impl.h"
#endif

#include <stdint.h>

#ifndef ENGINE_ISA
#error "ENGINE_ISA must be defined (avx2, avx512, avx512_bf16 or generic)"
#endif

namespace engine::cpu {
namespace {

// ---- type dispatch (the table's entry points) -------------------------------
// The element-wise ops, the norms and decode attention: common_ops.h, shared
// with arm/kernels_neon.cpp.

int64_t paged_prefill_attention(DType dt, void* out, const void* query, const void* kc,
                                const void* vc, const int32_t* bt, const int32_t* qsl,
                                const int32_t* sl, int64_t seqs, int64_t heads, int64_t kv_heads,
                                int64_t head_size, int64_t block_size, int64_t max_blocks,
                                float scale, int64_t sliding_window) {
  if (dt == DType::kFloat32)
    return paged_prefill_attention_t(static_cast<float*>(out), static_cast<const float*>(query),
                              static_cast<const float*>(kc), static_cast<const float*>(vc), bt,
                              qsl, sl, seqs, heads, kv_heads, head_size, block_size, max_blocks,
                              scale, sliding_window);
  return paged_prefill_attention_t(static_cast<uint16_t*>(out), static_cast<const uint16_t*>(query),
                              static_cast<const uint16_t*>(kc), static_cast<const uint16_t*>(vc),
                              bt, qsl, sl, seqs, heads, kv_heads, head_size, block_size,
                              max_blocks, scale, sliding_window);
}

#ifdef ENGINE_VEC_WIDTH
int64_t linear(DType dt, void* out, const void* x, const void* packed, const void* bias,
               int64_t M, int64_t N, int64_t K, int64_t ldx, int64_t ldo) {
  if (dt == DType::kFloat32)
    return linear_t<FmaTile<float>>(static_cast<float*>(out), static_cast<const float*>(x),
                             static_cast<const float*>(packed), static_cast<const float*>(bias),
                             M, N, K, ldx, ldo);
  return linear_t<FmaTile<uint16_t>>(static_cast<uint16_t*>(out), static_cast<const uint16_t*>(x),
                                static_cast<const uint16_t*>(packed),
                                static_cast<const uint16_t*>(bias), M, N, K, ldx, ldo);
}
#define ENGINE_LINEAR linear

int64_t int8_linear(DType dt, void* out, const void* x, const float* static_scale,
                    const int8_t* packed, const float* w_scale, const int32_t* comp, int64_t M,
                    int64_t N, int64_t K, int64_t ldx, int64_t ldo) {
  if (dt == DType::kFloat32)
    return int8_linear_t(static_cast<float*>(out), static_cast<const float*>(x), static_scale, packed,
                  w_scale, comp, M, N, K, ldx, ldo);
  return int8_linear_t(static_cast<uint16_t*>(out), static_cast<const uint16_t*>(x), static_scale,
                  packed, w_scale, comp, M, N, K, ldx, ldo);
}
#define ENGINE_INT8_LINEAR int8_linear
#ifdef ENGINE_HAS_AMX_INT8
// As int8_linear, with AMX tiles; null where not compiled. Returns false (and
// does nothing) when the kernel refuses this process the tile state.
bool int8_linear_amx(DType dt, void* out, const void* x, const float* static_scale,
                     const int8_t* packed, const float* w_scale, const int32_t*, int64_t M,
                     int64_t N, int64_t K, int64_t ldx, int64_t ldo) {
  if (!amx_permitted()) return false;
  if (dt == DType::kFloat32)
    return int8_linear_amx_t(static_cast<float*>(out), static_cast<const float*>(x),
                             static_scale, packed, w_scale, M, N, K, ldx, ldo);
  return int8_linear_amx_t(static_cast<uint16_t*>(out), static_cast<const uint16_t*>(x),
                           static_scale, packed, w_scale, M, N, K, ldx, ldo);
}
#define ENGINE_INT8_LINEAR_AMX int8_linear_amx
#else
#define ENGINE_INT8_LINEAR_AMX nullptr
#endif

#ifdef ENGINE_HAS_AMX_ATTENTION
bool paged_prefill_attention_amx(DType dt, void* out, const void* query, const void* kc,
                                 const void* vc, const int32_t* bt, const int32_t* qsl,
                                 const int32_t* sl, int64_t seqs, int64_t heads, int64_t kv_heads,
                                 int64_t head_size, int64_t block_size, int64_t max_blocks,
                                 float scale, int64_t sliding_window) {
  if (dt != DType::kBFloat16) return false;
  return paged_prefill_attention_amx_bf16(
      static_cast<uint16_t*>(out), static_cast<const uint16_t*>(query),
      static_cast<const uint16_t*>(kc), static_cast<const uint16_t*>(vc), bt, qsl, sl, seqs, heads,
      kv_heads, head_size, block_size, max_blocks, scale, sliding_window);
}
#define ENGINE_PREFILL_ATTENTION_AMX paged_prefill_attention_amx
#else
#define ENGINE_PREFILL_ATTENTION_AMX nullptr
#endif

int64_t fused_moe(DType dt, bool pairs, void* out, const void* x, const void* w13,
                  const void* w2, const float* tw, const int32_t* ids, int64_t tokens, int64_t H,
                  int64_t I, int64_t E, int64_t topk, int64_t ldx, int64_t ldo) {
#ifdef __AVX512BF16__
  if (pairs)
    return fused_moe_t<Bf16PairTile>(static_cast<uint16_t*>(out), static_cast<const uint16_t*>(x),
                                     static_cast<const uint16_t*>(w13),
                                     static_cast<const uint16_t*>(w2), tw, ids, tokens, H, I, E,
                                     topk, ldx, ldo);
#endif
  (void)pairs;
  if (dt == DType::kFloat32)
    return fused_moe_t<FmaTile<float>>(static_cast<float*>(out), static_cast<const float*>(x),
                                static_cast<const float*>(w13), static_cast<const float*>(w2), tw,
                                ids, tokens, H, I, E, topk, ldx, ldo);
  return fused_moe_t<FmaTile<uint16_t>>(static_cast<uint16_t*>(out), static_cast<const uint16_t*>(x),
                                   static_cast<const uint16_t*>(w13),
                                   static_cast<const uint16_t*>(w2), tw, ids, tokens, H, I, E,
                                   topk, ldx, ldo);
}
#define ENGINE_FUSED_MOE fused_moe
#else
#define ENGINE_INT8_LINEAR nullptr
#define ENGINE_INT8_LINEAR_AMX nullptr
#define ENGINE_PREFILL_ATTENTION_AMX nullptr
#define ENGINE_LINEAR nullptr
#define ENGINE_FUSED_MOE nullptr
#endif

#ifdef __AVX512BF16__
int64_t linear_bf16_pairs(void* out, const void* x, const void* packed, const void* bias,
                          int64_t M, int64_t N, int64_t K, int64_t ldx, int64_t ldo) {
  return linear_t<Bf16PairTile>(static_cast<uint16_t*>(out), static_cast<const uint16_t*>(x),
                         static_cast<const uint16_t*>(packed), static_cast<const uint16_t*>(bias),
                         M, N, K, ldx, ldo);
}
#define ENGINE_LINEAR_BF16_PAIRS linear_bf16_pairs
#else
#define ENGINE_LINEAR_BF16_PAIRS nullptr
#endif

#ifdef ENGINE_VEC_WIDTH  // the x86 paths: wna16_impl.cpp is compiled beside this file
namespace wna16 = ENGINE_CAT(wna16_, ENGINE_ISA);
#if defined(__AVX512BF16__) && defined(ENGINE_HAS_AMX)
#define ENGINE_WNA16_LINEAR_AMX wna16::linear_amx
#else
#define ENGINE_WNA16_LINEAR_AMX nullptr
#endif
#define ENGINE_WNA16(fn) wna16::fn
#define ENGINE_GGUF_INT8 ENGINE_CAT(gguf_int8_, ENGINE_ISA)::linear
#else
#define ENGINE_GGUF_INT8 nullptr
#define ENGINE_WNA16_LINEAR_AMX nullptr
#define ENGINE_WNA16(fn) nullptr
#endif

const KernelTable table = {
    ENGINE_STR(ENGINE_ISA), rms_norm,        fused_add_rms_norm, silu_and_mul,
    rotary_embedding,       reshape_and_cache, paged_attention,  ENGINE_LINEAR,
    ENGINE_LINEAR_BF16_PAIRS, ENGINE_INT8_LINEAR, ENGINE_INT8_LINEAR_AMX,
    paged_prefill_attention, ENGINE_PREFILL_ATTENTION_AMX, ENGINE_FUSED_MOE,
    ENGINE_WNA16(linear),   ENGINE_WNA16(dequant), ENGINE_WNA16_LINEAR_AMX,
    ENGINE_WNA16(dequant_panels), ENGINE_GGUF_INT8, ENGINE_CAT(lora_, ENGINE_ISA)::add,
};

}  // namespace

const KernelTable* ENGINE_CAT(kernels_, ENGINE_ISA)() { return &table; }

}  // namespace engine::cpu

