// 4-bit weights, bfloat16 x, fewer rows than PAIRS_MIN_M, on AVX512_BF16: the
// one-request decode's kernel. wna16_tile makes each float weight with a
// mask-or, a subtraction and an FMA (3 operations for 16 weights); here 32
// weights take a shift, a mask-or and one vdpbf16ps:
//
// a 32-bit lane holds 8 nibbles of one column, k = 8s .. 8s + 7 at bits 4l;
// (lane >> 4i) & 0x000F000F puts nibble i in the low half and nibble i + 4 in
// the high half, and or-ing 0x4300 into each half makes them the bfloat16
// values 128 + q, exactly (bfloat16 counts in ones from 128 to 256). vdpbf16ps
// multiplies them by x's pairs (k = 8s + i, 8s + i + 4) and adds both to the
// float sums: sum x * (128 + q). The zero point and the 128 come off once a
// group: sum x * (q - zero) = that - (128 + zero) * sum x, sum x over the
// group's k staged beside its pairs. The products are exact; the sums carry
// about 5 bits less than wna16_tile's relative to the answer (their terms are
// ~30x larger than x * (q - zero)), far below the bfloat16 answer's rounding.
#pragma once

#ifdef __AVX512BF16__
#include <stdint.h>
#include <string.h>

#include "scalar.h"
#include "scratch.h"
#include "tiles.h"
#include "wna16_vec.h"

namespace engine::cpu {
namespace {

// a: per group, [gsteps * 4][MR] pairs of bfloat16 x, then [MR] floats: sum x.
template <int MR>
void wna16_tile_q4_bias(const uint32_t* a, const uint32_t* panel, const float* scales,
                        const uint8_t* zeros, int64_t groups, int64_t gsteps, float* out) {
  constexpr int64_t ahead = 4096 / (NR * 4);  // steps: 4 KiB
  const VecI low = iset1(0x000F000F), bias = iset1(0x43004300);
  const int64_t gstride = (gsteps * 4 + 1) * MR;
  for (int64_t g = 0; g < groups; ++g) {
    VecF acc[4][MR];  // a set per nibble pair: four independent dot chains
    for (int i = 0; i < 4; ++i)
      for (int r = 0; r < MR; ++r) acc[i][r] = vset1(0.f);
    const uint32_t* p = panel + g * gsteps * NR;
    const uint32_t* ag = a + g * gstride;
    for (int64_t s = 0; s < gsteps; ++s) {
      _mm_prefetch(reinterpret_cast<const char*>(p + (s + ahead) * NR), _MM_HINT_T0);
      const VecI v = iload(p + s * NR);
#pragma GCC unroll 4
      for (int i = 0; i < 4; ++i) {
        const VecI q = i ? _mm512_srli_epi32(v, 4 * i) : v;
        const __m512bh w = (__m512bh)_mm512_ternarylogic_epi32(q, low, bias, 0xEA);
        const uint32_t* xs = ag + (s * 4 + i) * MR;
        for (int r = 0; r < MR; ++r)
          acc[i][r] = _mm512_dpbf16_ps(acc[i][r], w,
                                       (__m512bh)_mm512_set1_epi32(static_cast<int>(xs[r])));
      }
    }
    const VecF sc = vload(scales + g * NR);
    const VecF zb = vadd(icvt(izeros(zeros + g * NR)), vset1(128.f));
    for (int r = 0; r < MR; ++r) {
      float sum_x;
      memcpy(&sum_x, ag + gsteps * 4 * MR + r, 4);
      VecF t = vadd(vadd(acc[0][r], acc[1][r]), vadd(acc[2][r], acc[3][r]));
      t = _mm512_fnmadd_ps(zb, vset1(sum_x), t);
      vstore(out + r * NR, vfma(t, sc, vload(out + r * NR)));
    }
  }
}

// x as wna16_tile_q4_bias reads it, rows interleaved (a[e * M + m]): group by
// group, each step's pairs (k = 8s + i, 8s + i + 4; zero past K), then the
// group's sum of x. Serial: a few rows of K.
inline void stage_q4_bias(uint32_t* a, const uint16_t* x, int64_t M, int64_t K, int64_t ldx,
                          int64_t groups, int64_t gsteps) {
  for (int64_t m = 0; m < M; ++m) {
    const uint16_t* xr = x + m * ldx;
    uint32_t* am = a + m;
    for (int64_t g = 0; g < groups; ++g) {
      float sum = 0.f;
      for (int64_t s = 0; s < gsteps; ++s) {
        const int64_t k0 = (g * gsteps + s) * 8;
        uint16_t v[8];
        for (int j = 0; j < 8; ++j) v[j] = k0 + j < K ? xr[k0 + j] : 0;
        for (int j = 0; j < 8; ++j) sum += bf16_to_float(v[j]);
        for (int i = 0; i < 4; ++i, am += M) *am = v[i] | (static_cast<uint32_t>(v[i + 4]) << 16);
      }
      memcpy(am, &sum, 4);
      am += M;
    }
  }
}

int64_t linear_q4_bias(uint16_t* out, const uint16_t* x, const uint32_t* packed,
                       const float* scales, const uint8_t* zeros, int64_t M, int64_t N,
                       int64_t K, int64_t G, int64_t ldx, int64_t ldo) {
  const int64_t groups = (K + G - 1) / G, gsteps = G / 8, steps = groups * gsteps;
  const int64_t Ks = groups * (gsteps * 4 + 1);  // staged elements a row
  const int64_t panels = (N + NR - 1) / NR;
  Allocs mem;
  uint32_t* a = mem.get<uint32_t>(M * Ks);
  if (mem.failed()) return mem.failed();
  stage_q4_bias(a, x, M, K, ldx, groups, gsteps);
  const bool threads = M * N * K >= (int64_t{1} << 18);
  const auto tile_fn = tile_for_rows<MR_MAX>(
      static_cast<int>(M), []<int R>() { return &wna16_tile_q4_bias<R>; });
#pragma omp parallel if (threads)
  {
    alignas(64) float tile[MR_MAX * NR];
#pragma omp for schedule(static)
    for (int64_t p = 0; p < panels; ++p) {
      const int64_t n0 = p * NR, cols = N - n0 < NR ? N - n0 : NR;
      memset(tile, 0, sizeof(tile));
      tile_fn(a, packed + p * steps * NR, scales + p * groups * NR, zeros + p * groups * NR,
              groups, gsteps, tile);
      store_tile(out, ldo, tile, NR, static_cast<int>(M), n0, cols);
    }
  }
  return 0;
}

}  // namespace
}  // namespace engine::cpu
#endif
