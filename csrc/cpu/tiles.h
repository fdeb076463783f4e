// The loops every panel GEMM (linear_impl.h, int8_linear_impl.h and its AMX
// variant, wna16_impl.cpp) runs around its microkernel: rows of x laid out
// per tile, and a tile's results stored to out. Written once against the
// per-ISA vectors of cpu_types_x86.h.
#pragma once

#include <stdint.h>

#include "cpu_types.h"
#include "scalar.h"

namespace engine::cpu {
namespace {

// Rows of M in the tile of up to mr_max rows that starts at row m0.
inline int tile_rows(int64_t M, int64_t m0, int64_t mr_max) {
  return static_cast<int>(M - m0 < mr_max ? M - m0 : mr_max);
}

// Rows of x step-major per tile of MR_MAX rows (the last tile has M % MR_MAX):
// a[m0 * steps + s * mr + r] = load(m0 + r, s), what the microkernel
// broadcasts a step. An orphaned `omp for`: inside a parallel region the
// tiles are shared among its threads.
template <int64_t MR_MAX, typename A, typename Load>
inline void pack_rows(A* a, int64_t M, int64_t steps, Load load) {
  const int64_t tiles = (M + MR_MAX - 1) / MR_MAX;
#pragma omp for schedule(static)
  for (int64_t t = 0; t < tiles; ++t) {
    const int64_t m0 = t * MR_MAX;
    const int mr = tile_rows(M, m0, MR_MAX);
    A* at = a + m0 * steps;
    for (int r = 0; r < mr; ++r)
      for (int64_t s = 0; s < steps; ++s) at[s * mr + r] = load(m0 + r, s);
  }
}

// The microkernel instance for a tile of mr rows, from those compiled per
// row count: make.template operator()<R>() for R = mr up to 15 (capped at
// MR_MAX), MR_MAX above. A switch, not std::integer_sequence: kernels include
// only C headers (kernels.h). make: a template lambda, []<int R>() { return
// &tile<..., R>; }.
template <int MR_MAX, typename Make>
inline auto tile_for_rows(int mr, Make make) {
  switch (mr) {
#define ENGINE_TILE_CASE(n) \
  case n:                   \
    return make.template operator()<(n <= MR_MAX ? n : MR_MAX)>();
    ENGINE_TILE_CASE(1) ENGINE_TILE_CASE(2) ENGINE_TILE_CASE(3) ENGINE_TILE_CASE(4)
    ENGINE_TILE_CASE(5) ENGINE_TILE_CASE(6) ENGINE_TILE_CASE(7) ENGINE_TILE_CASE(8)
    ENGINE_TILE_CASE(9) ENGINE_TILE_CASE(10) ENGINE_TILE_CASE(11) ENGINE_TILE_CASE(12)
    ENGINE_TILE_CASE(13) ENGINE_TILE_CASE(14) ENGINE_TILE_CASE(15)
#undef ENGINE_TILE_CASE
    default:
      return make.template operator()<MR_MAX>();
  }
}

#ifdef ENGINE_VEC_WIDTH
// The tile's results (floats, tile_cols per row) to out, columns [n0, n0 + cols).
template <typename T>
inline void store_tile(T* out, int64_t ldo, const float* tile, int64_t tile_cols, int rows,
                       int64_t n0, int64_t cols) {
  for (int r = 0; r < rows; ++r) {
    T* o = out + r * ldo + n0;
    const float* t = tile + r * tile_cols;
    int64_t c = 0;
    for (; c + W <= cols; c += W) vstore(o + c, vload(t + c));
    for (; c < cols; ++c) o[c] = Elem<T>::store(t[c]);
  }
}
#endif

// An int8 tile's sums (int32, ld a row) to out, columns [n0, n0 + cols):
// float(sum) * a_scale[r] * w_scale[c], two separate roundings as
// engine.reference.int8_linear does (no add follows, so nothing can contract).
template <typename T>
inline void store_int8_tile(T* out, int64_t ldo, const int32_t* tile, int64_t ld, int rows,
                            const float* a_scale, const float* w_scale, int64_t n0,
                            int64_t cols) {
  for (int r = 0; r < rows; ++r) {
    T* o = out + r * ldo + n0;
    const int32_t* tr = tile + r * ld;
    const float as = a_scale[r];
#pragma omp simd
    for (int64_t c = 0; c < cols; ++c) {
      const float v = static_cast<float>(tr[c]) * as;
      o[c] = Elem<T>::store(v * w_scale[n0 + c]);
    }
  }
}

}  // namespace
}  // namespace engine::cpu
