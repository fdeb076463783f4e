// The per-ISA vector types of the x86 kernels (as upstream vLLM's
// csrc/cpu/cpu_types_x86.hpp): VecF, W floats a vector (16 with AVX-512, 8
// with AVX2), its bfloat16 loads and stores, and the pair order the
// element-wise kernels use. Kernels are written once against these and
// compiled per ISA; where neither ISA is on (the generic path) nothing is
// defined and ENGINE_VEC_WIDTH stays unset.
#pragma once

#include <stdint.h>
#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "scalar.h"

namespace engine::cpu {
namespace {

// ---- explicit vectors (x86) --------------------------------------------------
//
// The bfloat16 conversions do not auto-vectorize well (16-bit loads and the
// rounding rule defeat the vectorizer), so the row kernels use intrinsics:
// 16 floats a vector with AVX-512, 8 with AVX2. immintrin.h defines its
// intrinsics always-inline (gnu_inline): no out-of-line copy can leak into
// the baseline glue. Other ISAs keep the portable `omp simd` loops below.
#if defined(__AVX512F__) && defined(__AVX512BW__)
#include <immintrin.h>
#define ENGINE_VEC_WIDTH 16
using VecF = __m512;
using VecI = __m512i;
inline VecF vset1(float x) { return _mm512_set1_ps(x); }
inline VecF vadd(VecF a, VecF b) { return _mm512_add_ps(a, b); }
inline VecF vsub(VecF a, VecF b) { return _mm512_sub_ps(a, b); }
inline VecF vmul(VecF a, VecF b) { return _mm512_mul_ps(a, b); }
inline VecF vfma(VecF a, VecF b, VecF c) { return _mm512_fmadd_ps(a, b, c); }
inline VecF vfnma(VecF a, VecF b, VecF c) { return _mm512_fnmadd_ps(a, b, c); }  // c - a*b
inline float vsum(VecF a) { return _mm512_reduce_add_ps(a); }
inline VecF vload(const float* p) { return _mm512_loadu_ps(p); }
inline void vstore(float* p, VecF v) { _mm512_storeu_ps(p, v); }
inline VecF vload(const uint16_t* p) {
  __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
// float -> bfloat16 bits in the low half of each 32-bit lane: round to nearest
// even, NaN to the quiet 0x7fc0 (c10::BFloat16's rule, as float_to_bf16 below).
inline VecI vbf16_bits(VecF v) {
  VecI u = _mm512_castps_si512(v);
  VecI lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  VecI r = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), lsb), 16);
  return _mm512_mask_mov_epi32(r, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), _mm512_set1_epi32(0x7fc0));
}
inline VecF vbits_to_float(VecI bits) { return _mm512_castsi512_ps(_mm512_slli_epi32(bits, 16)); }
inline void vstore_bits(uint16_t* p, VecI bits) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(bits));
}
// packus works within 128-bit lanes; one permute puts a's 16 values in the
// low half and b's in the high half (cheaper than two vpmovdw).
inline __m512i vpack_bits2(VecI a, VecI b) {
  const __m512i order = _mm512_setr_epi64(0, 2, 4, 6, 1, 3, 5, 7);
  return _mm512_permutexvar_epi64(order, _mm512_packus_epi32(a, b));
}
// a's 16 values and then b's as bfloat16 bits, in one vector.
using VecP = __m512i;
#ifdef __AVX512BF16__
#define ENGINE_BF16_CVT 1
// vcvtne2ps2bf16 rounds to nearest even as c10::BFloat16 does, but it flushes
// denormals to zero and keeps NaN payloads: a vector holding either takes the
// integer rounding instead, so results stay bit-identical to the other paths.
constexpr int kBf16Special = 0x01 | 0x20 | 0x80;  // fpclass: quiet NaN, denormal, signalling NaN
inline bool vbf16_plain(VecF v) { return _mm512_fpclass_ps_mask(v, kBf16Special) == 0; }
inline VecP vpack2(VecF a, VecF b) {
  if (__builtin_expect(vbf16_plain(a) & vbf16_plain(b), 1))
    return reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(b, a));
  return vpack_bits2(vbf16_bits(a), vbf16_bits(b));
}
inline void vstore(uint16_t* p, VecF v) {
  if (__builtin_expect(vbf16_plain(v), 1))
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(v)));
  else
    vstore_bits(p, vbf16_bits(v));
}
inline VecF vwiden(__m256i h) { return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)); }
inline VecF vwiden_lo(VecP v) { return vwiden(_mm512_castsi512_si256(v)); }
inline VecF vwiden_hi(VecP v) { return vwiden(_mm512_extracti64x4_epi64(v, 1)); }
// Pair order (see vload_pair below) is the natural one here: one instruction
// rounds two vectors in order.
inline void vload_pair(const uint16_t* p, VecF& a, VecF& b) {
  a = vload(p);
  b = vload(p + ENGINE_VEC_WIDTH);
}
inline VecP vpack_pair(VecF a, VecF b) { return vpack2(a, b); }
#else
inline VecP vpack2(VecF a, VecF b) { return vpack_bits2(vbf16_bits(a), vbf16_bits(b)); }
inline void vstore(uint16_t* p, VecF v) { vstore_bits(p, vbf16_bits(v)); }
// 32 bfloat16 as two float vectors in lane order: a holds elements 0-3, 8-11,
// 16-19, 24-27, b the others; one packus (no permute) is the inverse.
inline void vload_pair(const uint16_t* p, VecF& a, VecF& b) {
  const __m512i v = _mm512_loadu_si512(p), zero = _mm512_setzero_si512();
  a = _mm512_castsi512_ps(_mm512_unpacklo_epi16(zero, v));
  b = _mm512_castsi512_ps(_mm512_unpackhi_epi16(zero, v));
}
inline VecP vpack_pair_bits(VecI a, VecI b) { return _mm512_packus_epi32(a, b); }
inline VecP vpack_pair(VecF a, VecF b) { return vpack_pair_bits(vbf16_bits(a), vbf16_bits(b)); }
#endif
inline void vstore_p(uint16_t* p, VecP v) { _mm512_storeu_si512(p, v); }
inline void vstore_halves(uint16_t* p, uint16_t* q, VecP v) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_castsi512_si256(v));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(q), _mm512_extracti64x4_epi64(v, 1));
}
#elif defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define ENGINE_VEC_WIDTH 8
using VecF = __m256;
using VecI = __m256i;
inline VecF vset1(float x) { return _mm256_set1_ps(x); }
inline VecF vadd(VecF a, VecF b) { return _mm256_add_ps(a, b); }
inline VecF vsub(VecF a, VecF b) { return _mm256_sub_ps(a, b); }
inline VecF vmul(VecF a, VecF b) { return _mm256_mul_ps(a, b); }
inline VecF vfma(VecF a, VecF b, VecF c) { return _mm256_fmadd_ps(a, b, c); }
inline VecF vfnma(VecF a, VecF b, VecF c) { return _mm256_fnmadd_ps(a, b, c); }
inline float vsum(VecF a) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
inline VecF vload(const float* p) { return _mm256_loadu_ps(p); }
inline void vstore(float* p, VecF v) { _mm256_storeu_ps(p, v); }
inline VecF vload(const uint16_t* p) {
  __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
// Round to nearest even without the NaN blend of the AVX-512 path (a third of
// the work here): NaN still stays NaN, because every value these kernels round
// is computed from bfloat16 inputs, so a NaN's low 16 mantissa bits are zero
// (a propagated payload) or it is the default NaN, and adding the rounding
// bias cannot carry out of its mantissa.
inline VecI vbf16_bits(VecF v) {
  VecI u = _mm256_castps_si256(v);
  VecI lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  return _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), lsb), 16);
}
inline VecF vbits_to_float(VecI bits) { return _mm256_castsi256_ps(_mm256_slli_epi32(bits, 16)); }
inline void vstore_bits(uint16_t* p, VecI bits) {
  __m128i packed = _mm_packus_epi32(_mm256_castsi256_si128(bits), _mm256_extracti128_si256(bits, 1));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), packed);
}
inline void vstore(uint16_t* p, VecF v) { vstore_bits(p, vbf16_bits(v)); }
// Two vectors in one pack: packus works within 128-bit lanes, one permute
// restores the order (half the shuffles of two vstore_bits).
inline __m256i vpack_bits2(VecI a, VecI b) {
  return _mm256_permute4x64_epi64(_mm256_packus_epi32(a, b), 0xD8);
}
using VecP = __m256i;  // a's 8 values and then b's as bfloat16 bits
inline VecP vpack2(VecF a, VecF b) { return vpack_bits2(vbf16_bits(a), vbf16_bits(b)); }
// 16 bfloat16 as two float vectors in lane order: a holds elements 0-3 and
// 8-11, b 4-7 and 12-15; one packus (no permute) is the inverse.
inline void vload_pair(const uint16_t* p, VecF& a, VecF& b) {
  const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  const __m256i zero = _mm256_setzero_si256();
  a = _mm256_castsi256_ps(_mm256_unpacklo_epi16(zero, v));
  b = _mm256_castsi256_ps(_mm256_unpackhi_epi16(zero, v));
}
inline VecP vpack_pair_bits(VecI a, VecI b) { return _mm256_packus_epi32(a, b); }
inline VecP vpack_pair(VecF a, VecF b) { return vpack_pair_bits(vbf16_bits(a), vbf16_bits(b)); }
inline void vstore_p(uint16_t* p, VecP v) { _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), v); }
inline void vstore_halves(uint16_t* p, uint16_t* q, VecP v) {
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_castsi256_si128(v));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(q), _mm256_extracti128_si256(v, 1));
}
#endif

#ifdef ENGINE_VEC_WIDTH
constexpr int64_t W = ENGINE_VEC_WIDTH;
// Pair order: 2 * W elements of T as two float vectors, in an order of the
// ISA's choosing that vstore_pair undoes: natural for float, for bfloat16 the
// one that needs the fewest shuffles. Only for element-wise work whose every
// operand (a weight, a scratch row) is laid out in the same order; the
// remainder of a row past its last full pair stays in natural order.
inline void vload_pair(const float* p, VecF& a, VecF& b) {
  a = vload(p);
  b = vload(p + W);
}
inline void vstore_pair(float* p, VecF a, VecF b) {
  vstore(p, a);
  vstore(p + W, b);
}
inline void vstore_pair(uint16_t* p, VecF a, VecF b) { vstore_p(p, vpack_pair(a, b)); }
// Store a and b as T and replace them by the values stored (rounded once).
inline void vstore_pair_rounded(float* p, VecF& a, VecF& b) { vstore_pair(p, a, b); }
inline void vstore_pair_rounded(uint16_t* p, VecF& a, VecF& b) {
#ifdef ENGINE_BF16_CVT  // widening the rounded values back is cheaper than rounding by hand
  const VecP v = vpack_pair(a, b);
  vstore_p(p, v);
  a = vwiden_lo(v);
  b = vwiden_hi(v);
#else
  VecI ba = vbf16_bits(a), bb = vbf16_bits(b);
  vstore_p(p, vpack_pair_bits(ba, bb));
  a = vbits_to_float(ba);
  b = vbits_to_float(bb);
#endif
}
// a to p, b to q (rotary's two halves).
inline void vstore_split(float* p, float* q, VecF a, VecF b) {
  vstore(p, a);
  vstore(q, b);
}
inline void vstore_split(uint16_t* p, uint16_t* q, VecF a, VecF b) { vstore_halves(p, q, vpack2(a, b)); }
// The value a float becomes once stored as T (for fused_add_rms_norm, which
// normalizes exactly the residual it stored).
inline VecF vround(VecF v, const float*) { return v; }
inline VecF vround(VecF v, const uint16_t*) { return vbits_to_float(vbf16_bits(v)); }

// A cache line toward L1 ahead of its use.
inline void vprefetch(const void* p) { _mm_prefetch(static_cast<const char*>(p), _MM_HINT_T0); }
#endif  // ENGINE_VEC_WIDTH

}  // namespace
}  // namespace engine::cpu
