// CPU kernels, written once and compiled once per instruction set.
//
// CMake compiles this file with ENGINE_ISA set to avx2, avx512 or generic and
// the matching -m flags; the compiler vectorizes the `omp simd` loops for that
// ISA. Everything except the exported table getter has internal linkage (see
// kernels.h for why), and only C headers are included.
#include "kernels.h"
#include "scalar.h"
#include "amx.h"
#include "scratch.h"
#include "wna16.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#ifndef ENGINE_ISA
#error "ENGINE_ISA must be defined (avx2, avx512 or generic)"
#endif

namespace engine::cpu {
namespace {

// ---- element conversion ---------------------------------------------------

template <typename T>
struct Elem;
template <>
struct Elem<float> {
  static inline float load(float x) { return x; }
  static inline float store(float x) { return x; }
};
template <>
struct Elem<uint16_t> {
  static inline float load(uint16_t x) { return bf16_to_float(x); }
  static inline uint16_t store(float x) { return float_to_bf16(x); }
};

// ---- math -----------------------------------------------------------------

// exp(x) for float, branch-free so that it vectorizes (libm's expf would pull
// in libmvec, a dependency torch does not provide). Cephes' expf polynomial,
// relative error about 1e-7 over the clamped range.
inline float fast_exp(float x) {
  x = x < -87.3f ? -87.3f : x;
  x = x > 88.3f ? 88.3f : x;
  const float shifter = 12582912.0f;  // 1.5 * 2^23: rounds to an integer
  float kn = x * 1.44269504088896341f + shifter;
  int32_t n = static_cast<int32_t>(__builtin_bit_cast(uint32_t, kn) -
                                   __builtin_bit_cast(uint32_t, shifter));
  float k = kn - shifter;
  float r = x - k * 0.693359375f;
  r = r + k * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  float y = p * r * r + r + 1.0f;
  uint32_t scale_bits = static_cast<uint32_t>(n + 127) << 23;
  return y * __builtin_bit_cast(float, scale_bits);
}

// 1/d for d in [1, 1e30]: a bit-trick seed and three Newton steps (relative
// error ~1e-7). Cheaper than a vector division, which dominates silu otherwise.
inline float recip_ge1(float d) {
  float r = __builtin_bit_cast(float, 0x7EF311C7u - __builtin_bit_cast(uint32_t, d));
  r = r * (2.0f - d * r);
  r = r * (2.0f - d * r);
  return r * (2.0f - d * r);
}

// silu(x) = x / (1 + exp(-x)). Below x = -69 the result is below 1e-28 in
// magnitude; clamping there keeps the denominator in recip_ge1's range.
inline float silu(float x) {
  float nx = -x > 69.0f ? 69.0f : -x;
  return x * recip_ge1(1.0f + fast_exp(nx));
}

inline bool worth_threads(int64_t elements) { return elements >= 16384; }

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

// Every code path, the portable one too (the prefill attention reads it).
template <typename T>
struct IsBf16 { static constexpr bool value = false; };
template <>
struct IsBf16<uint16_t> { static constexpr bool value = true; };

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
// dst[0, n) = src as floats, full pairs in pair order and the rest natural:
// the scratch copy (a weight, cos/sin) of an operand read with vload_pair.
template <typename T>
inline void to_float_pairs(float* dst, const T* src, int64_t n) {
  int64_t i = 0;
  for (; i + 2 * W <= n; i += 2 * W) {
    VecF a, b;
    vload_pair(src + i, a, b);
    vstore_pair(dst + i, a, b);
  }
  for (; i < n; ++i) dst[i] = Elem<T>::load(src[i]);
}
// The value a float becomes once stored as T (for fused_add_rms_norm, which
// normalizes exactly the residual it stored).
inline VecF vround(VecF v, const float*) { return v; }
inline VecF vround(VecF v, const uint16_t*) { return vbits_to_float(vbf16_bits(v)); }

// Sum of squares of x[0, n); with `copy`, the floats are also written there (a
// bfloat16 row is converted once and both passes of the norm read floats).
template <typename T>
inline float sum_squares(const T* x, int64_t n, float* copy) {
  VecF a0 = vset1(0.f), a1 = vset1(0.f);
  int64_t i = 0;
  for (; i + 2 * W <= n; i += 2 * W) {  // the copy in pair order
    VecF v0, v1;
    vload_pair(x + i, v0, v1);
    if (copy) vstore_pair(copy + i, v0, v1);
    a0 = vfma(v0, v0, a0);
    a1 = vfma(v1, v1, a1);
  }
  for (; i + W <= n; i += W) {
    VecF v = vload(x + i);
    if (copy) vstore(copy + i, v);
    a0 = vfma(v, v, a0);
  }
  float acc = vsum(vadd(a0, a1));
  for (; i < n; ++i) {
    float v = Elem<T>::load(x[i]);
    if (copy) copy[i] = v;
    acc += v * v;
  }
  return acc;
}

// y = x * inv * w, x and w already floats, in pair order (vload_pair).
template <typename T>
inline void scale_row(T* y, const float* x, const float* w, int64_t n, float inv) {
  const VecF vi = vset1(inv);
  int64_t i = 0;
  for (; i + 2 * W <= n; i += 2 * W) {
    vstore_pair(y + i, vmul(vmul(vload(x + i), vi), vload(w + i)),
                vmul(vmul(vload(x + i + W), vi), vload(w + i + W)));
  }
  for (; i + W <= n; i += W) vstore(y + i, vmul(vmul(vload(x + i), vi), vload(w + i)));
  for (; i < n; ++i) y[i] = Elem<T>::store(x[i] * inv * w[i]);
}

// Per-thread float copies of the weight and of one row, for bfloat16 only:
// converting the weight once per thread instead of once per row, and the row
// once instead of once per pass, is most of a bfloat16 norm's arithmetic.
// failed(): the bytes a thread could not allocate (it then skips its rows).
template <typename T>
struct NormScratch {
  Allocs mem;
  const float* wf = nullptr;
  float* row = nullptr;
  NormScratch(const T* w, int64_t hidden) {
    if constexpr (IsBf16<T>::value) {
      float* buf = mem.get<float>(2 * hidden);
      if (buf == nullptr) return;
      to_float_pairs(buf, w, hidden);  // in pair order, as the rows are read
      wf = buf;
      row = buf + hidden;
    } else {
      wf = reinterpret_cast<const float*>(w);
    }
  }
  int64_t failed() const { return mem.failed(); }
};

template <typename T>
int64_t rms_norm_vec(T* out, const T* in, const T* w, int64_t rows, int64_t hidden,
                     int64_t in_stride, int64_t out_stride, float eps) {
  int64_t failed = 0;
#pragma omp parallel if (worth_threads(rows * hidden))
  {
    NormScratch<T> sc(w, hidden);
    if (sc.failed()) note_failed(failed, sc.failed());
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      if (sc.failed()) continue;
      const T* x = in + r * in_stride;
      float acc = sum_squares(x, hidden, sc.row);
      const float* xf = sc.row ? sc.row : reinterpret_cast<const float*>(x);
      scale_row(out + r * out_stride, xf, sc.wf, hidden,
                1.0f / sqrtf(acc / static_cast<float>(hidden) + eps));
    }
  }
  return failed;
}

template <typename T>
int64_t fused_add_rms_norm_vec(T* in, T* res, const T* w, int64_t rows, int64_t hidden,
                               int64_t in_stride, int64_t res_stride, float eps) {
  int64_t failed = 0;
#pragma omp parallel if (worth_threads(rows * hidden))
  {
    NormScratch<T> sc(w, hidden);
    if (sc.failed()) note_failed(failed, sc.failed());
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      if (sc.failed()) continue;
      T* x = in + r * in_stride;
      T* z = res + r * res_stride;
      // The residual is stored in T and the norm is taken of what was stored.
      VecF a0 = vset1(0.f), a1 = vset1(0.f);
      int64_t i = 0;
      for (; i + 2 * W <= hidden; i += 2 * W) {  // pair order (the row and the weight too)
        VecF x0, x1, z0, z1;
        vload_pair(x + i, x0, x1);
        vload_pair(z + i, z0, z1);
        VecF s0 = vadd(x0, z0), s1 = vadd(x1, z1);
        vstore_pair_rounded(z + i, s0, s1);
        if (sc.row) vstore_pair(sc.row + i, s0, s1);
        a0 = vfma(s0, s0, a0);
        a1 = vfma(s1, s1, a1);
      }
      for (; i + W <= hidden; i += W) {
        VecF s0 = vround(vadd(vload(x + i), vload(z + i)), z);
        vstore(z + i, s0);
        if (sc.row) vstore(sc.row + i, s0);
        a0 = vfma(s0, s0, a0);
      }
      float acc = vsum(vadd(a0, a1));
      for (; i < hidden; ++i) {
        T s = Elem<T>::store(Elem<T>::load(x[i]) + Elem<T>::load(z[i]));
        z[i] = s;
        float v = Elem<T>::load(s);
        if (sc.row) sc.row[i] = v;
        acc += v * v;
      }
      const float* zf = sc.row ? sc.row : reinterpret_cast<const float*>(z);
      scale_row(x, zf, sc.wf, hidden, 1.0f / sqrtf(acc / static_cast<float>(hidden) + eps));
    }
  }
  return failed;
}

// neox rotary of one head: v[i], v[i + half] rotated by (cos[i], sin[i]).
template <typename T, typename C>
inline void rotate_neox(T* v, const C* cos_p, const C* sin_p, int64_t half) {
  int64_t i = 0;
  for (; i + 2 * W <= half; i += 2 * W) {  // pair order (cos and sin alike)
    VecF c0, c1, s0, s1, a0, a1, b0, b1;
    vload_pair(cos_p + i, c0, c1);
    vload_pair(sin_p + i, s0, s1);
    vload_pair(v + i, a0, a1);
    vload_pair(v + i + half, b0, b1);
    vstore_pair(v + i, vfnma(b0, s0, vmul(a0, c0)), vfnma(b1, s1, vmul(a1, c1)));
    vstore_pair(v + i + half, vfma(a0, s0, vmul(b0, c0)), vfma(a1, s1, vmul(b1, c1)));
  }
  for (; i + W <= half; i += W) {
    VecF c = vload(cos_p + i), s = vload(sin_p + i);
    VecF x1 = vload(v + i), x2 = vload(v + i + half);
    vstore_split(v + i, v + i + half, vfnma(x2, s, vmul(x1, c)), vfma(x1, s, vmul(x2, c)));
  }
  for (; i < half; ++i) {
    float c = Elem<C>::load(cos_p[i]), s = Elem<C>::load(sin_p[i]);
    float x1 = Elem<T>::load(v[i]), x2 = Elem<T>::load(v[i + half]);
    v[i] = Elem<T>::store(x1 * c - x2 * s);
    v[i + half] = Elem<T>::store(x2 * c + x1 * s);
  }
}

// A bfloat16 token's cos/sin row is converted to floats once and reused by
// every head (40 heads for Llama-8B-shaped layers).
constexpr int64_t kMaxHalfOnStack = 256;

template <typename T>
void rotary_vec(const int64_t* positions, T* x, const T* cache, int64_t tokens,
                int64_t heads, int64_t token_stride, int64_t head_stride,
                int64_t rot_dim, int64_t cache_stride) {
  const int64_t half = rot_dim / 2;
#pragma omp parallel for schedule(static) if (worth_threads(tokens * heads * rot_dim))
  for (int64_t t = 0; t < tokens; ++t) {
    const T* cos_p = cache + positions[t] * cache_stride;
    const T* sin_p = cos_p + half;
    T* xt = x + t * token_stride;
    if constexpr (IsBf16<T>::value) {
      if (half <= kMaxHalfOnStack) {
        float cf[kMaxHalfOnStack], sf[kMaxHalfOnStack];
        to_float_pairs(cf, cos_p, half);  // in pair order, as rotate_neox reads them
        to_float_pairs(sf, sin_p, half);
        for (int64_t h = 0; h < heads; ++h) rotate_neox(xt + h * head_stride, cf, sf, half);
        continue;
      }
    }
    for (int64_t h = 0; h < heads; ++h) rotate_neox(xt + h * head_stride, cos_p, sin_p, half);
  }
}
#endif  // ENGINE_VEC_WIDTH

// ---- rms_norm / fused_add_rms_norm -----------------------------------------

template <typename T>
int64_t rms_norm_t(T* out, const T* in, const T* w, int64_t rows, int64_t hidden,
                int64_t in_stride, int64_t out_stride, float eps) {
#pragma omp parallel for schedule(static) if (worth_threads(rows * hidden))
  for (int64_t r = 0; r < rows; ++r) {
    const T* x = in + r * in_stride;
    T* y = out + r * out_stride;
    float acc = 0.f;
#pragma omp simd reduction(+ : acc)
    for (int64_t i = 0; i < hidden; ++i) {
      float v = Elem<T>::load(x[i]);
      acc += v * v;
    }
    const float inv = 1.0f / sqrtf(acc / static_cast<float>(hidden) + eps);
#pragma omp simd
    for (int64_t i = 0; i < hidden; ++i) {
      y[i] = Elem<T>::store(Elem<T>::load(x[i]) * inv * Elem<T>::load(w[i]));
    }
  }
  return 0;
}

template <typename T>
int64_t fused_add_rms_norm_t(T* in, T* res, const T* w, int64_t rows,
                          int64_t hidden, int64_t in_stride, int64_t res_stride,
                          float eps) {
#pragma omp parallel for schedule(static) if (worth_threads(rows * hidden))
  for (int64_t r = 0; r < rows; ++r) {
    T* x = in + r * in_stride;
    T* z = res + r * res_stride;
    float acc = 0.f;
    // The residual is stored in T and the norm is taken of what was stored,
    // so that the next layer sees exactly the residual we normalized.
#pragma omp simd reduction(+ : acc)
    for (int64_t i = 0; i < hidden; ++i) {
      T s = Elem<T>::store(Elem<T>::load(x[i]) + Elem<T>::load(z[i]));
      z[i] = s;
      float v = Elem<T>::load(s);
      acc += v * v;
    }
    const float inv = 1.0f / sqrtf(acc / static_cast<float>(hidden) + eps);
#pragma omp simd
    for (int64_t i = 0; i < hidden; ++i) {
      x[i] = Elem<T>::store(Elem<T>::load(z[i]) * inv * Elem<T>::load(w[i]));
    }
  }
  return 0;
}

// ---- silu_and_mul -----------------------------------------------------------

template <typename T>
void silu_and_mul_t(T* out, const T* in, int64_t rows, int64_t d,
                    int64_t in_stride, int64_t out_stride) {
#pragma omp parallel for schedule(static) if (worth_threads(rows * d))
  for (int64_t r = 0; r < rows; ++r) {
    const T* a = in + r * in_stride;
    const T* b = a + d;
    T* y = out + r * out_stride;
#pragma omp simd
    for (int64_t i = 0; i < d; ++i) {
      y[i] = Elem<T>::store(silu(Elem<T>::load(a[i])) * Elem<T>::load(b[i]));
    }
  }
}

// ---- rotary_embedding -------------------------------------------------------

template <typename T>
void rotary_t(const int64_t* positions, T* x, const T* cache, int64_t tokens,
              int64_t heads, int64_t token_stride, int64_t head_stride,
              int64_t rot_dim, int64_t cache_stride, bool neox) {
  const int64_t half = rot_dim / 2;
#pragma omp parallel for schedule(static) if (worth_threads(tokens * heads * rot_dim))
  for (int64_t t = 0; t < tokens; ++t) {
    const T* cos_p = cache + positions[t] * cache_stride;
    const T* sin_p = cos_p + half;
    for (int64_t h = 0; h < heads; ++h) {
      T* v = x + t * token_stride + h * head_stride;
      if (neox) {
#pragma omp simd
        for (int64_t i = 0; i < half; ++i) {
          float c = Elem<T>::load(cos_p[i]);
          float s = Elem<T>::load(sin_p[i]);
          float x1 = Elem<T>::load(v[i]);
          float x2 = Elem<T>::load(v[i + half]);
          v[i] = Elem<T>::store(x1 * c - x2 * s);
          v[i + half] = Elem<T>::store(x2 * c + x1 * s);
        }
      } else {
#pragma omp simd
        for (int64_t i = 0; i < half; ++i) {
          float c = Elem<T>::load(cos_p[i]);
          float s = Elem<T>::load(sin_p[i]);
          float x1 = Elem<T>::load(v[2 * i]);
          float x2 = Elem<T>::load(v[2 * i + 1]);
          v[2 * i] = Elem<T>::store(x1 * c - x2 * s);
          v[2 * i + 1] = Elem<T>::store(x2 * c + x1 * s);
        }
      }
    }
  }
}

// ---- reshape_and_cache ------------------------------------------------------

template <typename U>  // U: an unsigned integer of the element's size
void reshape_and_cache_t(const U* key, const U* value, U* key_cache,
                         U* value_cache, const int64_t* slots, int64_t tokens,
                         int64_t kv_heads, int64_t head_size,
                         int64_t block_size, int64_t kts, int64_t khs,
                         int64_t vts, int64_t vhs) {
#pragma omp parallel for schedule(static) if (worth_threads(tokens * kv_heads * head_size))
  for (int64_t t = 0; t < tokens; ++t) {
    const int64_t slot = slots[t];
    if (slot < 0) continue;
    const int64_t block = slot / block_size;
    const int64_t offset = slot % block_size;
    for (int64_t h = 0; h < kv_heads; ++h) {
      const int64_t dst = ((block * kv_heads + h) * block_size + offset) * head_size;
      const U* ks = key + t * kts + h * khs;
      const U* vs = value + t * vts + h * vhs;
#pragma omp simd
      for (int64_t i = 0; i < head_size; ++i) {
        key_cache[dst + i] = ks[i];
        value_cache[dst + i] = vs[i];
      }
    }
  }
}

// ---- paged_attention --------------------------------------------------------

// Work item: one (sequence, kv head) pair, covering the `group` query heads
// that share that kv head, so each key/value row is read once per group.
// Token t's row of one kv head (at head_off within a block) in a paged cache.
template <typename T>
inline const T* cache_row(const T* cache, const int32_t* table, int64_t t, int64_t block_size,
                          int64_t block_stride, int64_t head_off, int64_t head_size) {
  return cache + table[t / block_size] * block_stride + head_off + (t % block_size) * head_size;
}

#ifdef ENGINE_VEC_WIDTH
// Rows a few tokens ahead are fetched while this one is computed: a sequence's
// keys (and values) are scattered over blocks, and one row is only a few lines.
constexpr int64_t kAttnAhead = 4;
template <typename T>
inline void prefetch_row(const T* cache, const int32_t* table, int64_t t, int64_t len,
                         int64_t block_size, int64_t block_stride, int64_t head_off,
                         int64_t head_size) {
  if (t >= len) return;
  const char* row = reinterpret_cast<const char*>(
      cache_row(cache, table, t, block_size, block_stride, head_off, head_size));
  for (int64_t b = 0; b < head_size * static_cast<int64_t>(sizeof(T)); b += 64)
    _mm_prefetch(row + b, _MM_HINT_T0);
}
#endif

template <typename T>
int64_t paged_attention_t(T* out, const T* query, const T* key_cache,
                       const T* value_cache, const int32_t* block_tables,
                       const int32_t* seq_lens, int64_t seqs, int64_t heads,
                       int64_t kv_heads, int64_t head_size, int64_t block_size,
                       int64_t max_blocks, float scale) {
  const int64_t group = heads / kv_heads;
  const int64_t items = seqs * kv_heads;
  const int64_t head_stride = block_size * head_size;  // within a block
  const int64_t block_stride = kv_heads * head_stride;
#ifdef ENGINE_VEC_WIDTH
  const bool vec_heads = head_size % (2 * W) == 0;
#endif

  // Per-thread scratch, sized for the longest sequence of the batch.
  int64_t max_len = 1;
  for (int64_t s = 0; s < seqs; ++s) max_len = seq_lens[s] > max_len ? seq_lens[s] : max_len;
  const int64_t scratch = sizeof(float) * (group * max_len + 2 * group * head_size + head_size);
  int64_t failed = 0;

#pragma omp parallel
  {
    float* logits = static_cast<float*>(malloc(sizeof(float) * group * max_len));
    float* q = static_cast<float*>(malloc(sizeof(float) * group * head_size));
    float* acc = static_cast<float*>(malloc(sizeof(float) * group * head_size));
    float* row = static_cast<float*>(malloc(sizeof(float) * head_size));
    // an exception cannot leave a parallel region: note it, skip the work, report after
    const bool ok = logits && q && acc && row;
    if (!ok) {
#pragma omp atomic write
      failed = scratch;
    }

#pragma omp for schedule(dynamic, 1)
    for (int64_t item = 0; item < items; ++item) {
      if (!ok) continue;
      const int64_t s = item / kv_heads;
      const int64_t kh = item % kv_heads;
      const int64_t len = seq_lens[s];
      const int32_t* table = block_tables + s * max_blocks;
      T* out_s = out + (s * heads + kh * group) * head_size;
      if (len <= 0) {
        for (int64_t i = 0; i < group * head_size; ++i) out_s[i] = Elem<T>::store(0.f);
        continue;
      }
      const T* q_s = query + (s * heads + kh * group) * head_size;
      for (int64_t i = 0; i < group * head_size; ++i) q[i] = Elem<T>::load(q_s[i]) * scale;

      // logits[g, t] = q_g . k_t
#ifdef ENGINE_VEC_WIDTH
      if (vec_heads) {
        for (int64_t t = 0; t < len; ++t) {
          const T* k = cache_row(key_cache, table, t, block_size, block_stride,
                                    kh * head_stride, head_size);
          prefetch_row(key_cache, table, t + kAttnAhead, len, block_size, block_stride,
                       kh * head_stride, head_size);
          for (int64_t g = 0; g < group; ++g) {
            const float* qg = q + g * head_size;
            VecF a0 = vset1(0.f), a1 = vset1(0.f);
            for (int64_t i = 0; i < head_size; i += 2 * W) {
              a0 = vfma(vload(k + i), vload(qg + i), a0);
              a1 = vfma(vload(k + i + W), vload(qg + i + W), a1);
            }
            logits[g * len + t] = vsum(vadd(a0, a1));
          }
        }
      } else
#endif
      for (int64_t t = 0; t < len; ++t) {
        const T* k = cache_row(key_cache, table, t, block_size, block_stride,
                                  kh * head_stride, head_size);
#pragma omp simd
        for (int64_t i = 0; i < head_size; ++i) row[i] = Elem<T>::load(k[i]);
        for (int64_t g = 0; g < group; ++g) {
          const float* qg = q + g * head_size;
          float dot = 0.f;
#pragma omp simd reduction(+ : dot)
          for (int64_t i = 0; i < head_size; ++i) dot += qg[i] * row[i];
          logits[g * len + t] = dot;
        }
      }

      // softmax over t, per query head
      for (int64_t g = 0; g < group; ++g) {
        float* lg = logits + g * len;
        float mx = lg[0];
#pragma omp simd reduction(max : mx)
        for (int64_t t = 0; t < len; ++t) mx = lg[t] > mx ? lg[t] : mx;
        float sum = 0.f;
#pragma omp simd reduction(+ : sum)
        for (int64_t t = 0; t < len; ++t) {
          float e = fast_exp(lg[t] - mx);
          lg[t] = e;
          sum += e;
        }
        const float inv = 1.0f / sum;
#pragma omp simd
        for (int64_t t = 0; t < len; ++t) lg[t] *= inv;
      }

      // acc[g] = sum_t p[g, t] * v_t
      for (int64_t i = 0; i < group * head_size; ++i) acc[i] = 0.f;
#ifdef ENGINE_VEC_WIDTH
      if (vec_heads) {
        for (int64_t t = 0; t < len; ++t) {
          const T* v = cache_row(value_cache, table, t, block_size, block_stride,
                                    kh * head_stride, head_size);
          prefetch_row(value_cache, table, t + kAttnAhead, len, block_size, block_stride,
                       kh * head_stride, head_size);
          for (int64_t g = 0; g < group; ++g) {
            const VecF p = vset1(logits[g * len + t]);
            float* ag = acc + g * head_size;
            for (int64_t i = 0; i < head_size; i += W) vstore(ag + i, vfma(p, vload(v + i), vload(ag + i)));
          }
        }
      } else
#endif
      for (int64_t t = 0; t < len; ++t) {
        const T* v = cache_row(value_cache, table, t, block_size, block_stride,
                                  kh * head_stride, head_size);
#pragma omp simd
        for (int64_t i = 0; i < head_size; ++i) row[i] = Elem<T>::load(v[i]);
        for (int64_t g = 0; g < group; ++g) {
          const float p = logits[g * len + t];
          float* ag = acc + g * head_size;
#pragma omp simd
          for (int64_t i = 0; i < head_size; ++i) ag[i] += p * row[i];
        }
      }
      for (int64_t i = 0; i < group * head_size; ++i) out_s[i] = Elem<T>::store(acc[i]);
    }
    free(logits);
    free(q);
    free(acc);
    free(row);
  }
  return failed;
}

// ---- type dispatch (the table's entry points) -------------------------------

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

int64_t paged_attention(DType dt, void* out, const void* query, const void* kc,
                        const void* vc, const int32_t* bt, const int32_t* sl,
                        int64_t seqs, int64_t heads, int64_t kv_heads,
                        int64_t head_size, int64_t block_size, int64_t max_blocks,
                        float scale) {
  if (dt == DType::kFloat32)
    return paged_attention_t(static_cast<float*>(out), static_cast<const float*>(query),
                             static_cast<const float*>(kc), static_cast<const float*>(vc),
                             bt, sl, seqs, heads, kv_heads, head_size, block_size, max_blocks, scale);
  return paged_attention_t(static_cast<uint16_t*>(out), static_cast<const uint16_t*>(query),
                             static_cast<const uint16_t*>(kc), static_cast<const uint16_t*>(vc),
                             bt, sl, seqs, heads, kv_heads, head_size, block_size, max_blocks, scale);
}

#include "prefill_attention_impl.h"

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
#include "linear_impl.h"

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

#include "int8_linear_impl.h"
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

#include "prefill_attention_amx.h"
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

#include "moe_impl.h"
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
#else
#define ENGINE_WNA16_LINEAR_AMX nullptr
#define ENGINE_WNA16(fn) nullptr
#endif

const KernelTable table = {
    ENGINE_STR(ENGINE_ISA), rms_norm,        fused_add_rms_norm, silu_and_mul,
    rotary_embedding,       reshape_and_cache, paged_attention,  ENGINE_LINEAR,
    ENGINE_LINEAR_BF16_PAIRS, ENGINE_INT8_LINEAR, ENGINE_INT8_LINEAR_AMX,
    paged_prefill_attention, ENGINE_PREFILL_ATTENTION_AMX, ENGINE_FUSED_MOE,
    ENGINE_WNA16(linear),   ENGINE_WNA16(dequant), ENGINE_WNA16_LINEAR_AMX,
    ENGINE_WNA16(dequant_panels),
};

}  // namespace

const KernelTable* ENGINE_CAT(kernels_, ENGINE_ISA)() { return &table; }

}  // namespace engine::cpu
