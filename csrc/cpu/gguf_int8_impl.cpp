// GGUF's quantized linear layers for few rows with int8 activations (layout
// and math: gguf_int8.h), compiled once per x86 ISA as kernels_impl.cpp is.
//
// Why: at one row the float kernel (wna16_impl.cpp) spends a mask, a subtract
// and a float FMA on each weight, and the float work, not the bytes, bounds
// decode. Here x is quantized once a call to int8 per group, and 4 weights of a
// column meet 4 values of x in one integer lane: AVX512_VNNI's vpdpbusd
// (unsigned weight bytes x signed x bytes, summed into int32), elsewhere
// vpmaddubsw + vpmaddwd. A 4-bit step is one load, two masks and two dot
// products for 16 columns x 8 k; the float work is once a group.
//
// The 4-bit lane holds k = 8s .. 8s+7 as nibbles; masked with 0x0F0F0F0F it
// gives the bytes of k 8s, 8s+2, 8s+4, 8s+6, shifted by 4 first those of the
// odd k. So x is staged in that order: word 2s its even k, word 2s+1 its odd.
// Without VNNI vpmaddubsw sums pairs into int16: 4-bit q (< 16) x 127 cannot
// overflow, an 8-bit q could, so 8-bit weights run as (q - 128) with x taking
// that sign (|q - 128| <= 128) and the group term gains 128 * scale.
#include "gguf_int8.h"
#include "cpu_types.h"
#include "scalar.h"
#include "scratch.h"

#include <math.h>
#include <stdint.h>

#ifndef ENGINE_ISA
#error "ENGINE_ISA must be defined (avx2, avx512 or avx512_bf16)"
#endif

namespace engine::cpu {
namespace {

constexpr int64_t NR = kPanel;  // columns a panel

#if defined(__AVX512F__) && defined(__AVX512BW__)
using VI = __m512i;
constexpr int L = 16;      // int32 lanes a vector: one panel
constexpr int R_MAX = 8;   // rows a tile: 2 x 8 int32 and 8 float accumulators of 32 registers
inline VI iload(const uint32_t* p) { return _mm512_loadu_si512(p); }
inline VI ibcast(const int32_t* p) { return _mm512_set1_epi32(*p); }
inline VI iand(VI a, VI b) { return _mm512_and_si512(a, b); }
inline VI isrl4(VI a) { return _mm512_srli_epi32(a, 4); }
inline VI iset1(int v) { return _mm512_set1_epi32(v); }
inline VI iadd(VI a, VI b) { return _mm512_add_epi32(a, b); }
inline VI izero() { return _mm512_setzero_si512(); }
inline VecF icvt(VI v) { return _mm512_cvtepi32_ps(v); }
inline VecF hload(const uint16_t* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
#ifdef __AVX512VNNI__
constexpr bool kSigned8 = false;
inline VI dot_u(VI acc, VI w, VI a) { return _mm512_dpbusd_epi32(acc, w, a); }
inline VI dot8(VI acc, VI w, VI a) { return _mm512_dpbusd_epi32(acc, w, a); }
#else
constexpr bool kSigned8 = true;
inline VI dot_u(VI acc, VI w, VI a) {  // w < 16: a pair's sum fits int16
  return _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_maddubs_epi16(w, a), _mm512_set1_epi16(1)));
}
inline VI dot8(VI acc, VI w, VI a) {  // (w - 128) . a as |w - 128| . (a with its sign)
  const VI ws = _mm512_xor_si512(w, _mm512_set1_epi8(static_cast<char>(0x80)));
  const VI as = _mm512_mask_sub_epi8(a, _mm512_movepi8_mask(ws), _mm512_setzero_si512(), a);
  return dot_u(acc, _mm512_abs_epi8(ws), as);
}
#endif
#else  // AVX2: a panel is two vectors of 8 columns
using VI = __m256i;
constexpr int L = 8;
constexpr int R_MAX = 4;
inline VI iload(const uint32_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
inline VI ibcast(const int32_t* p) { return _mm256_set1_epi32(*p); }
inline VI iand(VI a, VI b) { return _mm256_and_si256(a, b); }
inline VI isrl4(VI a) { return _mm256_srli_epi32(a, 4); }
inline VI iset1(int v) { return _mm256_set1_epi32(v); }
inline VI iadd(VI a, VI b) { return _mm256_add_epi32(a, b); }
inline VI izero() { return _mm256_setzero_si256(); }
inline VecF icvt(VI v) { return _mm256_cvtepi32_ps(v); }
inline VecF hload(const uint16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
constexpr bool kSigned8 = true;
inline VI dot_u(VI acc, VI w, VI a) {
  return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(w, a), _mm256_set1_epi16(1)));
}
inline VI dot8(VI acc, VI w, VI a) {
  const VI ws = _mm256_xor_si256(w, _mm256_set1_epi8(static_cast<char>(0x80)));
  return dot_u(acc, _mm256_abs_epi8(ws), _mm256_sign_epi8(a, ws));
}
#endif

// x staged: per row `words` int32 of 4 int8 each (gguf_int8.h's order), and
// per group its scale d and d * sum(q).
struct Staged {
  const int32_t* q;
  const float* d;
  const float* dsum;
  int64_t words, groups;
};

// Row x[:K] quantized per group of G into q (words, zero past K), d, dsum.
template <int BITS, typename T>
void stage_row(const T* x, int64_t K, int64_t G, int64_t groups, int8_t* q, float* d,
               float* dsum) {
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t k0 = g * G, k1 = k0 + G < K ? k0 + G : K;
    float amax = 0.f;
    for (int64_t k = k0; k < k1; ++k) amax = fmaxf(amax, fabsf(Elem<T>::load(x[k])));
    const float dg = amax / 127.f, id = amax > 0.f ? 127.f / amax : 0.f;
    int sum = 0;
    for (int64_t k = k0; k < k0 + G; ++k) {
      const int v = k < k1 ? static_cast<int>(nearbyintf(Elem<T>::load(x[k]) * id)) : 0;
      sum += v;
      // 4-bit: within each 8 k, the even ones first (the masked nibbles' order)
      const int64_t at = BITS == 4 ? (k & ~int64_t{7}) + ((k & 1) << 2) + ((k & 7) >> 1) : k;
      q[at] = static_cast<int8_t>(v);
    }
    d[g] = dg;
    dsum[g] = dg * static_cast<float>(sum);
  }
}

// R rows x the L columns at w (a panel's, or half of it): sums over the
// groups into acc. GS: the group size when fixed at compile time, else 0.
template <int BITS, int R, int GS>
inline void rows_dot(VecF* acc, const uint32_t* w, const uint16_t* terms, const Staged& a,
                     int64_t G) {
  constexpr int PF = 32 / BITS;
  const int64_t gsteps = (GS ? GS : G) / PF, gwords = (GS ? GS : G) / 4;
  const VI mask = iset1(0x0F0F0F0F);
  for (int r = 0; r < R; ++r) acc[r] = vset1(0.f);
  for (int64_t g = 0; g < a.groups; ++g) {
    VI i0[R], i1[R];  // two chains a row: the dot products' latency hidden
    for (int r = 0; r < R; ++r) i0[r] = i1[r] = izero();
    const uint32_t* wg = w + g * gsteps * NR;
    const int32_t* xg = a.q + g * gwords;
    for (int64_t s = 0; s < gsteps; ++s) {
      const VI v = iload(wg + s * NR);
      if constexpr (BITS == 4) {
        const VI lo = iand(v, mask), hi = iand(isrl4(v), mask);
        for (int r = 0; r < R; ++r) {
          i0[r] = dot_u(i0[r], lo, ibcast(xg + r * a.words + 2 * s));
          i1[r] = dot_u(i1[r], hi, ibcast(xg + r * a.words + 2 * s + 1));
        }
      } else if (s & 1) {
        for (int r = 0; r < R; ++r) i1[r] = dot8(i1[r], v, ibcast(xg + r * a.words + s));
      } else {
        for (int r = 0; r < R; ++r) i0[r] = dot8(i0[r], v, ibcast(xg + r * a.words + s));
      }
    }
    const VecF sc = hload(terms + g * 2 * NR);
    VecF c = hload(terms + g * 2 * NR + NR);
    if constexpr (BITS == 8 && kSigned8) c = vfma(sc, vset1(128.f), c);
    for (int r = 0; r < R; ++r) {
      const int64_t at = r * a.groups + g;
      acc[r] = vfma(vmul(icvt(iadd(i0[r], i1[r])), vset1(a.d[at])), sc, acc[r]);
      acc[r] = vfma(vset1(a.dsum[at]), c, acc[r]);
    }
  }
}

template <typename T>
inline void store_cols(T* p, VecF v, int64_t cols) {
  if (cols >= L) {
    vstore(p, v);
    return;
  }
  alignas(64) float t[L];
  vstore(t, v);
  for (int64_t c = 0; c < cols; ++c) p[c] = Elem<T>::store(t[c]);
}

template <int BITS, int GS, typename T>
void run(T* out, const uint32_t* packed, const uint16_t* terms, const Staged& a, int64_t M,
         int64_t N, int64_t K, int64_t G, int64_t ldo) {
  constexpr int PF = 32 / BITS;
  const int64_t steps = a.groups * G / PF, panels = (N + NR - 1) / NR;
  const bool threads = M * N * K >= (int64_t{1} << 17);
#pragma omp parallel for schedule(static) if (threads)
  for (int64_t p = 0; p < panels; ++p) {
    for (int h = 0; h < NR / L; ++h) {
      const int64_t n0 = p * NR + h * L;
      if (n0 >= N) break;
      const uint32_t* w = packed + p * steps * NR + h * L;
      const uint16_t* tp = terms + p * a.groups * 2 * NR + h * L;
      for (int64_t m0 = 0; m0 < M; m0 += R_MAX) {
        const int mr = M - m0 < R_MAX ? static_cast<int>(M - m0) : R_MAX;
        const Staged rows = {a.q + m0 * a.words, a.d + m0 * a.groups, a.dsum + m0 * a.groups,
                             a.words, a.groups};
        VecF acc[R_MAX];
        switch (mr) {
#define ENGINE_ROWS(r) \
  case r: rows_dot<BITS, r, GS>(acc, w, tp, rows, G); break;
          ENGINE_ROWS(1) ENGINE_ROWS(2) ENGINE_ROWS(3) ENGINE_ROWS(4)
#if defined(__AVX512F__) && defined(__AVX512BW__)  // R_MAX 8
          ENGINE_ROWS(5) ENGINE_ROWS(6) ENGINE_ROWS(7) ENGINE_ROWS(8)
#endif
#undef ENGINE_ROWS
          default: break;
        }
        for (int r = 0; r < mr; ++r) store_cols(out + (m0 + r) * ldo + n0, acc[r], N - n0);
      }
    }
  }
}

template <typename T>
int64_t linear_t(int bits, T* out, const T* x, const uint32_t* packed, const uint16_t* terms,
                 int64_t M, int64_t N, int64_t K, int64_t G, int64_t ldx, int64_t ldo) {
  const int64_t groups = (K + G - 1) / G, words = groups * G / 4;
  Allocs mem;
  int32_t* q = mem.get<int32_t>(M * words);
  float* d = mem.get<float>(M * groups);
  float* dsum = mem.get<float>(M * groups);
  if (mem.failed()) return mem.failed();
  for (int64_t m = 0; m < M; ++m) {
    int8_t* qm = reinterpret_cast<int8_t*>(q + m * words);
    if (bits == 4)
      stage_row<4>(x + m * ldx, K, G, groups, qm, d + m * groups, dsum + m * groups);
    else
      stage_row<8>(x + m * ldx, K, G, groups, qm, d + m * groups, dsum + m * groups);
  }
  const Staged a = {q, d, dsum, words, groups};
  if (bits == 4)
    G == 32 ? run<4, 32>(out, packed, terms, a, M, N, K, G, ldo)
            : run<4, 0>(out, packed, terms, a, M, N, K, G, ldo);
  else
    G == 32 ? run<8, 32>(out, packed, terms, a, M, N, K, G, ldo)
            : run<8, 0>(out, packed, terms, a, M, N, K, G, ldo);
  return 0;
}

}  // namespace

namespace ENGINE_CAT(gguf_int8_, ENGINE_ISA) {

int64_t linear(DType dt, int bits, void* out, const void* x, const uint32_t* packed,
               const uint16_t* terms, int64_t M, int64_t N, int64_t K, int64_t group_size,
               int64_t ldx, int64_t ldo) {
  if (dt == DType::kFloat32)
    return linear_t(bits, static_cast<float*>(out), static_cast<const float*>(x), packed, terms,
                    M, N, K, group_size, ldx, ldo);
  return linear_t(bits, static_cast<uint16_t*>(out), static_cast<const uint16_t*>(x), packed,
                  terms, M, N, K, group_size, ldx, ldo);
}

}  // namespace ENGINE_CAT(gguf_int8_, ENGINE_ISA)
}  // namespace engine::cpu
