// The per-ISA vector types of the AArch64 kernels (as upstream vLLM's
// csrc/cpu/cpu_types_arm.hpp): the names cpu_types_x86.h gives its AVX2 and
// AVX-512 vectors, for NEON's four floats, so that kernels written once
// against them (attention_impl.h) run here too. Included (through
// cpu_types.h) only by arm/kernels_neon.cpp, which defines ENGINE_NEON_KERNELS:
// the portable "generic" table built from kernels_impl.cpp on AArch64 stays
// the scalar reference it is.
#pragma once

#include <arm_neon.h>
#include <stdint.h>

#include "../scalar.h"

#if defined(__ARM_FEATURE_BF16_VECTOR_ARITHMETIC) || defined(__ARM_FEATURE_BF16)
#define ENGINE_NEON_BF16 1
#else
#define ENGINE_NEON_BF16 0
#endif

namespace engine::cpu {
namespace {

inline float32x4_t bf16x4_to_f32(uint16x4_t h) {
  return vreinterpretq_f32_u32(vshll_n_u16(h, 16));
}

inline uint16x4_t f32_to_bf16x4(float32x4_t f) {
#if ENGINE_NEON_BF16
  return vreinterpret_u16_bf16(vcvt_bf16_f32(f));  // BFCVTN: round to nearest even
#else
  uint32x4_t u = vreinterpretq_u32_f32(f);
  uint32x4_t lsb = vandq_u32(vshrq_n_u32(u, 16), vdupq_n_u32(1));
  uint32x4_t r = vaddq_u32(vaddq_u32(u, vdupq_n_u32(0x7fffu)), lsb);
  uint32x4_t isnum = vceqq_f32(f, f);
  r = vbslq_u32(isnum, r, vdupq_n_u32(0x7fc00000u));
  return vshrn_n_u32(r, 16);
#endif
}

#define ENGINE_VEC_WIDTH 4
using VecF = float32x4_t;
constexpr int64_t W = ENGINE_VEC_WIDTH;
inline VecF vset1(float x) { return vdupq_n_f32(x); }
inline VecF vadd(VecF a, VecF b) { return vaddq_f32(a, b); }
inline VecF vsub(VecF a, VecF b) { return vsubq_f32(a, b); }
inline VecF vmul(VecF a, VecF b) { return vmulq_f32(a, b); }
inline VecF vfma(VecF a, VecF b, VecF c) { return vfmaq_f32(c, a, b); }   // a*b + c
inline VecF vfnma(VecF a, VecF b, VecF c) { return vfmsq_f32(c, a, b); }  // c - a*b
inline float vsum(VecF a) { return vaddvq_f32(a); }
inline VecF vload(const float* p) { return vld1q_f32(p); }
inline void vstore(float* p, VecF v) { vst1q_f32(p, v); }
inline VecF vload(const uint16_t* p) { return bf16x4_to_f32(vld1_u16(p)); }
inline void vstore(uint16_t* p, VecF v) { vst1_u16(p, f32_to_bf16x4(v)); }
// Pair order (cpu_types_x86.h): the natural one here, two vectors in a row.
inline void vload_pair(const float* p, VecF& a, VecF& b) {
  a = vload(p);
  b = vload(p + W);
}
inline void vload_pair(const uint16_t* p, VecF& a, VecF& b) {
  a = vload(p);
  b = vload(p + W);
}
template <typename T>
inline void vstore_pair(T* p, VecF a, VecF b) {
  vstore(p, a);
  vstore(p + W, b);
}
template <typename T>
inline void vstore_split(T* p, T* q, VecF a, VecF b) {
  vstore(p, a);
  vstore(q, b);
}
// The value a float becomes once stored as T.
inline VecF vround(VecF v, const float*) { return v; }
inline VecF vround(VecF v, const uint16_t*) { return bf16x4_to_f32(f32_to_bf16x4(v)); }
// Store a and b as T and replace them by the values stored (rounded once).
template <typename T>
inline void vstore_pair_rounded(T* p, VecF& a, VecF& b) {
  a = vround(a, p);
  b = vround(b, p);
  vstore_pair(p, a, b);
}
// A cache line toward L1 ahead of its use (PRFM PLDL1KEEP).
inline void vprefetch(const void* p) { __builtin_prefetch(p, 0, 3); }

}  // namespace
}  // namespace engine::cpu
