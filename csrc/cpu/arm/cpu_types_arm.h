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
// Lane j: the sum of row j of the W x W floats at p (W horizontal sums at once).
inline VecF vsum_rows(const float* p) {
  return vpaddq_f32(vpaddq_f32(vld1q_f32(p), vld1q_f32(p + 4)),
                    vpaddq_f32(vld1q_f32(p + 8), vld1q_f32(p + 12)));
}
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
// Interleaved (GPT-J) pairs: 2 * W values as the W first and the W second of
// each pair, and back (LD2/ST2); rotary_t's GPT-J loop takes them where the ISA
// has them (ENGINE_VEC_DEINTERLEAVE).
#define ENGINE_VEC_DEINTERLEAVE 1
inline void vload_deinterleave(const float* p, VecF& a, VecF& b) {
  const float32x4x2_t v = vld2q_f32(p);
  a = v.val[0];
  b = v.val[1];
}
inline void vload_deinterleave(const uint16_t* p, VecF& a, VecF& b) {
  const uint16x4x2_t h = vld2_u16(p);
  a = bf16x4_to_f32(h.val[0]);
  b = bf16x4_to_f32(h.val[1]);
}
inline void vstore_interleave(float* p, VecF a, VecF b) { vst2q_f32(p, float32x4x2_t{{a, b}}); }
inline void vstore_interleave(uint16_t* p, VecF a, VecF b) {
  vst2_u16(p, uint16x4x2_t{{f32_to_bf16x4(a), f32_to_bf16x4(b)}});
}

// ---- math --------------------------------------------------------------------

// exp(x), Cephes' expf polynomial (the same as scalar.h's fast_exp), relative
// error about 1e-7 over the clamped range; no libm vector call.
inline VecF vexp(VecF x) {
  x = vminq_f32(vmaxq_f32(x, vdupq_n_f32(-87.3f)), vdupq_n_f32(88.3f));
  const VecF shifter = vdupq_n_f32(12582912.0f);
  VecF kn = vfmaq_f32(shifter, x, vdupq_n_f32(1.44269504088896341f));
  int32x4_t n = vreinterpretq_s32_u32(
      vsubq_u32(vreinterpretq_u32_f32(kn), vreinterpretq_u32_f32(shifter)));
  VecF k = vsubq_f32(kn, shifter);
  VecF r = vfmsq_f32(x, k, vdupq_n_f32(0.693359375f));
  r = vfmaq_f32(r, k, vdupq_n_f32(2.12194440e-4f));
  VecF p = vdupq_n_f32(1.9875691500e-4f);
  p = vfmaq_f32(vdupq_n_f32(1.3981999507e-3f), p, r);
  p = vfmaq_f32(vdupq_n_f32(8.3334519073e-3f), p, r);
  p = vfmaq_f32(vdupq_n_f32(4.1665795894e-2f), p, r);
  p = vfmaq_f32(vdupq_n_f32(1.6666665459e-1f), p, r);
  p = vfmaq_f32(vdupq_n_f32(5.0000001201e-1f), p, r);
  VecF y = vaddq_f32(vfmaq_f32(r, vmulq_f32(p, r), r), vdupq_n_f32(1.0f));
  int32x4_t scale = vshlq_n_s32(vaddq_s32(n, vdupq_n_s32(127)), 23);
  return vmulq_f32(y, vreinterpretq_f32_s32(scale));
}

// silu(x) = x / (1 + exp(-x)); -x clamped at 69 (the result is ~0 there). NEON
// divides (x86 vectorizes scalar.h's silu, whose Newton reciprocal is cheaper
// than its vector division): activation_impl.h takes this one where
// ENGINE_VEC_SILU is set, for every element of the row, tail included.
#define ENGINE_VEC_SILU 1
inline VecF vsilu(VecF x) {
  VecF nx = vminq_f32(vnegq_f32(x), vdupq_n_f32(69.0f));
  return vdivq_f32(x, vaddq_f32(vdupq_n_f32(1.0f), vexp(nx)));
}
inline float vfirst(VecF v) { return vgetq_lane_f32(v, 0); }

}  // namespace
}  // namespace engine::cpu
