// The integer vector operations of the GGUF int8 kernel (gguf_int8_impl.cpp)
// on each x86 ISA (NEON's: arm/gguf_int8_isa_neon.h), written once over a few
// per-ISA names: L int32 lanes a vector (16 with AVX-512, 8 with AVX2: a panel
// is then two vectors), R_MAX rows a tile, the dot products and x's per-group
// staging helpers.
// Internal linkage (kernels.h says why); kernel translation units only.
#pragma once

#include <stdint.h>

#include "cpu_types.h"

#ifndef ENGINE_VEC_WIDTH
#error "gguf_int8_isa.h is for the vector kernel translation units (x86, NEON)"
#endif

#if defined(__aarch64__)
#include "arm/gguf_int8_isa_neon.h"
#else
namespace engine::cpu {
namespace {

#if defined(__AVX512F__) && defined(__AVX512BW__)
#define ENGINE_SI(op) _mm512_##op##_si512
#define ENGINE_EPI(op) _mm512_##op
constexpr int L = 16;     // int32 lanes a vector: one panel
constexpr int R_MAX = 8;  // rows a tile: 2 x 8 int32 and 8 float accumulators of 32 registers
inline VecF hload(const uint16_t* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
inline VecI ior_and(VecI a, VecI b, VecI m) { return _mm512_ternarylogic_epi32(a, b, m, 0xF8); }
#ifdef __AVX512VNNI__
constexpr bool kSigned8 = false;
inline VecI dot_u(VecI acc, VecI w, VecI a) { return _mm512_dpbusd_epi32(acc, w, a); }
inline VecI dot8(VecI acc, VecI w, VecI a) { return _mm512_dpbusd_epi32(acc, w, a); }
#else
constexpr bool kSigned8 = true;
inline VecI dot_u(VecI acc, VecI w, VecI a) {  // w < 64: a pair's sum fits int16
  return _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_maddubs_epi16(w, a), _mm512_set1_epi16(1)));
}
inline VecI dot8(VecI acc, VecI w, VecI a) {  // (w - 128) . a as |w - 128| . (a with its sign)
  const VecI ws = _mm512_xor_si512(w, _mm512_set1_epi8(static_cast<char>(0x80)));
  const VecI as = _mm512_mask_sub_epi8(a, _mm512_movepi8_mask(ws), _mm512_setzero_si512(), a);
  return dot_u(acc, _mm512_abs_epi8(ws), as);
}
#endif
inline VecF vabsmax(VecF m, VecF v) { return _mm512_max_ps(m, _mm512_abs_ps(v)); }
inline float vhmax(VecF v) { return _mm512_reduce_max_ps(v); }
inline int ihsum(VecI v) { return _mm512_reduce_add_epi32(v); }
// the int8 values of v's 16 lanes at p; NIB: each 8 in the nibbles' order
template <bool NIB>
inline void store_i8(int8_t* p, VecI v) {
  if constexpr (NIB)
    v = _mm512_permutexvar_epi32(_mm512_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7, 8, 10, 12, 14, 9, 11, 13, 15), v);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm512_cvtepi32_epi8(v));
}
#else  // AVX2
#define ENGINE_SI(op) _mm256_##op##_si256
#define ENGINE_EPI(op) _mm256_##op
constexpr int L = 8;
constexpr int R_MAX = 4;
inline VecF hload(const uint16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
inline VecI ior_and(VecI a, VecI b, VecI m) { return _mm256_or_si256(a, _mm256_and_si256(b, m)); }
constexpr bool kSigned8 = true;
inline VecI dot_u(VecI acc, VecI w, VecI a) {
  return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(w, a), _mm256_set1_epi16(1)));
}
inline VecI dot8(VecI acc, VecI w, VecI a) {
  const VecI ws = _mm256_xor_si256(w, _mm256_set1_epi8(static_cast<char>(0x80)));
  return dot_u(acc, _mm256_abs_epi8(ws), _mm256_sign_epi8(a, ws));
}
inline VecF vabsmax(VecF m, VecF v) {
  return _mm256_max_ps(m, _mm256_andnot_ps(_mm256_set1_ps(-0.f), v));
}
inline float vhmax(VecF v) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_max_ss(s, _mm_movehdup_ps(s)));
}
inline int ihsum(VecI v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
  return _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1)));
}
template <bool NIB>
inline void store_i8(int8_t* p, VecI v) {
  if constexpr (NIB) v = _mm256_permutevar8x32_epi32(v, _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7));
  // each 128-bit half: its 4 low bytes first
  const VecI b = _mm256_shuffle_epi8(v, _mm256_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1,
                                                         -1, -1, -1, -1, 0, 4, 8, 12, -1, -1, -1, -1,
                                                         -1, -1, -1, -1, -1, -1, -1, -1));
  const __m128i lo = _mm_unpacklo_epi32(_mm256_castsi256_si128(b), _mm256_extracti128_si256(b, 1));
  _mm_storel_epi64(reinterpret_cast<__m128i*>(p), lo);
}
#endif

// the weight `ahead` fetched: 8-bit into L2 only (gguf_int8_impl.cpp says why)
template <bool L2>
inline void wprefetch(const void* p) {
  _mm_prefetch(static_cast<const char*>(p), L2 ? _MM_HINT_T1 : _MM_HINT_T0);
}

// The rest is the same on both: the per-ISA names through ENGINE_SI / ENGINE_EPI.
inline VecI iload(const uint32_t* p) { return ENGINE_SI(loadu)(reinterpret_cast<const VecI*>(p)); }
inline VecI ibcast(const int32_t* p) { return ENGINE_EPI(set1_epi32)(*p); }
// dot_u and dot8 with the x bytes' word broadcast from p
#if defined(__AVX512VNNI__) && defined(__AVX512F__)
// The broadcast inside vpdpbusd ({1to16}): GCC 12 keeps each set1 a vpbroadcastd
// of its own, one more vector op a dot product. Folded (Zen 4, 16 rows, SmolLM's
// layers x 30, 2 threads, cold weights, in turns in one process): Q4_0 260 ->
// 273 GMAC/s; with the zero point folded at staging too (gguf_int8_impl.cpp)
// 239 -> 268, 5-bit 218 -> 247.
inline VecI dot_b(VecI acc, VecI w, const int32_t* p) {
  asm("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(w), "m"(*p));
  return acc;
}
inline VecI dot8_b(VecI acc, VecI w, const int32_t* p) { return dot_b(acc, w, p); }
#else
inline VecI dot_b(VecI acc, VecI w, const int32_t* p) { return dot_u(acc, w, ibcast(p)); }
inline VecI dot8_b(VecI acc, VecI w, const int32_t* p) { return dot8(acc, w, ibcast(p)); }
#endif
inline VecI iand(VecI a, VecI b) { return ENGINE_SI(and)(a, b); }
template <int S>
inline VecI isrl(VecI a) { return ENGINE_EPI(srli_epi32)(a, S); }
template <int S>
inline VecI isll(VecI a) {
  if constexpr (S < 0) return ENGINE_EPI(srli_epi32)(a, -S);
  else return ENGINE_EPI(slli_epi32)(a, S);
}
inline VecI iset1(int v) { return ENGINE_EPI(set1_epi32)(v); }
inline VecI iadd(VecI a, VecI b) { return ENGINE_EPI(add_epi32)(a, b); }
inline VecI izero() { return ENGINE_SI(setzero)(); }
inline VecF icvt(VecI v) { return ENGINE_EPI(cvtepi32_ps)(v); }
inline VecI iround(VecF v) { return ENGINE_EPI(cvtps_epi32)(v); }  // to nearest even (MXCSR)
#undef ENGINE_SI
#undef ENGINE_EPI

static_assert(L == ENGINE_VEC_WIDTH, "a float vector and an int32 one have as many lanes");

}  // namespace
}  // namespace engine::cpu
#endif  // x86
