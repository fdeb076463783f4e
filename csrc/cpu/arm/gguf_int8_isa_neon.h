// The GGUF int8 kernel's integer vector names (gguf_int8_isa.h) on AArch64:
// 4 int32 lanes a vector (a 16-column panel is 4 of them). With the dot
// product extension (the neon_bf16 table, built +dotprod) one SDOT sums 4 byte
// products into each lane, as vpdpbusd does; on baseline ARMv8 (the neon
// table) two widening multiplies and three pairwise adds do the same. Both
// multiply signed bytes: 4- to 6-bit q (below 64) are already non-negative,
// 8-bit q run as q - 128 (kSigned8), as on AVX2. Kernel translation units only.
#pragma once

#include <arm_neon.h>
#include <stdint.h>

namespace engine::cpu {
namespace {

using VecI = int32x4_t;
constexpr int L = 4;      // int32 lanes a vector
constexpr int R_MAX = 8;  // rows a tile: 8 int32 and 8 float accumulators of 32 registers
constexpr bool kSigned8 = true;

inline VecF hload(const uint16_t* p) {
  return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p)));
}
inline VecI ior_and(VecI a, VecI b, VecI m) { return vorrq_s32(a, vandq_s32(b, m)); }

// lane i += the 4 products of bytes 4i .. 4i+3 of w and a (signed)
inline VecI dot_s(VecI acc, VecI w, VecI a) {
#if defined(__ARM_FEATURE_DOTPROD)
  return vdotq_s32(acc, vreinterpretq_s8_s32(w), vreinterpretq_s8_s32(a));
#else
  // |a byte's product| <= 128 x 127: each fits int16, a pair's sum int32
  const int8x16_t wb = vreinterpretq_s8_s32(w), ab = vreinterpretq_s8_s32(a);
  const int16x8_t lo = vmull_s8(vget_low_s8(wb), vget_low_s8(ab));
  const int16x8_t hi = vmull_high_s8(wb, ab);
  return vaddq_s32(acc, vpaddq_s32(vpaddlq_s16(lo), vpaddlq_s16(hi)));
#endif
}
inline VecI dot_u(VecI acc, VecI w, VecI a) { return dot_s(acc, w, a); }  // w < 64
inline VecI dot8(VecI acc, VecI w, VecI a) {  // (w - 128) . a
  return dot_s(acc, veorq_s32(w, vdupq_n_s32(static_cast<int32_t>(0x80808080u))), a);
}
inline VecI dot_b(VecI acc, VecI w, const int32_t* p) { return dot_u(acc, w, vld1q_dup_s32(p)); }
inline VecI dot8_b(VecI acc, VecI w, const int32_t* p) { return dot8(acc, w, vld1q_dup_s32(p)); }

inline VecF vabsmax(VecF m, VecF v) { return vmaxq_f32(m, vabsq_f32(v)); }
inline float vhmax(VecF v) { return vmaxvq_f32(v); }
inline int ihsum(VecI v) { return vaddvq_s32(v); }
// the int8 values of two vectors' 8 lanes (k .. k+7) at p; NIB: the even k first
template <bool NIB>
inline void store_i8x2(int8_t* p, VecI a, VecI b) {
  if constexpr (NIB) {
    const VecI e = vuzp1q_s32(a, b), o = vuzp2q_s32(a, b);
    a = e;
    b = o;
  }
  const int16x8_t h = vcombine_s16(vmovn_s32(a), vmovn_s32(b));
  vst1_s8(p, vmovn_s16(h));
}
// the weight `ahead` fetched: 8-bit into L2 only, as on x86 (gguf_int8_impl.cpp)
template <bool L2>
inline void wprefetch(const void* p) { __builtin_prefetch(p, 0, L2 ? 2 : 3); }

inline VecI iload(const uint32_t* p) { return vreinterpretq_s32_u32(vld1q_u32(p)); }
inline VecI iand(VecI a, VecI b) { return vandq_s32(a, b); }
template <int S>
inline VecI isrl(VecI a) {
  if constexpr (S == 0) return a;
  else return vreinterpretq_s32_u32(vshrq_n_u32(vreinterpretq_u32_s32(a), S));
}
template <int S>
inline VecI isll(VecI a) {
  if constexpr (S < 0) return isrl<-S>(a);
  else if constexpr (S == 0) return a;
  else return vshlq_n_s32(a, S);
}
inline VecI iset1(int v) { return vdupq_n_s32(v); }
inline VecI iadd(VecI a, VecI b) { return vaddq_s32(a, b); }
inline VecI izero() { return vdupq_n_s32(0); }
inline VecF icvt(VecI v) { return vcvtq_f32_s32(v); }
inline VecI iround(VecF v) { return vcvtnq_s32_f32(v); }  // to nearest even, as x86's

static_assert(L == ENGINE_VEC_WIDTH, "a float vector and an int32 one have as many lanes");

}  // namespace
}  // namespace engine::cpu
