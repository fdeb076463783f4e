// The wna16 decode kernels (few rows, wna16.h's linear): panel tiles that
// dequantise in registers, float x or (AVX512_BF16) bfloat16 k pairs, and the
// loop around them. How: wna16_impl.cpp's head comment.
#pragma once

#include <stdint.h>
#include <string.h>

#include "scalar.h"
#include "scratch.h"
#include "tiles.h"
#include "wna16_vec.h"

namespace engine::cpu {
namespace {

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

// A tile kernel for some rows: x staged as A (floats, or bfloat16 pairs), the
// panel, its scales and zeros, groups, steps a group, the float tile.
template <typename A>
using TileFn = void (*)(const A*, const uint32_t*, const float*, const uint8_t*, int64_t,
                        int64_t, float*);

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
  static TileFn<A> tile(int mr) {
    return tile_for_rows<MR_MAX>(mr, []<int R>() { return &wna16_tile_pairs<BITS, R>; });
  }
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
  static TileFn<A> tile(int mr) {
    return tile_for_rows<MR_MAX>(mr, []<int R>() { return &wna16_tile<BITS, R>; });
  }
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

}  // namespace
}  // namespace engine::cpu
