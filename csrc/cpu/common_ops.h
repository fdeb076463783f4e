// The table's entry points every kernel table has (kernels.h: rms_norm to
// paged_attention): a DType (or an element size) to the typed kernel of its
// *_impl.h. Included by kernels_impl.cpp (x86, generic) and arm/kernels_neon.cpp,
// so each ISA's table is built from the same code; where the ISA has explicit
// vectors (ENGINE_VEC_WIDTH) the norms and neox rotary take them.
#pragma once

#include <stdint.h>

#include "activation_impl.h"
#include "attention_impl.h"
#include "cpu_types.h"
#include "kernels.h"
#include "layernorm_impl.h"
#include "pos_encoding_impl.h"

namespace engine::cpu {
namespace {

#ifdef ENGINE_VEC_WIDTH
#define rms_norm_t rms_norm_vec
#define fused_add_rms_norm_t fused_add_rms_norm_vec
#endif

int64_t rms_norm(DType dt, void* out, const void* in, const void* w, int64_t rows,
                 int64_t hidden, int64_t is, int64_t os, float eps) {
  if (dt == DType::kFloat32)
    return rms_norm_t(static_cast<float*>(out), static_cast<const float*>(in),
               static_cast<const float*>(w), rows, hidden, is, os, eps);
  return rms_norm_t(static_cast<uint16_t*>(out), static_cast<const uint16_t*>(in),
               static_cast<const uint16_t*>(w), rows, hidden, is, os, eps);
}

int64_t fused_add_rms_norm(DType dt, void* in, void* res, const void* w, int64_t rows,
                           int64_t hidden, int64_t is, int64_t rs, float eps) {
  if (dt == DType::kFloat32)
    return fused_add_rms_norm_t(static_cast<float*>(in), static_cast<float*>(res),
                         static_cast<const float*>(w), rows, hidden, is, rs, eps);
  return fused_add_rms_norm_t(static_cast<uint16_t*>(in), static_cast<uint16_t*>(res),
                         static_cast<const uint16_t*>(w), rows, hidden, is, rs, eps);
}

void silu_and_mul(DType dt, void* out, const void* in, int64_t rows, int64_t d,
                  int64_t is, int64_t os) {
  if (dt == DType::kFloat32)
    silu_and_mul_t(static_cast<float*>(out), static_cast<const float*>(in), rows, d, is, os);
  else
    silu_and_mul_t(static_cast<uint16_t*>(out), static_cast<const uint16_t*>(in), rows, d, is, os);
}

void rotary_embedding(DType dt, const int64_t* pos, void* x, const void* cache,
                      int64_t tokens, int64_t heads, int64_t ts, int64_t hs,
                      int64_t rot_dim, int64_t cs, bool neox) {
#ifdef ENGINE_VEC_WIDTH
  if (neox) {
    if (dt == DType::kFloat32)
      rotary_vec(pos, static_cast<float*>(x), static_cast<const float*>(cache), tokens, heads,
                 ts, hs, rot_dim, cs);
    else
      rotary_vec(pos, static_cast<uint16_t*>(x), static_cast<const uint16_t*>(cache), tokens,
                 heads, ts, hs, rot_dim, cs);
    return;
  }
#endif
  if (dt == DType::kFloat32)
    rotary_t(pos, static_cast<float*>(x), static_cast<const float*>(cache),
             tokens, heads, ts, hs, rot_dim, cs, neox);
  else
    rotary_t(pos, static_cast<uint16_t*>(x), static_cast<const uint16_t*>(cache),
             tokens, heads, ts, hs, rot_dim, cs, neox);
}

void reshape_and_cache(int64_t elem_size, const void* key, const void* value,
                       void* key_cache, void* value_cache, const int64_t* slots,
                       int64_t tokens, int64_t kv_heads, int64_t head_size,
                       int64_t block_size, int64_t kts, int64_t khs,
                       int64_t vts, int64_t vhs) {
  if (elem_size == 4)
    reshape_and_cache_t(static_cast<const uint32_t*>(key), static_cast<const uint32_t*>(value),
                        static_cast<uint32_t*>(key_cache), static_cast<uint32_t*>(value_cache),
                        slots, tokens, kv_heads, head_size, block_size, kts, khs, vts, vhs);
  else
    reshape_and_cache_t(static_cast<const uint16_t*>(key), static_cast<const uint16_t*>(value),
                        static_cast<uint16_t*>(key_cache), static_cast<uint16_t*>(value_cache),
                        slots, tokens, kv_heads, head_size, block_size, kts, khs, vts, vhs);
}

int64_t paged_attention(DType dt, void* out, const void* query, int64_t qs, const void* kc,
                        const void* vc, const int32_t* bt, const int32_t* sl,
                        int64_t seqs, int64_t heads, int64_t kv_heads,
                        int64_t head_size, int64_t block_size, int64_t max_blocks,
                        float scale) {
  if (dt == DType::kFloat32)
    return paged_attention_t(static_cast<float*>(out), static_cast<const float*>(query), qs,
                             static_cast<const float*>(kc), static_cast<const float*>(vc),
                             bt, sl, seqs, heads, kv_heads, head_size, block_size, max_blocks, scale);
  return paged_attention_t(static_cast<uint16_t*>(out), static_cast<const uint16_t*>(query), qs,
                             static_cast<const uint16_t*>(kc), static_cast<const uint16_t*>(vc),
                             bt, sl, seqs, heads, kv_heads, head_size, block_size, max_blocks, scale);
}

}  // namespace
}  // namespace engine::cpu
