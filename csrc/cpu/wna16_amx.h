// The wna16 linear with AMX bfloat16 tiles (wna16.h's linear_amx): the
// avx512_bf16 path of a compiler with AMX only.
#pragma once

#include <stdint.h>
#include <string.h>

#include "amx.h"
#include "scalar.h"
#include "scratch.h"
#include "tiles.h"
#include "wna16_vec.h"

namespace engine::cpu {
namespace {

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
          for (; j + NR <= cols; j += NR) store_w(o + j, vload(cr + j));
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
}  // namespace engine::cpu
