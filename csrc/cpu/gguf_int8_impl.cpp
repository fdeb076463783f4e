// GGUF's quantized linear layers for few rows with int8 activations (layout
// and math: gguf_int8.h), compiled once per x86 ISA as kernels_impl.cpp is, and
// once per AArch64 ISA as arm/kernels_neon.cpp is.
//
// Why: at one row the float kernel (wna16_impl.cpp) spends a mask, a subtract
// and a float FMA on each weight, and the float work, not the bytes, bounds
// decode. Here x is quantized once a call to int8 per group, and 4 weights of a
// column meet 4 values of x in one integer lane: AVX512_VNNI's vpdpbusd
// (unsigned weight bytes x signed x bytes, summed into int32), elsewhere
// vpmaddubsw + vpmaddwd (gguf_int8_isa.h). A 4-bit step is one load, two masks
// and two dot products for 16 columns x 8 k; the float work is once a group.
// 5- and 6-bit values stream as many bits as the file's: their nibbles as a
// 4-bit step, then the high bits (one lane a chunk of 32 / H k, shifted by 2H a
// step) OR-ed in above each nibble, a shift and a masked OR per vector.
//
// The 4-bit lane holds k = 8s .. 8s+7 as nibbles; masked with 0x0F0F0F0F it
// gives the bytes of k 8s, 8s+2, 8s+4, 8s+6, shifted by 4 first those of the
// odd k. So x is staged in that order: word 2s its even k, word 2s+1 its odd.
// Without VNNI vpmaddubsw sums pairs into int16: a q below 64 x 127 cannot
// overflow, an 8-bit q could, so 8-bit weights run as (q - 128) with x taking
// that sign (|q - 128| <= 128) and the group's zero or term allows for it.
#if defined(__aarch64__) && !defined(ENGINE_NEON_KERNELS)
#define ENGINE_NEON_KERNELS 1  // cpu_types.h: NEON's vector types
#endif
#include "gguf_int8.h"
#include "cpu_types.h"
#include "gguf_int8_isa.h"
#include "scalar.h"
#include "scratch.h"

#include <math.h>
#include <stdint.h>

namespace engine::cpu {
namespace {

constexpr int64_t NR = kPanel;  // columns a panel
constexpr int64_t kAhead = 4096 / (NR * 4);  // steps the weight is fetched ahead

// x staged: per row `words` int32 of 4 int8 each (gguf_int8.h's order), and
// per group its scale d and dsum = d * sum(q) * f: f = -zero where the layer has
// one zero point and no term (the group's float work is then one FMA for
// d * (x . q) - zero * d * sum(q) and one for the scale), else 1.
struct Staged {
  const int32_t* q;
  const float* d;
  const float* dsum;
  int64_t words, groups;
};

// k a staging step: NIB orders within 8 k, two of NEON's 4-lane vectors
constexpr int64_t SL = L < 8 ? 2 * L : L;

// A whole group x[:G] (G a multiple of SL) quantized into q, its d and dsum.
template <bool NIB, typename T>
inline void stage_group_vec(const T* x, int64_t G, float f, int8_t* q, float* d, float* dsum) {
  VecF mx = vset1(0.f);
  for (int64_t k = 0; k < G; k += L) mx = vabsmax(mx, vload(x + k));
  const float amax = vhmax(mx), id = amax > 0.f ? 127.f / amax : 0.f;
  VecI sum = izero();
  for (int64_t k = 0; k < G; k += SL) {
    const VecI v = iround(vmul(vload(x + k), vset1(id)));
    if constexpr (SL == L) {
      sum = iadd(sum, v);
      store_i8<NIB>(q + k, v);
    } else {
      const VecI v1 = iround(vmul(vload(x + k + L), vset1(id)));
      sum = iadd(sum, iadd(v, v1));
      store_i8x2<NIB>(q + k, v, v1);
    }
  }
  *d = amax / 127.f;
  *dsum = *d * static_cast<float>(ihsum(sum)) * f;
}

// GCC 12's AArch64 vectorizer stops with an internal error (vect_transform_reduction)
// on the scalar group's reductions below; they run once a partial group only.
#if defined(__aarch64__) && defined(__GNUC__) && !defined(__clang__)
#define ENGINE_SCALAR_LOOPS __attribute__((optimize("no-tree-vectorize")))
#else
#define ENGINE_SCALAR_LOOPS
#endif

// Row x[:K] quantized per group of G into q (words, zero past K), d, dsum (f:
// Staged's). NIB: within each 8 k the even ones first (the masked nibbles' order).
template <bool NIB, typename T>
ENGINE_SCALAR_LOOPS void stage_row(const T* x, int64_t K, int64_t G, int64_t groups, float f,
                                   int8_t* q, float* d, float* dsum) {
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t k0 = g * G, k1 = k0 + G < K ? k0 + G : K;
    if (G % SL == 0 && k1 - k0 == G) {
      stage_group_vec<NIB>(x + k0, G, f, q + k0, d + g, dsum + g);
      continue;
    }
    float amax = 0.f;
    for (int64_t k = k0; k < k1; ++k) amax = fmaxf(amax, fabsf(Elem<T>::load(x[k])));
    const float dg = amax / 127.f, id = amax > 0.f ? 127.f / amax : 0.f;
    int sum = 0;
    for (int64_t k = k0; k < k0 + G; ++k) {
      const int v = k < k1 ? static_cast<int>(nearbyintf(Elem<T>::load(x[k]) * id)) : 0;
      sum += v;
      const int64_t at = NIB ? (k & ~int64_t{7}) + ((k & 1) << 2) + ((k & 7) >> 1) : k;
      q[at] = static_cast<int8_t>(v);
    }
    d[g] = dg;
    dsum[g] = dg * static_cast<float>(sum) * f;
  }
}

// R rows x the L columns at w (a panel's, or half of it; hw: its high bits):
// sums over the groups into acc. BITS: a value's (4, 5, 6, 8); NT: terms a
// group (gguf_int8.h); GS: the group size when fixed at compile time, else 0.
template <int BITS, int NT, int R, int GS>
inline void rows_dot(VecF* acc, const uint32_t* w, const uint32_t* hw, const uint16_t* terms,
                     const Staged& a, int64_t G) {
  constexpr int B = BITS == 8 ? 8 : 4, PF = 32 / B;
  constexpr int H = BITS == 8 ? 0 : BITS - 4, SPC = H ? 4 / H : 1;  // high bits; steps a chunk
  const int64_t gsteps = (GS ? GS : G) / PF, gwords = (GS ? GS : G) / 4;
  const VecI mask = iset1(0x0F0F0F0F), hmask = iset1(((1 << H) - 1) * 0x10101010);
  for (int r = 0; r < R; ++r) acc[r] = vset1(0.f);
  for (int64_t g = 0; g < a.groups; ++g) {
    // two chains a row below 4 rows, to hide the dot products' latency; from 4
    // the rows' chains hide it, and the registers a second set took spilled
    constexpr bool TWO = R < 4;
    VecI i0[R], i1[TWO ? R : 1];
    for (int r = 0; r < R; ++r) i0[r] = izero();
    if constexpr (TWO)
      for (int r = 0; r < R; ++r) i1[r] = izero();
    const uint32_t* wg = w + g * gsteps * NR;
    const uint32_t* hg = H ? hw + g * (gsteps / SPC) * NR : nullptr;
    const int32_t* xg = a.q + g * gwords;
    VecI h = izero();
    for (int64_t s = 0; s < gsteps; ++s) {
      // 4 KiB ahead, as the other decode kernels: without it a quarter of the
      // kernel's time (16 rows, SmolLM's shape) waited on this load. 8-bit
      // weights into L2 only (16 rows, SmolLM's shape, cold weights: 8.6 ->
      // 7.6 ms a step's GEMMs; 4- and 5-bit were 2-3% slower so). Measured, not
      // explained: likely twice a 4-bit step's bytes fetched into L1 push out
      // the panel and x rows the second row tile reads again.
      wprefetch<B == 8>(wg + (s + kAhead) * NR);
      if (H > 0 && s % SPC == 0) wprefetch<false>(hg + (s / SPC + kAhead / SPC) * NR);
      const VecI v = iload(wg + s * NR);
      if constexpr (B == 4) {
        VecI lo = iand(v, mask), hi = iand(isrl<4>(v), mask);
        if constexpr (H > 0) {  // this step's bits at the lane's bottom of each byte
          h = s % SPC == 0 ? iload(hg + (s / SPC) * NR) : isrl<2 * H>(h);
          lo = ior_and(lo, isll<4>(h), hmask);
          hi = ior_and(hi, isll<4 - H>(h), hmask);
        }
        for (int r = 0; r < R; ++r) {
          i0[r] = dot_b(i0[r], lo, xg + r * a.words + 2 * s);
          VecI& odd = TWO ? i1[TWO ? r : 0] : i0[r];
          odd = dot_b(odd, hi, xg + r * a.words + 2 * s + 1);
        }
      } else if (TWO && (s & 1)) {
        for (int r = 0; r < R; ++r) {
          VecI& odd = i1[TWO ? r : 0];
          odd = dot8_b(odd, v, xg + r * a.words + s);
        }
      } else {
        for (int r = 0; r < R; ++r) i0[r] = dot8_b(i0[r], v, xg + r * a.words + s);
      }
    }
    const VecF sc = hload(terms + g * NT * NR);
    if constexpr (NT == 1) {  // scale * (d * (x . q) - zero * d * sum(x)): no term to read
      for (int r = 0; r < R; ++r) {
        const int64_t at = r * a.groups + g;
        const VecI dot = TWO ? iadd(i0[r], i1[TWO ? r : 0]) : i0[r];
        const VecF f = vfma(icvt(dot), vset1(a.d[at]), vset1(a.dsum[at]));
        acc[r] = vfma(f, sc, acc[r]);
      }
    } else {
      VecF c = hload(terms + g * NT * NR + NR);
      if constexpr (B == 8 && kSigned8) c = vfma(sc, vset1(128.f), c);
      for (int r = 0; r < R; ++r) {
        const int64_t at = r * a.groups + g;
        const VecI dot = TWO ? iadd(i0[r], i1[TWO ? r : 0]) : i0[r];
        acc[r] = vfma(vmul(icvt(dot), vset1(a.d[at])), sc, acc[r]);
        acc[r] = vfma(vset1(a.dsum[at]), c, acc[r]);
      }
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

template <int BITS, int NT, int GS, typename T>
void run(T* out, const GgufInt8Weight& wt, const Staged& a, int64_t M, int64_t ldo) {
  constexpr int PF = BITS == 8 ? 4 : 8, H = BITS == 8 ? 0 : BITS - 4;
  const int64_t N = wt.N, G = wt.group_size;
  const int64_t steps = a.groups * G / PF, chunks = H ? a.groups * G * H / 32 : 0;
  const int64_t panels = (N + NR - 1) / NR;
#pragma omp for schedule(static)  // in linear_t's parallel region, if any
  for (int64_t p = 0; p < panels; ++p) {
    for (int h = 0; h < NR / L; ++h) {
      const int64_t n0 = p * NR + h * L;
      if (n0 >= N) break;
      const uint32_t* w = wt.packed + p * steps * NR + h * L;
      const uint32_t* hw = H ? wt.high + p * chunks * NR + h * L : nullptr;
      const uint16_t* tp = wt.terms + p * a.groups * NT * NR + h * L;
      for (int64_t m0 = 0; m0 < M; m0 += R_MAX) {
        const int mr = M - m0 < R_MAX ? static_cast<int>(M - m0) : R_MAX;
        const Staged rows = {a.q + m0 * a.words, a.d + m0 * a.groups, a.dsum + m0 * a.groups,
                             a.words, a.groups};
        VecF acc[R_MAX];
        switch (mr) {
#define ENGINE_ROWS(r) \
  case r: rows_dot<BITS, NT, r, GS>(acc, w, hw, tp, rows, G); break;
          ENGINE_ROWS(1) ENGINE_ROWS(2) ENGINE_ROWS(3) ENGINE_ROWS(4)
#if (defined(__AVX512F__) && defined(__AVX512BW__)) || defined(__aarch64__)  // R_MAX 8
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

// The group sizes GGUF's blocks give (Q6_K's 16 where it is among a layer's
// parts, else 32) fixed at compile time; others run with G a variable.
template <int BITS, int NT, typename T>
void run_g(T* out, const GgufInt8Weight& wt, const Staged& a, int64_t M, int64_t ldo) {
  constexpr int FIXED = BITS == 6 ? 16 : 32;
  if (wt.group_size == FIXED)
    run<BITS, NT, FIXED>(out, wt, a, M, ldo);
  else
    run<BITS, NT, 0>(out, wt, a, M, ldo);
}

template <int BITS, typename T>
void run_t(T* out, const GgufInt8Weight& wt, const Staged& a, int64_t M, int64_t ldo) {
  if (wt.n_terms == 1)
    run_g<BITS, 1>(out, wt, a, M, ldo);
  else
    run_g<BITS, 2>(out, wt, a, M, ldo);
}

template <typename T>
int64_t linear_t(const GgufInt8Weight& wt, T* out, const T* x, int64_t M, int64_t ldx,
                 int64_t ldo) {
  const int64_t K = wt.K, G = wt.group_size;
  const int64_t groups = (K + G - 1) / G, words = groups * G / 4;
  Allocs mem;
  int32_t* q = mem.get<int32_t>(M * words);
  float* d = mem.get<float>(M * groups);
  float* dsum = mem.get<float>(M * groups);
  if (mem.failed()) return mem.failed();
  // the zero point, less 128 where 8-bit q run signed, folded into dsum
  const int zero = wt.zero - (wt.bits == 8 && kSigned8 ? 128 : 0);
  const float f = wt.n_terms == 1 ? -static_cast<float>(zero) : 1.f;
  const Staged a = {q, d, dsum, words, groups};
  // x's rows staged by the threads that then share the panels, in one region:
  // staged on one thread while the other waited (perf: 9% of the main thread's
  // samples in 16 concurrent requests, SmolLM's shape, Zen 4); shared, the
  // cell ran 3% faster (870 -> 842 ms, in turns in one process)
  const bool threads = M * wt.N * K >= (int64_t{1} << 17);
#pragma omp parallel if (threads)
  {
#pragma omp for schedule(static)
    for (int64_t m = 0; m < M; ++m) {
      int8_t* qm = reinterpret_cast<int8_t*>(q + m * words);
      if (wt.bits == 8)
        stage_row<false>(x + m * ldx, K, G, groups, f, qm, d + m * groups, dsum + m * groups);
      else
        stage_row<true>(x + m * ldx, K, G, groups, f, qm, d + m * groups, dsum + m * groups);
    }
    switch (wt.bits) {
      case 4: run_t<4>(out, wt, a, M, ldo); break;
      case 5: run_t<5>(out, wt, a, M, ldo); break;
      case 6: run_t<6>(out, wt, a, M, ldo); break;
      default: run_t<8>(out, wt, a, M, ldo); break;
    }
  }
  return 0;
}

}  // namespace

namespace ENGINE_CAT(gguf_int8_, ENGINE_ISA) {

int64_t linear(DType dt, const GgufInt8Weight& w, void* out, const void* x, int64_t M,
               int64_t ldx, int64_t ldo) {
  if (dt == DType::kFloat32)
    return linear_t(w, static_cast<float*>(out), static_cast<const float*>(x), M, ldx, ldo);
  return linear_t(w, static_cast<uint16_t*>(out), static_cast<const uint16_t*>(x), M, ldx, ldo);
}

}  // namespace ENGINE_CAT(gguf_int8_, ENGINE_ISA)
}  // namespace engine::cpu
