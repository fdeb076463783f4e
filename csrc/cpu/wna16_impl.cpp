// Weight-only quantized linear layers (W4A16, W8A16) for the x86 vector ISAs:
// compiled once per ISA as kernels_impl.cpp is (ENGINE_ISA, the same -m
// flags), only C headers, internal linkage but for the entry points (wna16.h),
// which sit in a namespace of their ISA and fill its KernelTable.
// Layout and math: wna16.h.
//
// Decode (few rows) is memory-bound: a thread streams its panels of packed
// weights once a call, 4 KiB prefetched ahead, and dequantises in registers:
// each 32-bit lane of a step holds PF values of one column, so one vector
// load gives 16 columns by PF k, and a shift, a mask, the zero point's
// subtraction and no conversion make 16 float weights for MR fused
// multiply-adds (wna16_tile says how). Sums run per group and are scaled once a group:
// out[m, n] = sum_g scale[n, g] * sum_{k in g} x[m, k] * (q[n, k] - zero[n, g]).
// With few accumulators each gets several sets (k mod U) so that the FMA
// latency does not bound the stream.
#include "wna16.h"
#include "amx.h"
#include "cpu_types.h"
#include "scalar.h"
#include "scratch.h"
#include "tiles.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#ifndef ENGINE_ISA
#error "ENGINE_ISA must be defined (avx2, avx512 or avx512_bf16)"
#endif

namespace engine::cpu {
namespace {

constexpr int64_t NR = kPanel;  // columns a panel

// The float side is cpu_types_x86.h's (VecF, vload, vfma, vstore_bits, ...);
// what only the dequantisation needs, on 32-bit integer lanes, is here per ISA.
#if defined(__AVX512F__) && defined(__AVX512BW__)
inline VecI iset1(int x) { return _mm512_set1_epi32(x); }
inline VecI iload(const uint32_t* p) { return _mm512_loadu_si512(p); }
inline VecI izeros(const uint8_t* z) {  // W zero points, widened
  return _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(z)));
}
// (v >> sh) & mask, minus z, as float: exact for 4- and 8-bit values
inline VecF decode(VecI v, int sh, VecI mask, VecI z) {
  return _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_and_si512(_mm512_srli_epi32(v, sh), mask), z));
}
// (v & mask) | magic as float, magic = 2^23: 2^23 + (v & mask) exactly (below 2^23)
inline VecF magic_or(VecI v, VecI mask, VecI magic) {
  return _mm512_castsi512_ps(_mm512_ternarylogic_epi32(v, mask, magic, 0xEA));
}
inline VecI isrl16(VecI v) { return _mm512_srli_epi32(v, 16); }
inline VecF icvt(VecI v) { return _mm512_cvtepi32_ps(v); }
// lo's bfloat16 bits in the low half of each lane, hi's in the high half
inline void store_pair(uint32_t* p, VecF lo, VecF hi) {
  _mm512_storeu_si512(p, _mm512_or_si512(vbf16_bits(lo), _mm512_slli_epi32(vbf16_bits(hi), 16)));
}
constexpr int MR_MAX = 16;  // rows a tile: 16 accumulators (more with k sets) of 32 registers
#else
inline VecI iset1(int x) { return _mm256_set1_epi32(x); }
inline VecI iload(const uint32_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
inline VecI izeros(const uint8_t* z) {
  return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(z)));
}
inline VecF decode(VecI v, int sh, VecI mask, VecI z) {
  return _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_and_si256(_mm256_srli_epi32(v, sh), mask), z));
}
inline VecF magic_or(VecI v, VecI mask, VecI magic) {
  return _mm256_castsi256_ps(_mm256_or_si256(_mm256_and_si256(v, mask), magic));
}
inline VecI isrl16(VecI v) { return _mm256_srli_epi32(v, 16); }
inline VecF icvt(VecI v) { return _mm256_cvtepi32_ps(v); }
inline void store_pair(uint32_t* p, VecF lo, VecF hi) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p),
                      _mm256_or_si256(vbf16_bits(lo), _mm256_slli_epi32(vbf16_bits(hi), 16)));
}
constexpr int MR_MAX = 4;  // 16 registers: 8 accumulators, the weight, zero points, mask
#endif
// W floats to bfloat16, rounded to nearest even (dequantised weights: finite)
inline void store_bf16(uint16_t* p, VecF v) { vstore_bits(p, vbf16_bits(v)); }
constexpr int CH = NR / W;  // vectors a panel row


// out[r, :16] += the panel's sums for MR rows of a ([k][MR] floats, zero past
// K, each k pre-scaled by 2^-(BITS * l), l its place in its half lane below),
// group by group.
//
// The weights are decoded without shifts or conversions: a lane's low half
// holds values l = 0 .. PF/2 - 1 at bits BITS * l; (lane & mask_l) | 2^23's
// bits is the float 2^23 + q * 2^(BITS * l) (below 2^23 + 2^20, so exact), and
// subtracting 2^23 + zero * 2^(BITS * l) leaves (q - zero) * 2^(BITS * l),
// exact; the pre-scaled x undoes the power of two, also exactly. The high half
// is the lane shifted right by 16. So the products are x * (q - zero) as a
// plain conversion would give, for a mask-or, a subtraction and an FMA.
template <int BITS, int MR>
void wna16_tile(const float* a, const uint32_t* panel, const float* scales, const uint8_t* zeros,
                int64_t groups, int64_t gsteps, float* out) {
  constexpr int PF = 32 / BITS, HALF = PF / 2;
  constexpr int U = MR * CH >= 8 ? 1 : (MR * CH >= 4 ? 2 : 4);  // k sets
  constexpr int64_t ahead = 4096 / (NR * 4);                   // steps: 4 KiB
  const VecI magic = iset1(0x4B000000);
  VecI mask[HALF];
  for (int l = 0; l < HALF; ++l) mask[l] = iset1(((1 << BITS) - 1) << (BITS * l));
  for (int64_t g = 0; g < groups; ++g) {
    VecF zf[HALF][CH];  // 2^23 + zero * 2^(BITS * l)
    for (int c = 0; c < CH; ++c) {
      const VecF z = icvt(izeros(zeros + g * NR + c * W));
      for (int l = 0; l < HALF; ++l)
        zf[l][c] = vfma(z, vset1(static_cast<float>(1 << (BITS * l))), vset1(8388608.f));
    }
    VecF acc[U][MR][CH];
    for (int u = 0; u < U; ++u)
      for (int r = 0; r < MR; ++r)
        for (int c = 0; c < CH; ++c) acc[u][r][c] = vset1(0.f);
    const uint32_t* p = panel + g * gsteps * NR;
    const float* ag = a + g * gsteps * PF * MR;
    for (int64_t s = 0; s < gsteps; ++s) {
      _mm_prefetch(reinterpret_cast<const char*>(p + (s + ahead) * NR), _MM_HINT_T0);
      VecI v[2][CH];
      for (int c = 0; c < CH; ++c) {
        v[0][c] = iload(p + s * NR + c * W);
        v[1][c] = isrl16(v[0][c]);
      }
#pragma GCC unroll 8
      for (int j = 0; j < PF; ++j) {
        const int h = j / HALF, l = j % HALF;
        VecF w[CH];
        for (int c = 0; c < CH; ++c) w[c] = vsub(magic_or(v[h][c], mask[l], magic), zf[l][c]);
#pragma GCC unroll 16
        for (int r = 0; r < MR; ++r) {
          const VecF xb = vset1(ag[(s * PF + j) * MR + r]);
          for (int c = 0; c < CH; ++c) acc[j % U][r][c] = vfma(xb, w[c], acc[j % U][r][c]);
        }
      }
    }
    for (int c = 0; c < CH; ++c) {
      const VecF sc = vload(scales + g * NR + c * W);
      for (int r = 0; r < MR; ++r) {
        VecF t = acc[0][r][c];
        for (int u = 1; u < U; ++u) t = vadd(t, acc[u][r][c]);
        float* o = out + r * NR + c * W;
        vstore(o, vfma(t, sc, vload(o)));
      }
    }
  }
}

template <int BITS>
using TileFn = void (*)(const float*, const uint32_t*, const float*, const uint8_t*, int64_t,
                        int64_t, float*);

template <int BITS>
TileFn<BITS> tile_fn(int mr) {
  switch (mr) {
#define ENGINE_WNA16_CASE(n) \
  case n:                    \
    return &wna16_tile<BITS, (n <= MR_MAX ? n : MR_MAX)>;
    ENGINE_WNA16_CASE(1) ENGINE_WNA16_CASE(2) ENGINE_WNA16_CASE(3) ENGINE_WNA16_CASE(4)
    ENGINE_WNA16_CASE(5) ENGINE_WNA16_CASE(6) ENGINE_WNA16_CASE(7) ENGINE_WNA16_CASE(8)
    ENGINE_WNA16_CASE(9) ENGINE_WNA16_CASE(10) ENGINE_WNA16_CASE(11) ENGINE_WNA16_CASE(12)
    ENGINE_WNA16_CASE(13) ENGINE_WNA16_CASE(14) ENGINE_WNA16_CASE(15)
#undef ENGINE_WNA16_CASE
    default:
      return &wna16_tile<BITS, MR_MAX>;
  }
}

#ifdef __AVX512BF16__
// bfloat16 x from PAIRS_MIN_M rows, where the float FMAs above bound the
// kernel: the decoded weights, (q - zero) * 2^(BITS * l), are exact in
// bfloat16 (9 bits of magnitude at most), so their top halves are the bfloat16
// values, and k pairs of them multiply pairs of x with one vdpbf16ps for two
// FMAs. Measured on a 2-core Zen 4, the large Llama's 4-bit gate/up (2048 x
// 10912) and down (5456 x 2048): 16 rows 3.41 -> 2.17 and 1.77 -> 1.17 ms, 4 rows
// 0.90 -> 0.83 and 0.49 -> 0.40 ms; 2 rows a little slower (the decoding, not
// the FMAs, bounds so few). a holds x as [Kp / 2][MR] pairs of bfloat16 (k, k + 1),
// pre-scaled as above.
constexpr int64_t PAIRS_MIN_M = 4;

template <int BITS, int MR>
void wna16_tile_pairs(const uint32_t* a, const uint32_t* panel, const float* scales,
                      const uint8_t* zeros, int64_t groups, int64_t gsteps, float* out) {
  constexpr int PF = 32 / BITS, HALF = PF / 2;
  constexpr int64_t ahead = 4096 / (NR * 4);
  const VecI magic = iset1(0x4B000000), top = iset1(static_cast<int>(0xFFFF0000u));
  VecI mask[HALF];
  for (int l = 0; l < HALF; ++l) mask[l] = iset1(((1 << BITS) - 1) << (BITS * l));
  for (int64_t g = 0; g < groups; ++g) {
    VecF zf[HALF];
    const VecF z = icvt(izeros(zeros + g * NR));
    for (int l = 0; l < HALF; ++l)
      zf[l] = vfma(z, vset1(static_cast<float>(1 << (BITS * l))), vset1(8388608.f));
    VecF acc[MR];
    for (int r = 0; r < MR; ++r) acc[r] = vset1(0.f);
    const uint32_t* p = panel + g * gsteps * NR;
    const uint32_t* ag = a + g * gsteps * (PF / 2) * MR;
    for (int64_t s = 0; s < gsteps; ++s) {
      _mm_prefetch(reinterpret_cast<const char*>(p + (s + ahead) * NR), _MM_HINT_T0);
      VecI v[2];
      v[0] = iload(p + s * NR);
      v[1] = isrl16(v[0]);
#pragma GCC unroll 8
      for (int j = 0; j < PF; j += 2) {
        const VecF w0 = vsub(magic_or(v[j / HALF], mask[j % HALF], magic), zf[j % HALF]);
        const VecF w1 = vsub(magic_or(v[(j + 1) / HALF], mask[(j + 1) % HALF], magic),
                           zf[(j + 1) % HALF]);
        const __m512bh wp = (__m512bh)_mm512_ternarylogic_epi32(
            _mm512_srli_epi32(_mm512_castps_si512(w0), 16), _mm512_castps_si512(w1), top, 0xF8);
        const uint32_t* xs = ag + (s * PF + j) / 2 * MR;
#pragma GCC unroll 16
        for (int r = 0; r < MR; ++r)
          acc[r] = _mm512_dpbf16_ps(acc[r], wp, (__m512bh)_mm512_set1_epi32(static_cast<int>(xs[r])));
      }
    }
    const VecF sc = vload(scales + g * NR);
    for (int r = 0; r < MR; ++r) vstore(out + r * NR, vfma(acc[r], sc, vload(out + r * NR)));
  }
}

template <int BITS>
using PairsFn = void (*)(const uint32_t*, const uint32_t*, const float*, const uint8_t*, int64_t,
                         int64_t, float*);

template <int BITS>
PairsFn<BITS> pairs_fn(int mr) {
  switch (mr) {
#define ENGINE_WNA16_CASE(n) \
  case n:                    \
    return &wna16_tile_pairs<BITS, n>;
    ENGINE_WNA16_CASE(1) ENGINE_WNA16_CASE(2) ENGINE_WNA16_CASE(3) ENGINE_WNA16_CASE(4)
    ENGINE_WNA16_CASE(5) ENGINE_WNA16_CASE(6) ENGINE_WNA16_CASE(7) ENGINE_WNA16_CASE(8)
    ENGINE_WNA16_CASE(9) ENGINE_WNA16_CASE(10) ENGINE_WNA16_CASE(11) ENGINE_WNA16_CASE(12)
    ENGINE_WNA16_CASE(13) ENGINE_WNA16_CASE(14) ENGINE_WNA16_CASE(15)
#undef ENGINE_WNA16_CASE
    default:
      return &wna16_tile_pairs<BITS, MR_MAX>;
  }
}

// x for wna16_tile_pairs: bfloat16 (k, k + 1) pairs, each pre-scaled.
template <int BITS>
struct PairA {
  using A = uint32_t;
  static constexpr int KP = 2;  // k an element
  static A stage(const uint16_t* xr, int64_t h, int64_t K, const float* pre) {
    uint32_t pair = 0;
    for (int e = 0; e < 2; ++e) {  // x * 2^-n: exact, so its top half is bfloat16
      const int64_t k = 2 * h + e;
      const float v = k < K ? bf16_to_float(xr[k]) * pre[k % (32 / BITS)] : 0.f;
      uint32_t bits;
      memcpy(&bits, &v, 4);
      pair |= (bits >> 16) << (16 * e);
    }
    return pair;
  }
  static PairsFn<BITS> tile(int mr) { return pairs_fn<BITS>(mr); }
};
#endif

// x for wna16_tile: floats, pre-scaled.
template <int BITS, typename T>
struct FloatA {
  using A = float;
  static constexpr int KP = 1;
  static A stage(const T* xr, int64_t k, int64_t K, const float* pre) {
    return k < K ? Elem<T>::load(xr[k]) * pre[k % (32 / BITS)] : 0.f;
  }
  static TileFn<BITS> tile(int mr) { return tile_fn<BITS>(mr); }
};

// S: how x is staged for the tile kernel (FloatA, or PairA's k pairs).
template <int BITS, typename T, typename S>
int64_t linear_t(T* out, const T* x, const uint32_t* packed, const float* scales,
                 const uint8_t* zeros, int64_t M, int64_t N, int64_t K, int64_t G, int64_t ldx,
              int64_t ldo) {
  using A = typename S::A;
  constexpr int PF = 32 / BITS;
  const int64_t groups = (K + G - 1) / G, gsteps = G / PF, steps = groups * gsteps;
  const int64_t Ks = steps * PF / S::KP;  // elements of a row: k padded to whole groups
  const int64_t panels = (N + NR - 1) / NR, tiles = (M + MR_MAX - 1) / MR_MAX;
  // x k-major per tile of MR_MAX rows ([Ks][mr]), zero past K, pre-scaled as the
  // tile kernels read it
  float pre[PF];
  for (int j = 0; j < PF; ++j) pre[j] = 1.f / static_cast<float>(1 << (BITS * (j % (PF / 2))));
  Allocs mem;
  A* a = mem.get<A>(M * Ks);
  if (mem.failed()) return mem.failed();
  const bool threads = M * N * K >= (int64_t{1} << 18);
#pragma omp parallel if (threads)
  {
    pack_rows<MR_MAX>(a, M, Ks,
                      [&](int64_t m, int64_t h) { return S::stage(x + m * ldx, h, K, pre); });
    alignas(64) float tile[MR_MAX * NR];
#pragma omp for schedule(static)
    for (int64_t p = 0; p < panels; ++p) {
      const int64_t n0 = p * NR, cols = N - n0 < NR ? N - n0 : NR;
      for (int64_t t = 0; t < tiles; ++t) {
        const int64_t m0 = t * MR_MAX;
        const int mr = tile_rows(M, m0, MR_MAX);
        memset(tile, 0, sizeof(tile));
        S::tile(mr)(a + m0 * Ks, packed + p * steps * NR, scales + p * groups * NR,
                    zeros + p * groups * NR, groups, gsteps, tile);
        store_tile(out + m0 * ldo, ldo, tile, NR, mr, n0, cols);
      }
    }
  }
  return 0;
}

inline void store_row(float* p, VecF v, int64_t cols) {
  if (cols == W) {
    vstore(p, v);
    return;
  }
  alignas(64) float t[W];
  vstore(t, v);
  for (int64_t c = 0; c < cols; ++c) p[c] = t[c];
}
inline void store_row(uint16_t* p, VecF v, int64_t cols) {
  if (cols == W) {
    store_bf16(p, v);
    return;
  }
  alignas(64) float t[W];
  vstore(t, v);
  for (int64_t c = 0; c < cols; ++c) p[c] = float_to_bf16(t[c]);
}

template <int BITS, typename T>
void dequant_t(T* wt, const uint32_t* packed, const float* scales, const uint8_t* zeros,
               int64_t N, int64_t K, int64_t G) {
  constexpr int PF = 32 / BITS;
  const int64_t groups = (K + G - 1) / G, gsteps = G / PF, steps = groups * gsteps;
  const int64_t panels = (N + NR - 1) / NR;
  const int64_t ksteps = (K + PF - 1) / PF;  // steps holding some k < K
  const VecI mask = iset1((1 << BITS) - 1);
#pragma omp parallel for collapse(2) schedule(static) if (N * K >= (int64_t{1} << 16))
  for (int64_t p = 0; p < panels; ++p)
    for (int64_t s = 0; s < ksteps; ++s) {
      const int64_t g = s / gsteps, n0 = p * NR;
      for (int c = 0; c < CH; ++c) {
        const int64_t c0 = n0 + c * W;
        if (c0 >= N) break;
        const int64_t cols = N - c0 < W ? N - c0 : W;
        const VecI v = iload(packed + (p * steps + s) * NR + c * W);
        const VecI z = izeros(zeros + (p * groups + g) * NR + c * W);
        const VecF sc = vload(scales + (p * groups + g) * NR + c * W);
        for (int j = 0; j < PF && s * PF + j < K; ++j)
          store_row(wt + (s * PF + j) * N + c0, vmul(decode(v, j * BITS, mask, z), sc), cols);
      }
    }
}

// The weight in the panel kernel's layout (engine.model_executor.layers.linear.
// pack_panels): k_pack 1, [panels, K, 16] of T; k_pack 2 (bfloat16), [panels,
// ceil(K/2), 16] of k pairs. Columns past N are zero (so are their scales).
template <int BITS, typename T>
void dequant_panels_t(T* wp, int k_pack, const uint32_t* packed, const float* scales,
                      const uint8_t* zeros, int64_t N, int64_t K, int64_t G) {
  constexpr int PF = 32 / BITS;
  const int64_t groups = (K + G - 1) / G, gsteps = G / PF, steps = groups * gsteps;
  const int64_t panels = (N + NR - 1) / NR, rows = (K + k_pack - 1) / k_pack;
  const int64_t ksteps = (K + PF - 1) / PF;
  const VecI mask = iset1((1 << BITS) - 1);
#pragma omp parallel for collapse(2) schedule(static) if (N * K >= (int64_t{1} << 16))
  for (int64_t p = 0; p < panels; ++p)
    for (int64_t s = 0; s < ksteps; ++s) {
      const int64_t g = s / gsteps, k0 = s * PF;
      for (int c = 0; c < CH; ++c) {
        const VecI v = iload(packed + (p * steps + s) * NR + c * W);
        const VecI z = izeros(zeros + (p * groups + g) * NR + c * W);
        const VecF sc = vload(scales + (p * groups + g) * NR + c * W);
        if (k_pack == 2) {  // PF is even, so k0 + j is: whole pairs but at K's end
          uint32_t* dst = reinterpret_cast<uint32_t*>(wp) + (p * rows + k0 / 2) * NR + c * W;
          for (int j = 0; j < PF && k0 + j < K; j += 2, dst += NR)
            store_pair(dst, vmul(decode(v, j * BITS, mask, z), sc),
                       k0 + j + 1 < K ? vmul(decode(v, (j + 1) * BITS, mask, z), sc) : vset1(0.f));
        } else {
          for (int j = 0; j < PF && k0 + j < K; ++j)
            store_row(wp + (p * K + k0 + j) * NR + c * W,
                      vmul(decode(v, j * BITS, mask, z), sc), W);
        }
      }
    }
}

#if defined(__AVX512BF16__) && defined(ENGINE_HAS_AMX)
// bfloat16 rows with AMX tiles (tdpbf16ps), for many rows: each group of 4 panels
// is dequantised once a call into tiles' paired layout (16 rows of k pairs x
// 16 columns, rounded to bfloat16 as the large-M panel is), kept in L2, and
// every 16-row tile of x multiplies it. Group sizes a multiple of 32 (a tile's
// 32 k then share one scale); false (nothing written) otherwise.
template <int BITS>
__attribute__((target("amx-tile,amx-bf16"))) bool linear_amx_t(
    uint16_t* out, const uint16_t* x, const uint32_t* packed, const float* scales,
    const uint8_t* zeros, int64_t M, int64_t N, int64_t K, int64_t G, int64_t ldx, int64_t ldo) {
  if (G % 32 != 0 || !amx_permitted()) return false;
  constexpr int PF = 32 / BITS;       // k a packed step
  constexpr int SPT = 32 / PF;        // steps a 32-k tile
  constexpr int NP = 4;               // panels a group: x is read once per 64 columns
  const int64_t groups = (K + G - 1) / G, steps = groups * (G / PF);
  const int64_t chunks = (K + 31) / 32, kp = chunks * 32;
  const int64_t panels = (N + NR - 1) / NR, pgroups = (panels + NP - 1) / NP;
  const int64_t tiles = (M + 15) / 16;
  uint16_t* xa = static_cast<uint16_t*>(scratch(0, sizeof(uint16_t) * M * kp));
  if (xa == nullptr) return false;  // the caller runs the vector kernel, which reports it
#pragma omp parallel for schedule(static) if (M * K >= (int64_t{1} << 16))
  for (int64_t m = 0; m < M; ++m) {  // x with its rows zero-padded to whole tiles
    memcpy(xa + m * kp, x + m * ldx, sizeof(uint16_t) * K);
    memset(xa + m * kp + K, 0, sizeof(uint16_t) * (kp - K));
  }
  const VecI mask = iset1((1 << BITS) - 1);
  int64_t failed = 0;
#pragma omp parallel
  {
    uint16_t* wb = static_cast<uint16_t*>(scratch(1, sizeof(uint16_t) * NP * chunks * 512));
    if (wb == nullptr) note_failed(failed, 1);
    alignas(64) float c[16 * NP * NR];
    int configured = 0;
#pragma omp for schedule(static)
    for (int64_t pg = 0; pg < pgroups; ++pg) {
      if (wb == nullptr) continue;
      const int np = static_cast<int>(panels - NP * pg < NP ? panels - NP * pg : NP);
      for (int q = 0; q < np; ++q) {  // dequantise: rows of k pairs, a lane a column
        const int64_t p = NP * pg + q;
        for (int64_t ch = 0; ch < chunks; ++ch) {
          const int64_t g = ch * 32 / G;
          const VecI z = izeros(zeros + (p * groups + g) * NR);
          const VecF sc = vload(scales + (p * groups + g) * NR);
          uint32_t* rows = reinterpret_cast<uint32_t*>(wb + (q * chunks + ch) * 512);
          for (int st = 0; st < SPT; ++st) {
            const VecI v = iload(packed + (p * steps + ch * SPT + st) * NR);
            for (int j = 0; j < PF; j += 2) {
              const VecF w0 = vmul(decode(v, j * BITS, mask, z), sc);
              const VecF w1 = vmul(decode(v, (j + 1) * BITS, mask, z), sc);
              const VecI lo = _mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(w0));
              const VecI hi = _mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(w1));
              _mm512_store_si512(rows + ((st * PF + j) / 2) * NR,
                                 _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16)));
            }
          }
        }
      }
      const int64_t n0 = NP * pg * NR, cols = N - n0 < np * NR ? N - n0 : np * NR;
      for (int64_t t = 0; t < tiles; ++t) {
        const int64_t m0 = 16 * t;
        const int mr = tile_rows(M, m0, 16);
        if (mr != configured) {  // 0-3 sums (mr x 16 fp32), 4 x (mr x 32), 5, 6 weights
          AmxConfig cfg{};
          cfg.palette = 1;
          for (int i = 0; i < 5; ++i) cfg.rows[i] = static_cast<uint8_t>(mr), cfg.colsb[i] = 64;
          for (int i = 5; i < 7; ++i) cfg.rows[i] = 16, cfg.colsb[i] = 64;
          _tile_loadconfig(&cfg);
          configured = mr;
        }
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
        for (int64_t ch = 0; ch < chunks; ++ch) {
          _tile_loadd(4, xa + m0 * kp + ch * 32, kp * 2);
          _tile_loadd(5, wb + ch * 512, 64);
          _tile_dpbf16ps(0, 4, 5);
          if (np > 1) {
            _tile_loadd(6, wb + (chunks + ch) * 512, 64);
            _tile_dpbf16ps(1, 4, 6);
          }
          if (np > 2) {
            _tile_loadd(5, wb + (2 * chunks + ch) * 512, 64);
            _tile_dpbf16ps(2, 4, 5);
          }
          if (np > 3) {
            _tile_loadd(6, wb + (3 * chunks + ch) * 512, 64);
            _tile_dpbf16ps(3, 4, 6);
          }
        }
        _tile_stored(0, c, NP * NR * 4);
        _tile_stored(1, c + NR, NP * NR * 4);
        _tile_stored(2, c + 2 * NR, NP * NR * 4);
        _tile_stored(3, c + 3 * NR, NP * NR * 4);
        for (int r = 0; r < mr; ++r) {
          uint16_t* o = out + (m0 + r) * ldo + n0;
          const float* cr = c + r * NP * NR;
          int64_t j = 0;
          for (; j + NR <= cols; j += NR) store_bf16(o + j, vload(cr + j));
          for (; j < cols; ++j) o[j] = float_to_bf16(cr[j]);
        }
      }
    }
    if (configured) _tile_release();
  }
  // a thread without scratch skipped its panels: the vector kernel writes them all again
  return failed == 0;
}

#endif  // AMX-BF16

}  // namespace

// The entry points (wna16.h), one set a compiled ISA.
namespace ENGINE_CAT(wna16_, ENGINE_ISA) {

void dequant_panels(DType dt, int bits, int k_pack, void* wp, const uint32_t* packed,
                    const float* scales, const uint8_t* zeros, int64_t N, int64_t K, int64_t G) {
  if (dt == DType::kFloat32) {
    auto* w = static_cast<float*>(wp);
    if (bits == 4) dequant_panels_t<4>(w, 1, packed, scales, zeros, N, K, G);
    else dequant_panels_t<8>(w, 1, packed, scales, zeros, N, K, G);
  } else {
    auto* w = static_cast<uint16_t*>(wp);
    if (bits == 4) dequant_panels_t<4>(w, k_pack, packed, scales, zeros, N, K, G);
    else dequant_panels_t<8>(w, k_pack, packed, scales, zeros, N, K, G);
  }
}

int64_t linear(DType dt, int bits, void* out, const void* x, const uint32_t* packed,
               const float* scales, const uint8_t* zeros, int64_t M, int64_t N, int64_t K,
               int64_t G, int64_t ldx, int64_t ldo) {
  if (dt == DType::kFloat32) {
    auto* o = static_cast<float*>(out);
    auto* xi = static_cast<const float*>(x);
    if (bits == 4) return linear_t<4, float, FloatA<4, float>>(
        o, xi, packed, scales, zeros, M, N, K, G, ldx, ldo);
    return linear_t<8, float, FloatA<8, float>>(
        o, xi, packed, scales, zeros, M, N, K, G, ldx, ldo);
  } else {
    auto* o = static_cast<uint16_t*>(out);
    auto* xi = static_cast<const uint16_t*>(x);
#ifdef __AVX512BF16__
    if (M >= PAIRS_MIN_M) {
      if (bits == 4) return linear_t<4, uint16_t, PairA<4>>(
          o, xi, packed, scales, zeros, M, N, K, G, ldx, ldo);
      return linear_t<8, uint16_t, PairA<8>>(
          o, xi, packed, scales, zeros, M, N, K, G, ldx, ldo);
    }
#endif
    if (bits == 4) return linear_t<4, uint16_t, FloatA<4, uint16_t>>(
        o, xi, packed, scales, zeros, M, N, K, G, ldx, ldo);
    return linear_t<8, uint16_t, FloatA<8, uint16_t>>(
        o, xi, packed, scales, zeros, M, N, K, G, ldx, ldo);
  }
}

void dequant(DType dt, int bits, void* wt, const uint32_t* packed, const float* scales,
             const uint8_t* zeros, int64_t N, int64_t K, int64_t G) {
  if (dt == DType::kFloat32) {
    auto* w = static_cast<float*>(wt);
    if (bits == 4) dequant_t<4>(w, packed, scales, zeros, N, K, G);
    else dequant_t<8>(w, packed, scales, zeros, N, K, G);
  } else {
    auto* w = static_cast<uint16_t*>(wt);
    if (bits == 4) dequant_t<4>(w, packed, scales, zeros, N, K, G);
    else dequant_t<8>(w, packed, scales, zeros, N, K, G);
  }
}

#if defined(__AVX512BF16__) && defined(ENGINE_HAS_AMX)
bool linear_amx(DType dt, int bits, void* out, const void* x, const uint32_t* packed,
                const float* scales, const uint8_t* zeros, int64_t M, int64_t N, int64_t K,
                int64_t G, int64_t ldx, int64_t ldo) {
  if (dt != DType::kBFloat16) return false;
  auto* o = static_cast<uint16_t*>(out);
  auto* xi = static_cast<const uint16_t*>(x);
  return bits == 4 ? linear_amx_t<4>(o, xi, packed, scales, zeros, M, N, K, G, ldx, ldo)
                   : linear_amx_t<8>(o, xi, packed, scales, zeros, M, N, K, G, ldx, ldo);
}
#endif

}  // namespace ENGINE_CAT(wna16_, ENGINE_ISA)
}  // namespace engine::cpu
