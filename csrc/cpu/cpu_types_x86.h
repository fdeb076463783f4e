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
//
// The wrappers are written once over ENGINE_MM / ENGINE_MMI, which name this
// width's intrinsic (AVX-512 and AVX2 spell most of them alike but for the
// prefix); only what differs in substance (horizontal sums, narrowing stores,
// NaN rounding, shuffles across 128-bit lanes) is written per ISA.
#if defined(__AVX512F__) && defined(__AVX512BW__)
#define ENGINE_VEC_WIDTH 16
#define ENGINE_MM(op) _mm512_##op           // ENGINE_MM(add_ps): _mm512_add_ps
#define ENGINE_MMI(op) _mm512_##op##_si512  // ENGINE_MMI(and): _mm512_and_si512
using VecH = __m256i;                       // half a vector: W 16-bit values
inline VecH vload_h(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }
inline __m512i vset1_i64(int64_t x) { return _mm512_set1_epi64(x); }
#elif defined(__AVX2__) && defined(__FMA__)
#define ENGINE_VEC_WIDTH 8
#define ENGINE_MM(op) _mm256_##op
#define ENGINE_MMI(op) _mm256_##op##_si256
using VecH = __m128i;
inline VecH vload_h(const void* p) { return _mm_loadu_si128(static_cast<const __m128i*>(p)); }
inline __m256i vset1_i64(int64_t x) { return _mm256_set1_epi64x(x); }
#endif

#ifdef ENGINE_VEC_WIDTH
using VecF = decltype(ENGINE_MM(setzero_ps)());
using VecI = decltype(ENGINE_MMI(setzero)());
using VecP = VecI;  // 2 W bfloat16 bits (vpack2, vpack_pair)
inline VecF vas_float(VecI v) { return reinterpret_cast<VecF>(v); }  // the same bits
inline VecI vas_int(VecF v) { return reinterpret_cast<VecI>(v); }
inline VecF vset1(float x) { return ENGINE_MM(set1_ps)(x); }
inline VecF vadd(VecF a, VecF b) { return ENGINE_MM(add_ps)(a, b); }
inline VecF vsub(VecF a, VecF b) { return ENGINE_MM(sub_ps)(a, b); }
inline VecF vmul(VecF a, VecF b) { return ENGINE_MM(mul_ps)(a, b); }
inline VecF vfma(VecF a, VecF b, VecF c) { return ENGINE_MM(fmadd_ps)(a, b, c); }
inline VecF vfnma(VecF a, VecF b, VecF c) { return ENGINE_MM(fnmadd_ps)(a, b, c); }  // c - a*b
inline VecF vload(const float* p) { return ENGINE_MM(loadu_ps)(p); }
inline void vstore(float* p, VecF v) { ENGINE_MM(storeu_ps)(p, v); }
inline VecF vbits_to_float(VecI bits) { return vas_float(ENGINE_MM(slli_epi32)(bits, 16)); }
inline VecF vwiden(VecH h) { return vbits_to_float(ENGINE_MM(cvtepu16_epi32)(h)); }
inline VecF vload(const uint16_t* p) { return vwiden(vload_h(p)); }
inline void vstore_p(uint16_t* p, VecP v) { ENGINE_MMI(storeu)(reinterpret_cast<VecI*>(p), v); }
// float -> bfloat16 bits in the low half of each 32-bit lane, rounded to
// nearest even; NaN: see vbf16_bits.
inline VecI vbf16_round(VecF v) {
  const VecI u = vas_int(v);
  const VecI lsb = ENGINE_MMI(and)(ENGINE_MM(srli_epi32)(u, 16), ENGINE_MM(set1_epi32)(1));
  const VecI biased = ENGINE_MM(add_epi32)(ENGINE_MM(add_epi32)(u, ENGINE_MM(set1_epi32)(0x7fff)), lsb);
  return ENGINE_MM(srli_epi32)(biased, 16);
}
#endif

#if ENGINE_VEC_WIDTH == 16
inline float vsum(VecF a) { return _mm512_reduce_add_ps(a); }
inline float vfirst(VecF v) { return _mm512_cvtss_f32(v); }
// silu(x) = x / (1 + e^-x) on 16 lanes: e^-x by Cephes' polynomial (scalar.h's
// fast_exp) with vscalefps for the 2^k, 1 / (1 + e) by vrcp14ps and one
// Newton step (2^-28). 25 operations a vector,
// where the omp simd loop over scalar.h's silu took about 50 (its clamps
// compile to compares and blends): silu_and_mul at 500 x 1536 2x faster.
#define ENGINE_VEC_SILU 1
inline VecF vsilu(VecF x) {
  // -x in [-87.3, 69], as scalar.h's: the reduction below loses r past it (a
  // NaN's lane ends NaN through the final product with x)
  const __m512 nx = _mm512_min_ps(_mm512_max_ps(_mm512_sub_ps(_mm512_setzero_ps(), x),
                                                _mm512_set1_ps(-87.3f)), _mm512_set1_ps(69.0f));
  const __m512 k = _mm512_roundscale_ps(_mm512_mul_ps(nx, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(k, _mm512_set1_ps(0.693359375f), nx);
  r = _mm512_fmadd_ps(k, _mm512_set1_ps(2.12194440e-4f), r);
  __m512 p = _mm512_fmadd_ps(_mm512_set1_ps(1.9875691500e-4f), r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(_mm512_mul_ps(p, r), r, _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  const __m512 d = _mm512_add_ps(_mm512_set1_ps(1.0f), _mm512_scalef_ps(p, k));
  __m512 inv = _mm512_rcp14_ps(d);
  inv = _mm512_mul_ps(inv, _mm512_fnmadd_ps(d, inv, _mm512_set1_ps(2.0f)));
  return _mm512_mul_ps(x, inv);
}
// Lane j: op (add, max) over the lanes of v[j], 16 vectors at once. A tree of
// pairwise shuffle-ops (15 of them, 3 operations each) where 16 horizontal
// reductions take 8 each; its lanes come out in the order (j % 4) * 4 + j / 4,
// one permute restores them.
template <typename Op>
inline __m512 vreduce_rows(const __m512* v, Op op) {
  __m512 a[8], b[4], c[2];
  for (int j = 0; j < 8; ++j)  // quarters 0+2 and 1+3 of rows 2j and 2j+1
    a[j] = op(_mm512_shuffle_f32x4(v[2 * j], v[2 * j + 1], 0x44),
              _mm512_shuffle_f32x4(v[2 * j], v[2 * j + 1], 0xEE));
  for (int j = 0; j < 4; ++j)  // quarter k: 4 partial results of row 4j + k
    b[j] = op(_mm512_shuffle_f32x4(a[2 * j], a[2 * j + 1], 0x88),
              _mm512_shuffle_f32x4(a[2 * j], a[2 * j + 1], 0xDD));
  for (int j = 0; j < 2; ++j)
    c[j] = op(_mm512_shuffle_ps(b[2 * j], b[2 * j + 1], 0x44),
              _mm512_shuffle_ps(b[2 * j], b[2 * j + 1], 0xEE));
  const __m512 d = op(_mm512_shuffle_ps(c[0], c[1], 0x88), _mm512_shuffle_ps(c[0], c[1], 0xDD));
  return _mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15), d);
}
// Lane j: the sum of row j of the 16 x 16 floats at p.
inline VecF vsum_rows(const float* p) {
  __m512 v[16];
  for (int j = 0; j < 16; ++j) v[j] = _mm512_loadu_ps(p + 16 * j);
  return vreduce_rows(v, [](__m512 x, __m512 y) { return _mm512_add_ps(x, y); });
}
// NaN to the quiet 0x7fc0 (c10::BFloat16's rule, as float_to_bf16 in scalar.h).
inline VecI vbf16_bits(VecF v) {
  return _mm512_mask_mov_epi32(vbf16_round(v), _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q),
                               _mm512_set1_epi32(0x7fc0));
}
inline void vstore_bits(uint16_t* p, VecI bits) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(bits));
}
// packus works within 128-bit lanes; one permute puts a's 16 values in the
// low half and b's in the high half (cheaper than two vpmovdw).
inline VecP vpack_bits2(VecI a, VecI b) {
  const __m512i order = _mm512_setr_epi64(0, 2, 4, 6, 1, 3, 5, 7);
  return _mm512_permutexvar_epi64(order, _mm512_packus_epi32(a, b));
}
inline void vstore_halves(uint16_t* p, uint16_t* q, VecP v) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_castsi512_si256(v));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(q), _mm512_extracti64x4_epi64(v, 1));
}
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
inline VecF vwiden_lo(VecP v) { return vwiden(_mm512_castsi512_si256(v)); }
inline VecF vwiden_hi(VecP v) { return vwiden(_mm512_extracti64x4_epi64(v, 1)); }
#endif  // __AVX512BF16__
#elif ENGINE_VEC_WIDTH == 8
inline float vsum(VecF a) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
// Lane j: the sum of row j of the 8 x 8 floats at p (the AVX-512 tree's last
// three levels; lanes in the order (j % 2) * 4 + j / 2, a permute restores them).
inline VecF vsum_rows(const float* p) {
  __m256 b[4], c[2];
  for (int j = 0; j < 4; ++j) {  // 128-bit half k: 4 partial sums of row 2j + k
    const __m256 x = _mm256_loadu_ps(p + 16 * j), y = _mm256_loadu_ps(p + 16 * j + 8);
    b[j] = _mm256_add_ps(_mm256_permute2f128_ps(x, y, 0x20), _mm256_permute2f128_ps(x, y, 0x31));
  }
  for (int j = 0; j < 2; ++j)
    c[j] = _mm256_add_ps(_mm256_shuffle_ps(b[2 * j], b[2 * j + 1], 0x44),
                         _mm256_shuffle_ps(b[2 * j], b[2 * j + 1], 0xEE));
  const __m256 d = _mm256_add_ps(_mm256_shuffle_ps(c[0], c[1], 0x88), _mm256_shuffle_ps(c[0], c[1], 0xDD));
  return _mm256_permutevar8x32_ps(d, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}
// Without the NaN blend of the AVX-512 path (a third of the work here): NaN
// still stays NaN, because every value these kernels round is computed from
// bfloat16 inputs, so a NaN's low 16 mantissa bits are zero (a propagated
// payload) or it is the default NaN, and adding the rounding bias cannot carry
// out of its mantissa.
inline VecI vbf16_bits(VecF v) { return vbf16_round(v); }
inline void vstore_bits(uint16_t* p, VecI bits) {
  __m128i packed = _mm_packus_epi32(_mm256_castsi256_si128(bits), _mm256_extracti128_si256(bits, 1));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), packed);
}
// Two vectors in one pack: packus works within 128-bit lanes, one permute
// restores the order (half the shuffles of two vstore_bits).
inline VecP vpack_bits2(VecI a, VecI b) {
  return _mm256_permute4x64_epi64(_mm256_packus_epi32(a, b), 0xD8);
}
inline void vstore_halves(uint16_t* p, uint16_t* q, VecP v) {
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_castsi256_si128(v));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(q), _mm256_extracti128_si256(v, 1));
}
#endif  // ENGINE_VEC_WIDTH

#ifdef ENGINE_VEC_WIDTH
#ifdef ENGINE_BF16_CVT
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
// 2 W bfloat16 as two float vectors in lane order: per 128-bit lane, a holds
// its first 4 elements, b its last 4; one packus (no permute) is the inverse.
inline void vload_pair(const uint16_t* p, VecF& a, VecF& b) {
  const VecI v = ENGINE_MMI(loadu)(reinterpret_cast<const VecI*>(p)), zero = ENGINE_MMI(setzero)();
  a = vas_float(ENGINE_MM(unpacklo_epi16)(zero, v));
  b = vas_float(ENGINE_MM(unpackhi_epi16)(zero, v));
}
inline VecP vpack_pair_bits(VecI a, VecI b) { return ENGINE_MM(packus_epi32)(a, b); }
inline VecP vpack_pair(VecF a, VecF b) { return vpack_pair_bits(vbf16_bits(a), vbf16_bits(b)); }
#endif  // ENGINE_BF16_CVT
#endif  // ENGINE_VEC_WIDTH

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
