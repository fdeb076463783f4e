// W8A8 linear layers with AMX-INT8 tiles (the avx512_bf16 path of a compiler
// with the tile intrinsics): the same product as int8_linear_impl.h, whose row
// quantisation and weight layout it shares.
#pragma once

#include <stdint.h>

#include "amx.h"
#include "int8_linear_impl.h"
#include "kernels.h"
#include "scalar.h"
#include "scratch.h"
#include "tiles.h"

namespace engine::cpu {
namespace {

// On CPUs with AMX (Sapphire Rapids and later) tdpbssd multiplies a 16 x 64
// int8 tile by a 64 x 16 one in one instruction, 16x vpdpbusd's work: the
// weight stream is the whole cost at every M. The packed layout of
// int8_linear_impl.h is already AMX's B layout: a panel's 16 steps (64 k) are
// one 16-row x 64-byte tile. Signed x signed (tdpbssd), so no offset and no comp. Compiled into the
// avx512_bf16 path with a target attribute and used only when the caller has
// checked the CPU (engine.platforms.cpu_features) and the kernel granted the
// tile state (amx_permitted).
#if defined(__AVX512VNNI__) && defined(ENGINE_HAS_AMX)
#define ENGINE_HAS_AMX_INT8 1

// Tiles: 0-3 the int32 sums of four panels (mr x 16); 4 the activations (mr x
// 64 bytes); 5 a panel's 16 steps; 6, 7 the same for the last, short group of
// `tail` steps (tail > 0). Four panels a block: the activations are read once
// per 64 columns.
constexpr int kAmxPanels = 4;

__attribute__((target("amx-tile,amx-int8"))) inline void amx_configure(int mr, int64_t tail) {
  AmxConfig c{};
  c.palette = 1;
  for (int t = 0; t < 5; ++t) c.rows[t] = static_cast<uint8_t>(mr), c.colsb[t] = 64;
  c.rows[5] = 16, c.colsb[5] = 64;
  if (tail > 0) {
    c.rows[6] = static_cast<uint8_t>(mr), c.colsb[6] = static_cast<uint16_t>(4 * tail);
    c.rows[7] = static_cast<uint8_t>(tail), c.colsb[7] = 64;
  }
  _tile_loadconfig(&c);
}

// One group of k steps: activation tile A (from qs) by the np panels' tiles B
// (from p, a panel every panel_size bytes), added to the sums in tiles 0-3. A
// macro because GCC's tile intrinsics stringify their tile numbers: neither a
// function nor a template parameter can name a tile, only a literal can.
#define ENGINE_AMX_I8_GROUP(A, B, qs, p)                 \
  do {                                                   \
    _tile_loadd(A, qs, ldq);                             \
    _tile_loadd(B, p, 64);                               \
    _tile_dpbssd(0, A, B);                               \
    if (np > 1) {                                        \
      _tile_loadd(B, (p) + panel_size, 64);              \
      _tile_dpbssd(1, A, B);                             \
    }                                                    \
    if (np > 2) {                                        \
      _tile_loadd(B, (p) + 2 * panel_size, 64);          \
      _tile_dpbssd(2, A, B);                             \
    }                                                    \
    if (np > 3) {                                        \
      _tile_loadd(B, (p) + 3 * panel_size, 64);          \
      _tile_dpbssd(3, A, B);                             \
    }                                                    \
  } while (0)

// c[r, 16 i + j] = sum_k q[r, k] W[n, k] for np (1-4) panels from p0: the
// full groups on tiles 4 and 5, the short tail on 6 and 7.
__attribute__((target("amx-tile,amx-int8"))) inline void amx_block(
    const int8_t* q, int64_t ldq, const int8_t* p0, int64_t panel_size, int np, int64_t full,
    int64_t tail, int32_t* c) {
  constexpr int64_t CHUNK = 16 * 4 * kPanel;  // bytes of a panel's 16 steps
  constexpr int64_t LDC = kAmxPanels * kPanel * 4;
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  for (int64_t s = 0; s < full; ++s) ENGINE_AMX_I8_GROUP(4, 5, q + s * 64, p0 + s * CHUNK);
  if (tail > 0) ENGINE_AMX_I8_GROUP(6, 7, q + full * 64, p0 + full * CHUNK);
  _tile_stored(0, c, LDC);
  _tile_stored(1, c + kPanel, LDC);
  _tile_stored(2, c + 2 * kPanel, LDC);
  _tile_stored(3, c + 3 * kPanel, LDC);
}
#undef ENGINE_AMX_I8_GROUP

// False (nothing written) when its scratch cannot be allocated.
template <typename T>
__attribute__((target("amx-tile,amx-int8"))) bool int8_linear_amx_t(
    T* out, const T* x, const float* static_scale, const int8_t* packed, const float* w_scale,
    int64_t M, int64_t N, int64_t K, int64_t ldx, int64_t ldo) {
  constexpr int NP = kAmxPanels;
  const int64_t ldq = (K + 63) / 64 * 64;  // rows zero-padded to whole 64-byte tiles
  int8_t* q = static_cast<int8_t*>(scratch(0, M * ldq));
  float* a_scale = static_cast<float*>(scratch(1, sizeof(float) * M));
  if (q == nullptr || a_scale == nullptr) return false;
  quant_rows(q, a_scale, x, M, K, ldx, static_scale, ldq);
  const int64_t steps = (K + 3) / 4, full = steps / 16, tail = steps % 16;
  const int64_t panel_size = steps * 4 * kPanel;
  const int64_t panels = (N + kPanel - 1) / kPanel, groups = (panels + NP - 1) / NP;
  const int64_t tiles = (M + 15) / 16;
#pragma omp parallel if (M * N * K >= (int64_t{1} << 18))
  {
    int configured = 0;  // the mr this thread's tiles are set up for
    alignas(64) int32_t c[16 * NP * kPanel];
#pragma omp for schedule(static)
    for (int64_t g = 0; g < groups; ++g) {
      const int np = static_cast<int>(panels - NP * g < NP ? panels - NP * g : NP);
      const int64_t n0 = NP * g * kPanel, cols = N - n0 < np * kPanel ? N - n0 : np * kPanel;
      for (int64_t t = 0; t < tiles; ++t) {
        const int64_t m0 = 16 * t;
        const int mr = tile_rows(M, m0, 16);
        if (mr != configured) amx_configure(mr, tail), configured = mr;
        amx_block(q + m0 * ldq, ldq, packed + NP * g * panel_size, panel_size, np, full, tail, c);
        store_int8_tile(out + m0 * ldo, ldo, c, NP * kPanel, mr, a_scale + m0, w_scale, n0, cols);
      }
    }
    if (configured) _tile_release();
  }
  return true;
}
#endif  // AMX-INT8

}  // namespace
}  // namespace engine::cpu
